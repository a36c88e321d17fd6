"""Hostile input over raw sockets: each attack closes that connection only.

Every test has a healthy paho client connected before the attack and checks afterwards
that it still publishes and receives, and that a new client can still connect. For MQTT
5 connections the broker says why it closes (a DISCONNECT with the reason code) first, as
DESIGN.md asks and [MQTT-4.13.1-1] recommends; a 3.1.1 connection is simply closed.
"""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import (
    CONNACK,
    DISCONNECT,
    PINGREQ_BYTES,
    PINGRESP,
    PUBLISH,
    SESSION_EXPIRY_INTERVAL,
    SUBACK,
    TIMEOUT,
    V5,
    V311,
    VERSIONS,
    RawClient,
    connect_packet,
    encode_properties,
    packet,
    publish_packet,
    subscribe_packet,
    unique_id,
    utf8,
)

MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94
TOPIC_ALIAS = 0x23
TOPIC_ALIAS_MAXIMUM = 0x22


@pytest.fixture
def server(start_broker):
    # A short connect timeout so half-open and garbage connections go quickly.
    return start_broker(broker={"connect_timeout": 1})


@pytest.fixture
def still_serving(server, paho_client):
    """A client connected before the attack; call the result to check it still works."""
    witness = paho_client(server, V311)
    witness.subscribe([("health/#", 1), ("a/#", 1)])

    def check() -> None:
        token = unique_id("ok").encode()
        witness.publish("health/check", token, qos=1)
        msgs = witness.collect_until(token)
        assert [m.topic for m in msgs] == ["health/check"], msgs
        fresh = paho_client(server, V5)
        fresh.subscribe("fresh/t", 1)
        fresh.publish("fresh/t", b"fresh", qos=1)
        assert fresh.expect_message().payload == b"fresh"

    return check


def assert_dropped(raw: RawClient, v5_reasons: tuple[int, ...] = ()) -> None:
    """The broker closed `raw`; a 5.0 client first got a DISCONNECT with one of the reasons."""
    got = raw.expect_closed(timeout=3)
    if raw.version == V5 and v5_reasons:
        assert len(got) == 1 and got[0].type == DISCONNECT, got
        assert got[0].reason_code in v5_reasons, got
    else:
        assert got == [], got


def connected(raw_client, server, version) -> RawClient:
    raw = raw_client(server, version)
    raw.connect(unique_id("attacker"), version=version)
    return raw


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 32,  # packet type 0 is reserved
        b"\xff" * 64,
        b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
        bytes(range(256)),
        b"\x10\x00",  # CONNECT with an empty body
        b"\x10\x02\x00\x04",  # CONNECT cut inside the protocol name
    ],
    ids=["zeros", "ones", "http", "ramp", "empty-connect", "short-connect"],
)
def test_garbage_before_connect(server, raw_client, still_serving, garbage):
    raw = raw_client(server)
    raw.send(garbage)
    got = raw.expect_closed(timeout=3)
    assert all(p.type == CONNACK and p.reason_code != 0 for p in got), got
    still_serving()


def test_oversized_remaining_length_before_connect(server, raw_client, still_serving):
    raw = raw_client(server)
    start = time.monotonic()
    raw.send(b"\x10\xff\xff\xff\xff\x7f")  # 5 length bytes: malformed [MQTT-1.5.5]
    assert raw.expect_closed(timeout=3) == []
    assert time.monotonic() - start < 0.9  # rejected at once, not by the connect timeout
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_oversized_remaining_length_after_connect(server, raw_client, still_serving, version):
    raw = connected(raw_client, server, version)
    raw.send(b"\x30\xff\xff\xff\xff\x7f")
    assert_dropped(raw, (MALFORMED_PACKET,))
    still_serving()


def test_half_connect_closed_after_connect_timeout(server, raw_client, still_serving):
    raw = raw_client(server)
    raw.send(connect_packet("half")[:7])
    start = time.monotonic()
    assert raw.expect_closed(timeout=4) == []
    assert 0.8 <= time.monotonic() - start <= 3.0
    still_serving()


def test_silent_connection_closed_after_connect_timeout(server, raw_client, still_serving):
    raw = raw_client(server)
    start = time.monotonic()
    assert raw.expect_closed(timeout=4) == []
    assert 0.8 <= time.monotonic() - start <= 3.0
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("topic", ["a/+", "a/#", "+"])
def test_publish_to_wildcard_topic(server, raw_client, still_serving, version, topic):
    # [MQTT-3.3.2-2]: the Topic Name in a PUBLISH must not contain wildcards.
    raw = connected(raw_client, server, version)
    raw.send(publish_packet(topic, b"bad", qos=1, packet_id=1, version=version))
    assert_dropped(raw, (MALFORMED_PACKET, PROTOCOL_ERROR, TOPIC_NAME_INVALID))
    still_serving()  # the witness (subscribed to a/#) got nothing before its check


