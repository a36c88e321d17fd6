"""MQTT 5 features beyond the core: payload format, packet size limits, server keep alive."""

from __future__ import annotations

import pytest

from broker.protocol import Decoder
from broker.protocol._buffer import encode_varint
from hooks import NEXT, Error, Ok

from .helpers import (
    CONNACK,
    DISCONNECT,
    PUBACK,
    PUBLISH,
    PUBREC,
    SUBACK,
    UNSUBACK,
    V5,
    V311,
    connect_packet,
    publish_packet,
    subscribe_packet,
    unique_id,
    unsubscribe_packet,
)

PAYLOAD_FORMAT_INDICATOR = 0x01
SERVER_KEEP_ALIVE = 0x13
MAXIMUM_PACKET_SIZE = 0x27
PAYLOAD_FORMAT_INVALID = 0x99
REQUEST_PROBLEM_INFORMATION = 0x17
REQUEST_RESPONSE_INFORMATION = 0x19
REASON_STRING = 0x1F
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
USER_PROPERTY = 0x26
PROTOCOL_ERROR = 0x82


def test_payload_flagged_utf8_but_not_is_refused_with_0x99(broker, raw_client, paho_client):
    # [MQTT-3.3.2-4]: the receiver may check a payload flagged as UTF-8; we answer 0x99.
    sub = paho_client(broker, V5)
    sub.subscribe("pfi/#", 1)
    raw = raw_client(broker, V5)
    raw.connect(unique_id())
    utf8 = {PAYLOAD_FORMAT_INDICATOR: 1}
    raw.send(
        publish_packet("pfi/bad", b"\xff\xfe", qos=1, packet_id=1, version=V5, properties=utf8)
    )
    assert raw.expect(PUBACK).reason_code == PAYLOAD_FORMAT_INVALID
    raw.send(publish_packet("pfi/bad", b"\xc3", qos=2, packet_id=2, version=V5, properties=utf8))
    assert raw.expect(PUBREC).reason_code == PAYLOAD_FORMAT_INVALID
    raw.send(
        publish_packet("pfi/ok", "grüße".encode(), qos=1, packet_id=3, version=V5, properties=utf8)
    )
    assert raw.expect(PUBACK).reason_code in (0x00, 0x10)
    message = sub.expect_message()
    assert (message.topic, message.payload) == ("pfi/ok", "grüße".encode())


def test_messages_larger_than_the_clients_maximum_packet_size_are_dropped(
    broker, raw_client, paho_client
):
    # [MQTT-3.1.2-25]: the server must not send a packet larger than the client's maximum;
    # the message is dropped for that client only.
    small = raw_client(broker, V5)
    small.connect(unique_id("small"), properties={MAXIMUM_PACKET_SIZE: 64})
    small.subscribe(("size/t", 0))
    other = paho_client(broker, V5)
    other.subscribe("size/t", 0)
    pub = paho_client(broker, V5)
    pub.publish("size/t", b"x" * 200, qos=1)
    pub.publish("size/t", b"fits", qos=1)
    assert other.expect_message().payload == b"x" * 200
    assert other.expect_message().payload == b"fits"
    assert small.expect(PUBLISH).payload == b"fits"  # the large one never came
    metrics = broker.call(broker.broker.metrics.snapshot)
    assert metrics["queue_message_drop"] == 1


def test_max_keepalive_is_announced_as_server_keep_alive(start_broker, raw_client):
    # [MQTT-3.2.2-21]: the client must use the Server Keep Alive the server sends.
    server = start_broker(broker={"max_keepalive": 5})
    for asked, told in ((0, 5), (60, 5), (3, None)):
        raw = raw_client(server, V5)
        connack = raw.connect(unique_id("ka"), keepalive=asked)
        assert connack.type == CONNACK
        assert connack.properties.get(SERVER_KEEP_ALIVE) == told
        raw.close()


def test_client_topic_aliases_are_resolved(broker, raw_client, paho_client):
    # [3.3.2.3.4]: a PUBLISH with a topic and an alias sets it; an empty topic uses it.
    sub = paho_client(broker, V5)
    sub.subscribe("alias/#", 0)
    raw = raw_client(broker, V5)
    connack = raw.connect(unique_id())
    assert connack.properties[TOPIC_ALIAS_MAXIMUM] == 64
    raw.send(publish_packet("alias/t", b"one", version=V5, properties={TOPIC_ALIAS: 7}))
    raw.send(publish_packet("", b"two", version=V5, properties={TOPIC_ALIAS: 7}))
    got = [sub.expect_message() for _ in range(2)]
    assert [(m.topic, m.payload) for m in got] == [("alias/t", b"one"), ("alias/t", b"two")]


def test_an_alias_never_set_is_a_protocol_error(broker, raw_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id())
    raw.send(publish_packet("", b"?", version=V5, properties={TOPIC_ALIAS: 3}))
    got = raw.expect_closed()
    assert [(p.type, p.reason_code) for p in got] == [(DISCONNECT, PROTOCOL_ERROR)]


