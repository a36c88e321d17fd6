"""Every MQTT 5 feature of docs/mqtt5.md seen through paho-mqtt's own MQTT 5 client.

Most features are also tested byte by byte with `RawClient` elsewhere; here a real client
library sets the properties and reads the broker's answers, so a test fails if the broker
and a client that follows the standard stop understanding each other.

Not here, because paho-mqtt 2.2 cannot play its part:
- Enhanced authentication (AUTH packets, re-authentication): paho has no AUTH support;
  covered by the raw-socket tests in tests/broker/test_enhanced_auth.py.
- PUBREC reason codes (e.g. 0x99 on a QoS 2 PUBLISH): paho ignores them and sends PUBREL
  anyway; covered in tests/broker/test_mqtt5.py.
- The DISCONNECT 0x82 the broker sends when a Session Expiry Interval of 0 at CONNECT is
  changed at DISCONNECT: paho closes its socket right after its DISCONNECT, so it never
  reads the answer (the test checks the broker's counter and the session instead).
"""

from __future__ import annotations

import queue
import socket
import time
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from .helpers import QUIET, TIMEOUT, V5, WillSpec, unique_id

DENY_PLUGIN = {"deny": {"enabled": True, "module": "tests.broker.test_mqtt5:DenyTopic"}}

SESSION_TAKEN_OVER = 0x8E
NOT_AUTHORIZED = 0x87
PACKET_TOO_LARGE = 0x95
TOPIC_ALIAS_INVALID = 0x94
PAYLOAD_FORMAT_INVALID = 0x99
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D


def props(packet_type: int, **values: Any) -> Properties:
    """paho Properties for `packet_type` (PacketTypes.PUBLISH, ...) with `values` set."""
    out = Properties(packet_type)
    for name, value in values.items():
        setattr(out, name, value)
    return out


def publish_props(**values: Any) -> Properties:
    return props(PacketTypes.PUBLISH, **values)


def prop(properties: Any, name: str) -> Any:
    """One property of a received packet, None when absent."""
    return getattr(properties, name, None)


def metric(server, name: str) -> int:
    return server.call(server.broker.metrics.snapshot)[name]


def wait_connection_gone(server, client_id: str) -> None:
    """Wait until the broker has released the connection of `client_id` (session offline
    or ended, will scheduled or sent)."""
    server.wait_for(lambda: all(c.client.client_id != client_id for c in server.broker.connections))


def go_offline(server, client) -> None:
    """paho DISCONNECT, then wait until the broker has processed it: paho closes its socket
    right after sending, before the broker has read the packet."""
    client_id = client.client_id
    client.disconnect()
    wait_connection_gone(server, client_id)


def capture_acks(client) -> queue.Queue:
    """(mid, reason code, properties) of every PUBACK / PUBCOMP paho receives."""
    acks: queue.Queue = queue.Queue()

    def on_publish(_client, _userdata, mid, reason_code, properties):
        acks.put((mid, reason_code.value, properties))

    client.client.on_publish = on_publish
    return acks


def publish_acked(client, acks: queue.Queue, topic: str, payload: bytes, **properties: Any):
    """QoS 1 publish with PUBLISH properties; returns (reason code, properties) of its PUBACK."""
    info = client.client.publish(topic, payload, 1, properties=publish_props(**properties))
    mid, code, ack_props = acks.get(timeout=TIMEOUT)
    assert mid == info.mid
    return code, ack_props


# --------------------------------------------------------------------------- topic aliases


def test_client_topic_alias_is_resolved(broker, paho_client):
    # [3.3.2.3.4]: a PUBLISH with a topic and an alias sets it; an empty topic uses it.
    sub = paho_client(broker, V5)
    sub.subscribe("alias/#", 1)
    pub = paho_client(broker, V5, connect=False)
    assert pub.connect().properties.TopicAliasMaximum == 64  # topic_alias_max_broker
    pub.publish("alias/t", b"one", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"two", qos=1, properties=publish_props(TopicAlias=1))
    got = [sub.expect_message() for _ in range(2)]
    assert [(m.topic, m.payload) for m in got] == [("alias/t", b"one"), ("alias/t", b"two")]


