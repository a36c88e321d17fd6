"""Retained messages: set, replace, clear, delivery on subscribe, retain flag on the wire."""

from __future__ import annotations

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from .helpers import PUBLISH, V5, VERSIONS, unique_id


def retained_then_live(client, publisher, topic: str):
    """Messages a new subscription got: retained ones, then a live sentinel."""
    publisher.publish(topic, b"live-sentinel", qos=1)
    return client.collect_until(b"live-sentinel")


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_delivered_on_subscribe(broker, paho_client, version):
    pub = paho_client(broker, version)
    pub.publish("ret/t", b"kept", qos=1, retain=True)
    sub = paho_client(broker, version)
    sub.subscribe("ret/t", 1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("ret/t", b"kept", 1, True)
    got = retained_then_live(sub, pub, "ret/t")
    assert [(m.payload, m.retain) for m in got] == [(b"live-sentinel", False)]


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_replaced(broker, paho_client, version):
    pub = paho_client(broker, version)
    pub.publish("rep/t", b"v1", qos=1, retain=True)
    pub.publish("rep/t", b"v2", qos=1, retain=True)
    sub = paho_client(broker, version)
    sub.subscribe("rep/t", 1)
    got = retained_then_live(sub, pub, "rep/t")
    assert [(m.payload, m.retain) for m in got] == [(b"v2", True), (b"live-sentinel", False)]


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_cleared_by_empty_payload(broker, paho_client, version):
    # [MQTT-3.3.1-10]/[MQTT-3.3.1-11]: a zero-byte retained message removes the retained
    # message, and is not itself stored.
    pub = paho_client(broker, version)
    pub.publish("clr/t", b"v1", qos=1, retain=True)
    pub.publish("clr/t", b"", qos=1, retain=True)
    sub = paho_client(broker, version)
    sub.subscribe("clr/t", 1)
    got = retained_then_live(sub, pub, "clr/t")
    assert [(m.payload, m.retain) for m in got] == [(b"live-sentinel", False)]


@pytest.mark.parametrize("version", VERSIONS)
def test_live_messages_have_retain_flag_cleared(broker, paho_client, version):
    # 3.1.1 [MQTT-3.3.1-9]; 5.0 [MQTT-3.3.1-12] without Retain As Published.
    sub = paho_client(broker, version)
    sub.subscribe("live/t", 1)
    pub = paho_client(broker, version)
    pub.publish("live/t", b"x", qos=1, retain=True)
    msg = sub.expect_message()
    assert (msg.payload, msg.retain) == (b"x", False)


def test_v5_retain_as_published_keeps_the_flag(broker, paho_client):
    sub = paho_client(broker, V5)
    sub.subscribe("rap/t", options=SubscribeOptions(qos=1, retainAsPublished=True))
    pub = paho_client(broker, V5)
    pub.publish("rap/t", b"r", qos=1, retain=True)
    pub.publish("rap/t", b"n", qos=1, retain=False)
    got = [sub.expect_message() for _ in range(2)]
    assert [(m.payload, m.retain) for m in got] == [(b"r", True), (b"n", False)]


def test_v5_retain_handling_2_sends_no_retained(broker, paho_client):
    pub = paho_client(broker, V5)
    pub.publish("rh/t", b"kept", qos=1, retain=True)
    sub = paho_client(broker, V5)
    sub.subscribe("rh/t", options=SubscribeOptions(qos=1, retainHandling=2))
    got = retained_then_live(sub, pub, "rh/t")
    assert [m.payload for m in got] == [b"live-sentinel"]


def test_v5_retain_handling_1_only_for_new_subscriptions(broker, paho_client):
    pub = paho_client(broker, V5)
    pub.publish("rh1/t", b"kept", qos=1, retain=True)
    sub = paho_client(broker, V5)
    opts = SubscribeOptions(qos=1, retainHandling=1)
    sub.subscribe("rh1/t", options=opts)
    assert sub.expect_message().payload == b"kept"
    sub.subscribe("rh1/t", options=opts)  # exists already: no retained message again
    got = retained_then_live(sub, pub, "rh1/t")
    assert [m.payload for m in got] == [b"live-sentinel"]


@pytest.mark.parametrize("version", VERSIONS)
def test_wildcard_subscription_gets_every_matching_retained(broker, paho_client, version):
    pub = paho_client(broker, version)
    for topic in ("wr/a", "wr/b", "wr/c/d", "other/a"):
        pub.publish(topic, topic.encode(), qos=1, retain=True)
    sub = paho_client(broker, version)
    sub.subscribe("wr/+", 1)
    got = retained_then_live(sub, pub, "wr/end")
    assert sorted(m.topic for m in got[:-1]) == ["wr/a", "wr/b"]
    assert all(m.retain for m in got[:-1])


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_qos_is_min_of_stored_and_granted(broker, paho_client, version):
    pub = paho_client(broker, version)
    pub.publish("rq/two", b"2", qos=2, retain=True)
    pub.publish("rq/zero", b"0", qos=0, retain=True)
    pub.publish("rq/sync", b"sync", qos=1)  # the QoS 0 publish has been processed
    sub1 = paho_client(broker, version)
    sub1.subscribe("rq/two", 1)
    assert sub1.expect_message().qos == 1
    sub2 = paho_client(broker, version)
    sub2.subscribe("rq/zero", 2)
    msg = sub2.expect_message()
    assert (msg.payload, msg.qos) == (b"0", 0)


def test_retained_survives_publisher_disconnect(broker, raw_client, paho_client):
    raw = raw_client(broker)
    raw.connect(unique_id())
    raw.publish("gone/t", b"stays", qos=1, retain=True)
    raw.disconnect()
    sub = raw_client(broker)
    sub.connect(unique_id())
    sub.subscribe(("gone/#", 0))
    msg = sub.expect(PUBLISH)
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == ("gone/t", b"stays", True, 0)