def test_broker_assigns_aliases_up_to_the_clients_maximum(broker, raw_client, paho_client):
    sub = raw_client(broker, V5)
    sub.connect(unique_id(), properties={TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe(("out/#", 0))
    pub = paho_client(broker, V5)
    for topic in ("out/a", "out/a", "out/b", "out/c", "out/b"):
        pub.publish(topic, topic.encode(), qos=1)
    got = [sub.expect(PUBLISH) for _ in range(5)]
    seen = [(p.topic, p.properties.get(TOPIC_ALIAS), p.payload) for p in got]
    assert seen == [
        ("out/a", 1, b"out/a"),  # sets alias 1
        ("", 1, b"out/a"),  # uses it
        ("out/b", 2, b"out/b"),
        ("out/c", None, b"out/c"),  # no room left: in full
        ("", 2, b"out/b"),
    ]


def test_response_information_only_when_requested(start_broker, raw_client):
    # [3.1.2.11.7]: the server sends Response Information only if the client asked.
    server = start_broker(broker={"response_information": "replies/%c/"})
    client_id = unique_id("rr")
    asking = raw_client(server, V5)
    connack = asking.connect(client_id, properties={REQUEST_RESPONSE_INFORMATION: 1})
    assert connack.properties[RESPONSE_INFORMATION] == f"replies/{client_id}/"
    quiet = raw_client(server, V5)
    assert RESPONSE_INFORMATION not in quiet.connect(unique_id("rr")).properties


@pytest.mark.parametrize(("moved", "code"), [(False, 0x9C), (True, 0x9D)])
def test_server_reference_redirects_every_client(start_broker, raw_client, moved, code):
    # [4.11]: Use another server (0x9C) / Server moved (0x9D) with a Server Reference.
    server = start_broker(broker={"server_reference": "mqtt2:1883", "server_moved": moved})
    v5 = raw_client(server, V5)
    connack = v5.connect(unique_id(), expect_code=code)
    assert connack.properties[SERVER_REFERENCE] == "mqtt2:1883"
    v3 = raw_client(server, V311)
    v3.connect(unique_id(), expect_code=3)  # MQTT 3.1.1: server unavailable


def decoded(raw_packet):
    """The broker's own codec view of a packet RawClient read (RawPacket leaves the
    properties of acknowledgements and DISCONNECT undecoded)."""
    first = bytes([(raw_packet.type << 4) | raw_packet.flags])
    decoder = Decoder("client", 5)
    decoder.receive_data(first + encode_varint(len(raw_packet.body)) + raw_packet.body)
    return decoder.next_packet()


class DenyTopic:
    """Refuses publishing to deny/#, with a reason."""

    def auth_on_publish(self, ctx):
        return Error("denied_by_test") if ctx.topic.startswith("deny/") else NEXT


@pytest.mark.parametrize("problem_info", [None, 0])
def test_reason_strings_only_when_the_client_allows_them(start_broker, raw_client, problem_info):
    # [MQTT-3.1.2-29]: with Request Problem Information 0 no Reason String on a PUBACK.
    server = start_broker(
        plugins={"deny": {"enabled": True, "module": "tests.broker.test_mqtt5:DenyTopic"}}
    )
    raw = raw_client(server, V5)
    props = {} if problem_info is None else {REQUEST_PROBLEM_INFORMATION: problem_info}
    raw.connect(unique_id(), properties=props)
    raw.send(publish_packet("deny/x", b"no", qos=1, packet_id=5, version=V5))
    ack = decoded(raw.expect(PUBACK))
    assert ack.reason_code == 0x87
    expected = None if problem_info == 0 else "denied_by_test"
    assert ack.properties.get(REASON_STRING) == expected


class AckProperties:
    """Answers with User Properties wherever VerneMQ's m5 hooks can put them on an ack."""

    def auth_on_register_m5(self, ctx):
        if ctx.username == "deny":
            return Error("not_this_user", 0x87, {USER_PROPERTY: [("rule", "r0")]})
        return Ok({"properties": {USER_PROPERTY: [("tier", "gold")]}})

    def auth_on_publish_m5(self, ctx):
        if ctx.topic.startswith("deny/"):
            return Error("denied_by_rule", 0x87, {USER_PROPERTY: [("rule", "r1")]})
        return NEXT

    def auth_on_subscribe_m5(self, ctx):
        if ctx.topics[0].topic.startswith("deny/"):
            return Error("no_subscribe", 0x87, {USER_PROPERTY: [("rule", "r2")]})
        return NEXT

    def on_unsubscribe_m5(self, ctx):
        return Ok({"properties": {REASON_STRING: "bye", USER_PROPERTY: [("k", "v")]}})


@pytest.mark.parametrize("problem_info", [None, 0])
def test_plugins_put_user_properties_on_acknowledgements(start_broker, raw_client, problem_info):
    # [MQTT-3.1.2-29]: with Request Problem Information 0, Reason Strings and User
    # Properties may go on CONNACK and DISCONNECT only.
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"p": {"enabled": True, "module": "tests.broker.test_mqtt5:AckProperties"}},
    )
    raw = raw_client(server, V5)
    props = {} if problem_info is None else {REQUEST_PROBLEM_INFORMATION: problem_info}
    connack = decoded(raw.connect(unique_id(), properties=props))
    assert connack.properties[USER_PROPERTY] == [("tier", "gold")]
    allowed = problem_info != 0
    raw.send(publish_packet("deny/x", b"no", qos=1, packet_id=5, version=V5))
    puback = decoded(raw.expect(PUBACK))
    assert puback.reason_code == 0x87
    expected = {REASON_STRING: "denied_by_rule", USER_PROPERTY: [("rule", "r1")]}
    assert puback.properties == (expected if allowed else {})
    raw.send(subscribe_packet(6, [("deny/#", 1)], version=V5))
    suback = decoded(raw.expect(SUBACK))
    assert suback.reason_codes == [0x87]
    expected = {REASON_STRING: "no_subscribe", USER_PROPERTY: [("rule", "r2")]}
    assert suback.properties == (expected if allowed else {})
    raw.send(unsubscribe_packet(7, ["a/b"], version=V5))
    unsuback = decoded(raw.expect(UNSUBACK))
    expected = {REASON_STRING: "bye", USER_PROPERTY: [("k", "v")]}
    assert unsuback.properties == (expected if allowed else {})