def test_topic_alias_maximum_is_configurable_and_enforced(start_broker, paho_client):
    server = start_broker(broker={"topic_alias_max_broker": 2})
    pub = paho_client(server, V5, connect=False)
    assert pub.connect().properties.TopicAliasMaximum == 2
    pub.client.publish("alias/t", b"x", 0, properties=publish_props(TopicAlias=3))
    assert pub.expect_disconnected() == TOPIC_ALIAS_INVALID


def test_broker_assigns_topic_aliases_to_a_client_that_allows_them(broker, paho_client):
    sub = paho_client(broker, V5, properties={"TopicAliasMaximum": 5})
    sub.subscribe("out/#", 1)
    plain = paho_client(broker, V5)  # announces no Topic Alias Maximum: 0
    plain.subscribe("out/#", 1)
    pub = paho_client(broker, V5)
    pub.publish("out/a", b"1", qos=1)
    pub.publish("out/a", b"2", qos=1)
    first, second = sub.expect_message(), sub.expect_message()
    assert (first.topic, first.payload, prop(first.properties, "TopicAlias")) == ("out/a", b"1", 1)
    # The second PUBLISH carries only the alias. paho 2.2 does not resolve inbound aliases,
    # so the message it hands over has the empty topic of the packet.
    assert (second.topic, second.payload, prop(second.properties, "TopicAlias")) == ("", b"2", 1)
    got = [plain.expect_message() for _ in range(2)]
    assert [(m.topic, prop(m.properties, "TopicAlias")) for m in got] == [("out/a", None)] * 2


# --------------------------------------------------------------------------- message expiry


def test_message_expiry_interval(broker, paho_client):
    # [MQTT-3.3.2-5]: an expired message is not delivered; [MQTT-3.3.2-6]: the forwarded
    # interval is the received one minus the time the message waited.
    client_id = unique_id("mexp")
    sub = paho_client(broker, V5, client_id, clean=False, session_expiry=300)
    sub.subscribe("mexp/t", 1)
    pub = paho_client(broker, V5)
    pub.publish("mexp/t", b"live", qos=1, properties=publish_props(MessageExpiryInterval=60))
    live = sub.expect_message()
    assert (live.payload, prop(live.properties, "MessageExpiryInterval")) == (b"live", 60)
    go_offline(broker, sub)

    pub.publish("mexp/t", b"short", qos=1, properties=publish_props(MessageExpiryInterval=1))
    pub.publish("mexp/t", b"long", qos=1, properties=publish_props(MessageExpiryInterval=60))
    broker.advance(1.5)  # "short" expires in the offline queue, "long" has 58 s left
    expired_before = metric(broker, "queue_message_expired")
    again = paho_client(broker, V5, client_id, connect=False)
    assert again.connect(clean=False, session_expiry=300).session_present is True
    msg = again.expect_message()
    assert msg.payload == b"long"  # "short" was ahead of it in the queue
    assert 1 <= prop(msg.properties, "MessageExpiryInterval") <= 59
    assert metric(broker, "queue_message_expired") == expired_before + 1


# --------------------------------------------------------------------------- payload format