@pytest.mark.parametrize("version", VERSIONS)
def test_second_connect_on_one_connection(server, raw_client, still_serving, version):
    # [MQTT-3.1.0-2]: a second CONNECT is a protocol error.
    raw = connected(raw_client, server, version)
    raw.send(connect_packet(unique_id(), version=version))
    assert_dropped(raw, (PROTOCOL_ERROR,))
    still_serving()


@pytest.mark.parametrize(
    "first",
    [
        publish_packet("a/b", b"early"),
        publish_packet("a/b", b"early", qos=1, packet_id=1),
        subscribe_packet(1, [("#", 0)]),
        PINGREQ_BYTES,
        b"\xe0\x00",  # DISCONNECT
    ],
    ids=["publish-qos0", "publish-qos1", "subscribe", "pingreq", "disconnect"],
)
def test_packet_before_connect(server, raw_client, still_serving, first):
    # [MQTT-3.1.0-1]: the first packet must be CONNECT; nothing is answered.
    raw = raw_client(server)
    raw.send(first)
    assert raw.expect_closed(timeout=3) == []
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_publish_with_qos_3(server, raw_client, still_serving, version):
    # [MQTT-3.3.1-4]: both QoS bits set is a malformed packet.
    raw = connected(raw_client, server, version)
    body = utf8("a/b") + b"\x00\x01" + (b"\x00" if version == V5 else b"") + b"x"
    raw.send(packet(0x36, body))
    assert_dropped(raw, (MALFORMED_PACKET,))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_with_bad_fixed_header_flags(server, raw_client, still_serving, version):
    # [MQTT-3.8.1-1]: SUBSCRIBE's flags must be 0010.
    raw = connected(raw_client, server, version)
    raw.send(b"\x80" + subscribe_packet(1, [("x", 0)], version=version)[1:])
    assert_dropped(raw, (MALFORMED_PACKET,))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("topic", [b"bad/\xc3\x28", b"nul/\x00/x", b"surrogate/\xed\xa0\x80"])
def test_invalid_utf8_topic(server, raw_client, still_serving, version, topic):
    # [MQTT-1.5.3-1] ill-formed UTF-8 (incl. surrogates), [MQTT-1.5.3-2] U+0000.
    raw = connected(raw_client, server, version)
    raw.send(publish_packet(topic, b"x", version=version))
    assert_dropped(raw, (MALFORMED_PACKET, TOPIC_NAME_INVALID))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_with_qos_3(server, raw_client, still_serving, version):
    # 3.1.1 [MQTT-3-8.3-4]: QoS 3 is malformed; 5.0 section 3.8.3.1: "It is a Protocol
    # Error if the Maximum QoS field has the value 3".
    raw = connected(raw_client, server, version)
    raw.send(subscribe_packet(1, [("x", 3)], version=version))
    assert_dropped(raw, (PROTOCOL_ERROR,))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_with_reserved_option_bits(server, raw_client, still_serving, version):
    # [MQTT-3-8.3-4] / 5.0 [MQTT-3.8.3-5]: non-zero reserved bits are malformed.
    raw = connected(raw_client, server, version)
    raw.send(subscribe_packet(1, [("x", 0xC1)], version=version))
    assert_dropped(raw, (MALFORMED_PACKET,))
    still_serving()


def test_v5_subscribe_with_retain_handling_3(server, raw_client, still_serving):
    # 5.0 section 3.8.3.1: a Retain Handling value of 3 is a Protocol Error.
    raw = connected(raw_client, server, V5)
    raw.send(subscribe_packet(1, [("x", 0x30)], version=V5))
    assert_dropped(raw, (PROTOCOL_ERROR,))
    still_serving()


