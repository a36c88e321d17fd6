"""SUBSCRIBE / UNSUBSCRIBE: wildcards, invalid filters, overlaps, $-topics, UNSUBACK."""

from __future__ import annotations

import pytest

from .helpers import (
    PUBLISH,
    UNSUBACK,
    V5,
    VERSIONS,
    unique_id,
    unsubscribe_packet,
)

FAILURE_V3 = 0x80
TOPIC_FILTER_INVALID = 0x8F


@pytest.mark.parametrize("version", VERSIONS)
def test_single_and_multi_level_wildcards(broker, paho_client, version):
    sub = paho_client(broker, version)
    assert sub.subscribe([("sport/+/player1", 1), ("finance/#", 1), ("end", 1)]) == [1, 1, 1]
    pub = paho_client(broker, version)
    topics = [
        "sport/tennis/player1",  # yes
        "sport/tennis/player2",
        "sport/player1",
        "sport//player1",  # yes: + matches an empty level
        "sport/tennis/player1/ranking",
        "finance",  # yes: # also matches the parent level [MQTT-4.7.1-2]
        "finance/stock/ibm",  # yes
        "financeX/a",
        "Finance/a",  # topics are case sensitive
    ]
    for topic in topics:
        pub.publish(topic, topic.encode(), qos=1)
    pub.publish("end", b"end", qos=1)
    got = [m.topic for m in sub.collect_until(b"end")]
    assert got == ["sport/tennis/player1", "sport//player1", "finance", "finance/stock/ibm", "end"]


@pytest.mark.parametrize("version", VERSIONS)
def test_suback_grants_the_requested_qos(broker, raw_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    assert raw.subscribe(("q/0", 0), ("q/1", 1), ("q/2", 2)) == [0, 1, 2]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bad", ["a/#/b", "a+", "#x", "a/b#", "+a/b", "a/+b"])
def test_invalid_filter_gets_suback_failure(broker, raw_client, version, bad):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    failure = TOPIC_FILTER_INVALID if version == V5 else FAILURE_V3
    assert raw.subscribe(("valid/+/#", 1), (bad, 1)) == [1, failure]
    assert raw.is_open()
    raw.publish("valid/x/y", b"ok", qos=1)
    assert raw.expect(PUBLISH).payload == b"ok"


@pytest.mark.parametrize("version", VERSIONS)
def test_overlapping_subscriptions_deliver_one_copy_at_max_qos(broker, paho_client, version):
    # [MQTT-3.3.5-1] the maximum QoS of all matching subscriptions; Nautilus (like
    # VerneMQ) sends a single copy (3.1.1 would allow one per subscription).
    sub = paho_client(broker, version)
    if version == V5:
        sub.subscribe("a/+", 0, sub_id=1)
        sub.subscribe("a/#", 1, sub_id=2)
    else:
        sub.subscribe([("a/+", 0), ("a/#", 1)])
    pub = paho_client(broker, version)
    pub.publish("a/b", b"one", qos=1)
    pub.publish("a/b", b"sentinel", qos=1)
    got = sub.collect_until(b"sentinel")
    assert [(m.payload, m.qos) for m in got] == [(b"one", 1), (b"sentinel", 1)]
    if version == V5:
        # [MQTT-3.3.4-4]: a single copy carries every matching subscription identifier.
        assert sorted(got[0].subscription_ids) == [1, 2]


def test_v5_subscription_identifier_only_for_matching_subscription(broker, paho_client):
    sub = paho_client(broker, V5)
    sub.subscribe("ids/a", 1, sub_id=7)
    sub.subscribe("ids/b", 1)  # no identifier
    pub = paho_client(broker, V5)
    pub.publish("ids/a", b"a", qos=1)
    pub.publish("ids/b", b"b", qos=1)
    a, b = sub.expect_message(), sub.expect_message()
    assert (a.payload, a.subscription_ids) == (b"a", [7])
    assert (b.payload, b.subscription_ids) == (b"b", [])


@pytest.mark.parametrize("version", VERSIONS)
def test_resubscribe_replaces_the_subscription(broker, paho_client, version):
    # [MQTT-3.8.4-3]: same filter again replaces it (new QoS), no duplicate delivery.
    sub = paho_client(broker, version)
    assert sub.subscribe("re/t", 0) == [0]
    assert sub.subscribe("re/t", 2) == [2]
    pub = paho_client(broker, version)
    pub.publish("re/t", b"x", qos=2)
    pub.publish("re/t", b"sentinel", qos=2)
    got = sub.collect_until(b"sentinel")
    assert [(m.payload, m.qos) for m in got] == [(b"x", 2), (b"sentinel", 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_dollar_topics_not_matched_by_leading_wildcards(broker, paho_client, version):
    # [MQTT-4.7.2-1]: filters starting with a wildcard do not match topics starting with $.
    wild = paho_client(broker, version)
    wild.subscribe([("#", 1), ("+/x", 1)])
    dollar = paho_client(broker, version)
    assert dollar.subscribe("$foo/#", 1) == [1]
    pub = paho_client(broker, version)
    pub.publish("$foo/x", b"dollar", qos=1)
    msg = dollar.expect_message()
    assert (msg.topic, msg.payload) == ("$foo/x", b"dollar")
    pub.publish("x/x", b"plain", qos=1)
    got = wild.collect_until(b"plain")
    # Nothing starting with "$" (neither our $foo/x nor any $SYS the broker publishes).
    assert [m for m in got if m.topic.startswith("$")] == []
    assert [m.topic for m in got if m.payload == b"plain"] == ["x/x"]


@pytest.mark.parametrize("version", VERSIONS)
def test_unsubscribe_stops_delivery(broker, paho_client, version):
    sub = paho_client(broker, version)
    sub.subscribe([("u/t", 1), ("u/sentinel", 1)])
    pub = paho_client(broker, version)
    pub.publish("u/t", b"before", qos=1)
    assert sub.expect_message().payload == b"before"
    codes = sub.unsubscribe("u/t")
    if version == V5:
        assert codes == [0]
    pub.publish("u/t", b"after", qos=1)
    pub.publish("u/sentinel", b"sentinel", qos=1)
    assert sub.expect_message().payload == b"sentinel"


@pytest.mark.parametrize("version", VERSIONS)
def test_unsuback_echoes_the_packet_id(broker, raw_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    raw.subscribe(("un/a", 0), ("un/b", 0))
    raw.send(unsubscribe_packet(0x1234, ["un/a", "un/b"], version=version))
    ack = raw.expect(UNSUBACK)
    assert ack.packet_id == 0x1234
    if version == V5:
        assert ack.reason_codes == [0, 0]
    else:
        assert ack.body == b"\x12\x34"


def test_unsubscribe_of_unknown_filter_still_gets_unsuback(broker, raw_client):
    # [MQTT-3.10.4-5]: UNSUBACK even if no topic filter matched.
    raw = raw_client(broker)
    raw.connect(unique_id())
    raw.send(unsubscribe_packet(9, ["never/subscribed"]))
    assert raw.expect(UNSUBACK).packet_id == 9


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_to_single_level_root_wildcard(broker, paho_client, version):
    sub = paho_client(broker, version)
    sub.subscribe("+", 1)
    pub = paho_client(broker, version)
    pub.publish("/finance", b"two levels", qos=1)  # "+" does not match "/finance"
    pub.publish("top", b"top", qos=1)
    assert [m.topic for m in sub.collect_until(b"top")] == ["top"]