def test_payload_format_indicator_and_content_type_pass_through(broker, paho_client):
    sub = paho_client(broker, V5)
    sub.subscribe("pfi/#", 1)
    pub = paho_client(broker, V5)
    text = publish_props(PayloadFormatIndicator=1, ContentType="text/plain")
    pub.publish("pfi/text", "grüße".encode(), qos=1, properties=text)
    binary = publish_props(ContentType="application/x")
    pub.publish("pfi/bin", b"\x00\xff", qos=1, properties=binary)
    text_msg, bin_msg = sub.expect_message(), sub.expect_message()
    assert text_msg.payload == "grüße".encode()
    assert prop(text_msg.properties, "PayloadFormatIndicator") == 1
    assert prop(text_msg.properties, "ContentType") == "text/plain"
    assert bin_msg.payload == b"\x00\xff"
    assert prop(bin_msg.properties, "PayloadFormatIndicator") is None
    assert prop(bin_msg.properties, "ContentType") == "application/x"


def test_payload_flagged_utf8_but_not_gets_puback_0x99(broker, paho_client):
    sub = paho_client(broker, V5)
    sub.subscribe("pfi/#", 1)
    pub = paho_client(broker, V5)
    acks = capture_acks(pub)
    code, _ = publish_acked(pub, acks, "pfi/bad", b"\xff\xfe", PayloadFormatIndicator=1)
    assert code == PAYLOAD_FORMAT_INVALID
    code, _ = publish_acked(pub, acks, "pfi/ok", b"sentinel", PayloadFormatIndicator=1)
    assert code == 0
    assert sub.expect_message().payload == b"sentinel"  # the invalid one was not forwarded


# --------------------------------------------------------------------------- request / response


def test_response_topic_correlation_data_and_user_properties_pass_through(broker, paho_client):
    sub = paho_client(broker, V5)
    sub.subscribe("req/#", 1)
    pub = paho_client(broker, V5)
    user = [("b", "1"), ("a", "2"), ("b", "3"), ("b", "1")]  # order and duplicates kept
    request = publish_props(ResponseTopic="resp/me", CorrelationData=b"\x01id", UserProperty=user)
    pub.publish("req/t", b"question", qos=1, properties=request)
    msg = sub.expect_message()
    assert prop(msg.properties, "ResponseTopic") == "resp/me"
    assert prop(msg.properties, "CorrelationData") == b"\x01id"
    assert prop(msg.properties, "UserProperty") == user


def test_response_information_only_when_requested(start_broker, paho_client):
    # [3.1.2.11.7]: Response Information only to a client that asked for it.
    server = start_broker(broker={"response_information": "replies/%c/"})
    asking = paho_client(server, V5, connect=False)
    result = asking.connect(properties={"RequestResponseInformation": 1})
    assert result.properties.ResponseInformation == f"replies/{asking.client_id}/"
    quiet = paho_client(server, V5, connect=False)
    assert prop(quiet.connect().properties, "ResponseInformation") is None
    declining = paho_client(server, V5, connect=False)
    result = declining.connect(properties={"RequestResponseInformation": 0})
    assert prop(result.properties, "ResponseInformation") is None


# --------------------------------------------------------------------------- subscription options


def test_no_local(broker, paho_client):
    client = paho_client(broker, V5)
    client.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    other = paho_client(broker, V5)
    other.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    client.publish("nl/t", b"own", qos=1)
    other.publish("nl/t", b"other's", qos=1)
    assert client.expect_message().payload == b"other's"
    assert other.expect_message().payload == b"own"


def test_retain_as_published(broker, paho_client):
    keep = paho_client(broker, V5)
    keep.subscribe("rap/t", options=SubscribeOptions(qos=1, retainAsPublished=True))
    clear = paho_client(broker, V5)
    clear.subscribe("rap/t", options=SubscribeOptions(qos=1, retainAsPublished=False))
    pub = paho_client(broker, V5)
    pub.publish("rap/t", b"r", qos=1, retain=True)
    pub.publish("rap/t", b"n", qos=1)
    assert [(m.payload, m.retain) for m in (keep.expect_message(), keep.expect_message())] == [
        (b"r", True),
        (b"n", False),
    ]
    assert [(m.payload, m.retain) for m in (clear.expect_message(), clear.expect_message())] == [
        (b"r", False),
        (b"n", False),
    ]