@pytest.mark.parametrize(
    ("alias", "reasons"),
    [(0, (PROTOCOL_ERROR, TOPIC_ALIAS_INVALID)), ("max+1", (TOPIC_ALIAS_INVALID,))],
)
def test_v5_invalid_topic_alias(server, raw_client, still_serving, alias, reasons):
    # 5.0 section 3.3.2.3.4: alias 0 is not permitted [MQTT-3.3.2-8]; an alias above the
    # Topic Alias Maximum in CONNACK (absent: 0) gets DISCONNECT 0x94 (table 2-6).
    raw = raw_client(server, V5)
    connack = raw.connect(unique_id())
    if alias == "max+1":
        alias = connack.properties.get(TOPIC_ALIAS_MAXIMUM, 0) + 1
    raw.send(publish_packet("a/b", b"x", version=V5, properties={TOPIC_ALIAS: alias}))
    assert_dropped(raw, reasons)
    still_serving()


def test_v5_disconnect_may_not_set_expiry_after_zero(server, raw_client, still_serving):
    # [MQTT-3.14.2-2]: Session Expiry 0 at CONNECT cannot become non-zero at DISCONNECT.
    raw = connected(raw_client, server, V5)
    raw.send(packet(0xE0, b"\x00" + encode_properties({SESSION_EXPIRY_INTERVAL: 60})))
    assert_dropped(raw, (PROTOCOL_ERROR,))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_subscribe_without_filters(server, raw_client, still_serving, version):
    # [MQTT-3.8.3-3]: a SUBSCRIBE must contain at least one filter.
    raw = connected(raw_client, server, version)
    raw.send(subscribe_packet(1, [], version=version))
    assert_dropped(raw, (MALFORMED_PACKET, PROTOCOL_ERROR))
    still_serving()


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_publish_with_packet_id_zero(server, raw_client, still_serving, version):
    # [MQTT-2.3.1-1]: QoS > 0 packets need a non-zero packet identifier.
    raw = connected(raw_client, server, version)
    raw.send(publish_packet("a/b", b"x", qos=1, packet_id=0, version=version))
    assert_dropped(raw, (MALFORMED_PACKET, PROTOCOL_ERROR))
    still_serving()


def test_connect_with_reserved_flag_set(server, raw_client, still_serving):
    # [MQTT-3.1.2-3]: the reserved CONNECT flag must be 0.
    raw = raw_client(server)
    raw.send(connect_packet(unique_id(), reserved_flag=True))
    got = raw.expect_closed(timeout=3)
    assert all(p.type == CONNACK and p.reason_code != 0 for p in got), got
    still_serving()


def test_connect_with_wrong_protocol_name(server, raw_client, still_serving):
    raw = raw_client(server)
    raw.send(connect_packet(unique_id(), protocol_name="HTTP"))
    got = raw.expect_closed(timeout=3)
    assert all(p.type == CONNACK and p.reason_code != 0 for p in got), got
    still_serving()


def test_pipelined_packets_in_one_write(server, raw_client, still_serving):
    raw = raw_client(server)
    raw.send(
        connect_packet(unique_id())
        + subscribe_packet(1, [("pipe/t", 1)])
        + publish_packet("pipe/t", b"p", qos=1, packet_id=2)
        + PINGREQ_BYTES
    )
    assert raw.expect(CONNACK).reason_code == 0
    assert raw.expect(SUBACK).reason_codes == [1]
    assert raw.expect(4).packet_id == 2  # PUBACK
    assert raw.expect(PINGRESP).body == b""
    assert raw.expect(PUBLISH).payload == b"p"
    still_serving()


def test_many_abusive_connections_at_once(server, still_serving):
    socks = []
    for i in range(50):
        s = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
        s.sendall([b"\x00\x00", b"\x10\xff\xff\xff\xff\x7f", b"\x10\x0a"][i % 3])
        socks.append(s)
    for s in socks:
        with s:
            try:
                data = s.recv(100)
            except ConnectionResetError:
                data = b""
            assert data == b"", data  # closed, nothing answered
    still_serving()


@given(st.binary(min_size=1, max_size=64))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_fuzzed_bytes_after_connect(server, still_serving, data):
    raw = RawClient(server.host, server.port, V311)
    try:
        raw.connect(unique_id("fuzz"))
        raw.send(data)
    finally:
        raw.close()
    still_serving()


@pytest.mark.parametrize(
    "garbage", [b"GET / HTTP/1.1\r\n", b"\x16\x03\x01\x02\x00"], ids=["http", "tls"]
)
def test_non_mqtt_first_byte_closes_at_once(start_broker, raw_client, garbage):
    # Judged on the first byte: no waiting for the connect timeout (set far away here).
    server = start_broker(broker={"connect_timeout": 60})
    raw = raw_client(server)
    raw.send(garbage)
    assert raw.expect_closed(timeout=2) == []