def test_paho_sees_the_user_properties_of_its_connack(start_broker, paho_client):
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"p": {"enabled": True, "module": "tests.broker.test_mqtt5:AckProperties"}},
    )
    result = paho_client(server, V5, connect=False).connect()
    assert result.properties.UserProperty == [("tier", "gold")]


def test_reason_strings_are_left_out_above_the_clients_maximum_packet_size(
    start_broker, raw_client
):
    # [MQTT-3.1.2-24]: nothing larger than the client's Maximum Packet Size; a Reason String
    # or User Property that would make a packet too large is left out [MQTT-3.4.2-2/3].
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"p": {"enabled": True, "module": "tests.broker.test_mqtt5:AckProperties"}},
    )
    small = {MAXIMUM_PACKET_SIZE: 16}
    raw = raw_client(server, V5)
    raw.connect(unique_id(), properties=small)
    raw.send(publish_packet("deny/x", b"no", qos=1, packet_id=5, version=V5))
    puback = decoded(raw.expect(PUBACK))
    assert (puback.reason_code, puback.properties) == (0x87, {})
    raw.send(publish_packet("a/+", b"wildcards are not topics", version=V5))
    [disconnect] = raw.expect_closed()
    assert (disconnect.reason_code, decoded(disconnect).properties) == (0x90, {})
    refused = raw_client(server, V5)  # the same limit binds a refusing CONNACK
    refused.send(connect_packet(unique_id(), version=V5, properties=small, username="deny"))
    [connack] = refused.expect_closed()
    assert (connack.reason_code, decoded(connack).properties) == (0x87, {})


def test_protocol_errors_say_why_in_the_disconnect(broker, raw_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id())
    raw.send(publish_packet("a/+", b"wildcards are not topics", version=V5))
    [disconnect] = raw.expect_closed()
    assert disconnect.type == DISCONNECT and disconnect.reason_code == 0x90
    raw2 = raw_client(broker, V5)
    raw2.connect(unique_id())
    raw2.send(b"\x82\x07\x00\x01\x00\x00\x01a\x03")  # SUBSCRIBE with QoS 3
    [disconnect] = raw2.expect_closed()
    disconnect = decoded(disconnect)
    assert disconnect.reason_code == PROTOCOL_ERROR
    assert "QoS 3" in disconnect.properties[REASON_STRING]


class BadUnsubAckProperty:
    """Gives the UNSUBACK a User Property whose value is not a string: it cannot be encoded."""

    def on_unsubscribe_m5(self, ctx):
        return Ok({"properties": {USER_PROPERTY: [("k", 5)]}})


def test_a_packet_the_broker_cannot_encode_is_its_own_error_not_the_clients(
    start_broker, raw_client, caplog
):
    # A LocalProtocolError is a bug of ours (here a plugin's bad value): logged with its
    # traceback, answered 0x83 (implementation specific), not counted as the client's
    # protocol error (0x82); the broker serves the next client.
    server = start_broker(
        plugins={"p": {"enabled": True, "module": "tests.broker.test_mqtt5:BadUnsubAckProperty"}}
    )
    raw = raw_client(server, V5)
    raw.connect(unique_id())
    raw.send(unsubscribe_packet(7, ["a/b"], version=V5))
    (disconnect,) = raw.expect_closed()
    assert disconnect.type == DISCONNECT
    assert decoded(disconnect).reason_code == 0x83
    errors = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert errors and errors[0].exc_info is not None
    assert "cannot encode UnsubAck" in str(errors[0].exc_info[1])
    assert server.call(lambda: server.broker.metrics.mqtt_protocol_error) == 0
    other = raw_client(server, V5)
    assert decoded(other.connect(unique_id())).reason_code == 0