@pytest.mark.parametrize(
    ("handling", "first", "again"),
    [(0, [b"kept"], [b"kept"]), (1, [b"kept"], []), (2, [], [])],
    ids=["send", "if-new", "never"],
)
def test_retain_handling(broker, paho_client, handling, first, again):
    # [3.8.3.1]: 0 sends retained messages at every subscribe, 1 only when the subscription
    # is new, 2 never.
    pub = paho_client(broker, V5)
    pub.publish("rh/t", b"kept", qos=1, retain=True)
    sub = paho_client(broker, V5)
    for expected in (first, again):
        sub.subscribe("rh/t", options=SubscribeOptions(qos=1, retainHandling=handling))
        pub.publish("rh/t", b"sentinel", qos=1)
        got = sub.collect_until(b"sentinel")
        assert [m.payload for m in got[:-1]] == expected
        assert all(m.retain for m in got[:-1])


def test_subscription_identifiers(broker, paho_client):
    # [MQTT-3.3.4-3]/[MQTT-3.3.4-4]: every matching subscription's identifier, none for a
    # subscription without one.
    sub = paho_client(broker, V5)
    sub.subscribe("sid/+", 1, sub_id=1)
    sub.subscribe("sid/#", 1, sub_id=200_000)  # a multi-byte variable byte integer
    sub.subscribe("plain/t", 1)
    pub = paho_client(broker, V5)
    for topic in ("sid/a", "sid/a/b", "plain/t"):
        pub.publish(topic, topic.encode(), qos=1)
    got = [sub.expect_message() for _ in range(3)]
    assert [(m.topic, sorted(m.subscription_ids)) for m in got] == [
        ("sid/a", [1, 200_000]),
        ("sid/a/b", [200_000]),
        ("plain/t", []),
    ]


# --------------------------------------------------------------------------- packet sizes


def test_messages_larger_than_the_clients_maximum_packet_size_are_dropped(broker, paho_client):
    # [MQTT-3.1.2-25]: never a packet larger than the client's Maximum Packet Size.
    small = paho_client(broker, V5, properties={"MaximumPacketSize": 200})
    small.subscribe("mps/t", 1)
    other = paho_client(broker, V5)
    other.subscribe("mps/t", 1)
    dropped_before = metric(broker, "queue_message_drop")
    pub = paho_client(broker, V5)
    pub.publish("mps/t", b"x" * 300, qos=1)
    pub.publish("mps/t", b"fits", qos=1)
    assert small.expect_message().payload == b"fits"  # the large one never came
    assert [other.expect_message().payload for _ in range(2)] == [b"x" * 300, b"fits"]
    assert metric(broker, "queue_message_drop") == dropped_before + 1


def test_max_message_size_is_announced_and_enforced(start_broker, paho_client):
    server = start_broker(broker={"max_message_size": 1024})
    sub = paho_client(server, V5)
    sub.subscribe("mms/t", 1)
    pub = paho_client(server, V5, connect=False)
    assert pub.connect().properties.MaximumPacketSize == 1024
    pub.client.publish("mms/t", b"x" * 2048, 1)  # paho does not check the limit itself
    assert pub.expect_disconnected() == PACKET_TOO_LARGE
    paho_client(server, V5).publish("mms/t", b"sentinel", qos=1)
    assert sub.expect_message().payload == b"sentinel"


def test_no_maximum_packet_size_announced_by_default(broker, paho_client):
    result = paho_client(broker, V5, connect=False).connect()
    assert prop(result.properties, "MaximumPacketSize") is None


# --------------------------------------------------------------------------- flow control


def test_receive_maximum_limits_unacknowledged_messages(broker, paho_client):
    # [MQTT-3.3.4-9]: no more unacknowledged QoS 1/2 PUBLISHes than the Receive Maximum.
    sub = paho_client(broker, V5, properties={"ReceiveMaximum": 2})
    inbox: queue.Queue = queue.Queue()
    sub.client.manual_ack_set(True)
    sub.client.on_message = lambda _client, _userdata, msg: inbox.put(msg)
    sub.subscribe("rm/t", 1)
    pub = paho_client(broker, V5)
    for payload in (b"1", b"2", b"3"):
        pub.publish("rm/t", payload, qos=1)
    first, second = inbox.get(timeout=TIMEOUT), inbox.get(timeout=TIMEOUT)
    assert [first.payload, second.payload] == [b"1", b"2"]
    with pytest.raises(queue.Empty):
        inbox.get(timeout=QUIET)  # the window is full
    sub.client.ack(first.mid, 1)
    assert inbox.get(timeout=TIMEOUT).payload == b"3"


# --------------------------------------------------------------------------- CONNACK properties


def test_server_keep_alive(start_broker, paho_client):
    # [MQTT-3.2.2-21]: the client must use the Server Keep Alive the server sends.
    server = start_broker(broker={"max_keepalive": 10})
    long_ = paho_client(server, V5, connect=False).connect(keepalive=60)
    assert long_.properties.ServerKeepAlive == 10
    short = paho_client(server, V5, connect=False).connect(keepalive=5)
    assert prop(short.properties, "ServerKeepAlive") is None


def test_assigned_client_identifier(broker, paho_client):
    # [MQTT-3.2.2-16]: an empty client id gets a server-assigned one, which is the session's.
    first = paho_client(broker, V5, "", connect=False)
    assigned = first.connect().properties.AssignedClientIdentifier
    assert assigned.startswith("auto-")
    named = paho_client(broker, V5, "", connect=False)
    assert named.connect().properties.AssignedClientIdentifier != assigned
    paho_client(broker, V5, assigned)  # takes the session over
    assert first.expect_disconnected() == SESSION_TAKEN_OVER
    given = paho_client(broker, V5, connect=False)
    assert prop(given.connect().properties, "AssignedClientIdentifier") is None


@pytest.mark.parametrize("problem_info", [None, 1, 0])
def test_reason_string_on_refused_publish(start_broker, paho_client, problem_info):
    # [MQTT-3.1.2-29]: with Request Problem Information 0, no Reason String on a PUBACK.
    server = start_broker(plugins=DENY_PLUGIN)
    request = {} if problem_info is None else {"RequestProblemInformation": problem_info}
    pub = paho_client(server, V5, properties=request)
    acks = capture_acks(pub)
    code, ack_props = publish_acked(pub, acks, "deny/x", b"no")
    assert code == NOT_AUTHORIZED
    expected = None if problem_info == 0 else "denied_by_test"
    assert prop(ack_props, "ReasonString") == expected


@pytest.mark.parametrize(("moved", "code"), [(False, USE_ANOTHER_SERVER), (True, SERVER_MOVED)])
def test_server_redirection(start_broker, paho_client, moved, code):
    # [4.11]: Use another server (0x9C) / Server moved (0x9D) with a Server Reference.
    server = start_broker(broker={"server_reference": "other:1883", "server_moved": moved})
    result = paho_client(server, V5, connect=False).connect(expect_code=None)
    assert result.reason_code == code
    assert result.properties.ServerReference == "other:1883"


# --------------------------------------------------------------------------- session expiry


@pytest.mark.parametrize(("at_disconnect", "present"), [(0, False), (600, True)])
def test_session_expiry_changed_at_disconnect(broker, paho_client, at_disconnect, present):
    # [3.14.2.2.2]: DISCONNECT may set a new Session Expiry Interval.
    client_id = unique_id("sexp")
    client = paho_client(broker, V5, client_id, clean=False, session_expiry=300)
    client.subscribe("sexp/t", 1)
    new_expiry = props(PacketTypes.DISCONNECT, SessionExpiryInterval=at_disconnect)
    client.client.disconnect(properties=new_expiry)
    client.expect_disconnected()
    wait_connection_gone(broker, client_id)
    again = paho_client(broker, V5, client_id, connect=False)
    assert again.connect(clean=False, session_expiry=300).session_present is present


def test_session_expiry_zero_at_connect_cannot_be_raised_at_disconnect(broker, paho_client):
    # [MQTT-3.14.2-2]: a protocol error; the broker answers DISCONNECT 0x82 (paho has closed
    # its socket by then) and the session ends as announced at CONNECT.
    client_id = unique_id("sexp0")
    client = paho_client(broker, V5, client_id, clean=False)  # Session Expiry 0
    client.subscribe("sexp0/t", 1)
    sent_before = metric(broker, "mqtt_disconnect_sent")
    client.client.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=300))
    broker.wait_for(lambda: broker.broker.metrics.mqtt_disconnect_sent == sent_before + 1)
    wait_connection_gone(broker, client_id)
    again = paho_client(broker, V5, client_id, connect=False)
    assert again.connect(clean=False, session_expiry=300).session_present is False


# --------------------------------------------------------------------------- will delay


def drop(server, client) -> None:
    """Lose the connection without DISCONNECT and wait until the broker has noticed."""
    client.client.socket().shutdown(socket.SHUT_RDWR)
    wait_connection_gone(server, client.client_id)


def test_will_delay_interval(broker, paho_client):
    # [MQTT-3.1.3-9]: the will waits for the Will Delay Interval.
    watcher = paho_client(broker, V5)
    watcher.subscribe("will/#", 1)
    will = WillSpec("will/delayed", b"late", qos=1, properties={"WillDelayInterval": 1})
    client = paho_client(broker, V5, clean=False, session_expiry=300, will=will)
    drop(broker, client)
    start = time.monotonic()
    watcher.expect_no_message(timeout=0.5)  # not at once
    msg = watcher.expect_message(timeout=4)
    assert (msg.topic, msg.payload) == ("will/delayed", b"late")
    assert 0.9 <= time.monotonic() - start <= 3.0


def test_will_delay_cancelled_by_reconnect(broker, paho_client):
    # [3.1.3.2.2]: a reconnect within the delay means the will is not sent.
    watcher = paho_client(broker, V5)
    watcher.subscribe("will/#", 1)
    client_id = unique_id("wd")
    will = WillSpec("will/cancelled", b"must not appear", properties={"WillDelayInterval": 1})
    client = paho_client(broker, V5, client_id, clean=False, session_expiry=300, will=will)
    drop(broker, client)
    again = paho_client(broker, V5, client_id, connect=False)
    assert again.connect(clean=False, session_expiry=300).session_present is True
    watcher.expect_no_message(timeout=1.5)  # past the 1 s delay
    again.publish("will/alive", b"sentinel", qos=1)
    assert watcher.expect_message().payload == b"sentinel"


# --------------------------------------------------------------------------- shared subscriptions


def test_shared_subscription_members(broker, paho_client):
    # [4.8.2]: each message goes to one member of the group, with its subscription id.
    members = [paho_client(broker, V5) for _ in range(2)]
    for sub_id, member in enumerate(members, 1):
        assert member.subscribe("$share/g/sh/+", 1, sub_id=sub_id) == [1]
    pub = paho_client(broker, V5)
    payloads = [b"m%d" % i for i in range(10)]
    for payload in payloads:
        pub.publish("sh/t", payload, qos=1)
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < len(payloads):
        assert time.monotonic() < deadline, f"only {len(got)} messages arrived"
        for sub_id, member in enumerate(members, 1):
            try:
                msg = member.messages.get(timeout=0.02)
            except queue.Empty:
                continue
            assert msg.subscription_ids == [sub_id]
            got.append(msg.payload)
    for member in members:
        member.expect_no_message(QUIET / 2)
    assert sorted(got) == sorted(payloads)  # each exactly once
