"""CONNECT / CONNACK: versions, client ids, keep-alive, takeover, PING, DISCONNECT."""

from __future__ import annotations

import time

import pytest

from .helpers import (
    ASSIGNED_CLIENT_IDENTIFIER,
    CONNACK,
    DISCONNECT,
    PINGREQ_BYTES,
    PINGRESP,
    V5,
    V31,
    V311,
    VERSIONS,
    connect_packet,
    unique_id,
)

# MQTT 3.1.1 CONNACK return codes [MQTT-3.2.2.3] and MQTT 5 reason codes (table 2-6).
UNACCEPTABLE_PROTOCOL_VERSION = 1
IDENTIFIER_REJECTED = 2
CLIENT_IDENTIFIER_NOT_VALID = 0x85
SESSION_TAKEN_OVER = 0x8E


@pytest.mark.parametrize("version", VERSIONS)
def test_connect_and_round_trip(broker, paho_client, version):
    sub = paho_client(broker, version, connect=False)
    result = sub.connect()
    assert result.reason_code == 0
    assert result.session_present is False
    assert sub.subscribe("hello/world", 1) == [1]
    pub = paho_client(broker, version)
    pub.publish("hello/world", b"hi", qos=1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("hello/world", b"hi", 1)


@pytest.mark.parametrize("level", [2, 6, 7])
def test_unsupported_protocol_level_is_refused(broker, raw_client, level):
    # [MQTT-3.1.2-2]: CONNACK with return code 0x01 and then close the connection.
    raw = raw_client(broker)
    raw.send(connect_packet("bad-level", version=level))
    got = raw.expect_closed()
    assert len(got) == 1, got
    assert got[0].type == CONNACK
    assert got[0].body == bytes([0, UNACCEPTABLE_PROTOCOL_VERSION])
    counters = broker.call(broker.broker.metrics.snapshot)
    assert counters["mqtt_connack_unacceptable_protocol_sent"] == 1


def test_mqtt31_mqisdp_is_accepted_raw(broker, raw_client):
    raw = raw_client(broker, V31)
    connack = raw.connect("old-client", version=V31)
    assert connack.body == b"\x00\x00"
    assert raw.subscribe(("v31/t", 1)) == [1]
    raw.publish("v31/t", b"x", qos=1)
    got = raw.expect(3)
    assert (got.topic, got.payload, got.qos) == ("v31/t", b"x", 1)


def test_mqtt31_paho_round_trip(broker, paho_client):
    sub = paho_client(broker, V31)
    sub.subscribe("v31/#", 2)
    pub = paho_client(broker, V311)
    pub.publish("v31/a", b"from 3.1.1", qos=2)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos) == ("v31/a", b"from 3.1.1", 2)


def test_keepalive_expiry_after_one_and_a_half_periods(broker, raw_client):
    # [MQTT-3.1.2-24]: no packet within 1.5 x keep-alive -> the server disconnects.
    raw = raw_client(broker)
    raw.connect(unique_id(), keepalive=1)
    start = time.monotonic()
    raw.expect_closed(timeout=4)
    elapsed = time.monotonic() - start
    assert 1.25 <= elapsed <= 3.0, elapsed


def test_keepalive_expiry_v5_sends_disconnect_or_closes(broker, raw_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id(), keepalive=1)
    start = time.monotonic()
    got = raw.expect_closed(timeout=4)
    assert 1.25 <= time.monotonic() - start <= 3.0
    # A DISCONNECT is optional here; if sent it must say "keep alive timeout" (0x8D).
    assert all(p.type == DISCONNECT and p.reason_code == 0x8D for p in got), got


def test_traffic_keeps_the_connection_alive(broker, raw_client):
    raw = raw_client(broker)
    raw.connect(unique_id(), keepalive=1)
    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # well past 1.5 s, one ping every 0.5 s
        raw.expect_silence(0.5)
        raw.send(PINGREQ_BYTES)
        assert raw.expect(PINGRESP).body == b""
    assert raw.is_open()


def test_keepalive_zero_disables_the_timer(broker, raw_client):
    raw = raw_client(broker)
    raw.connect(unique_id(), keepalive=0)
    raw.expect_silence(2.0)
    assert raw.is_open()


@pytest.mark.parametrize("version", [V31, V311, V5])
def test_pingreq_gets_pingresp(broker, raw_client, version):
    raw = raw_client(broker, version)
    raw.connect(unique_id(), version=version)
    for _ in range(3):
        raw.send(PINGREQ_BYTES)
        pkt = raw.expect(PINGRESP)
        assert (pkt.flags, pkt.body) == (0, b"")


def test_empty_client_id_v5_gets_an_assigned_identifier(broker, raw_client):
    ids = []
    for _ in range(2):
        raw = raw_client(broker, V5)
        connack = raw.connect("")
        assigned = connack.properties.get(ASSIGNED_CLIENT_IDENTIFIER)
        assert assigned, connack
        ids.append(assigned)
    assert ids[0] != ids[1]


def test_empty_client_id_v5_paho(broker, paho_client):
    client = paho_client(broker, V5, client_id="", connect=False)
    result = client.connect()
    assert result.properties.AssignedClientIdentifier
    client.subscribe("empty/id", 1)
    client.publish("empty/id", b"me", qos=1)
    assert client.expect_message().payload == b"me"


def test_empty_client_id_v311_clean_session_is_accepted(broker, raw_client):
    raw = raw_client(broker)
    connack = raw.connect("", clean=True)
    assert connack.body == b"\x00\x00"
    assert raw.is_open()


def test_empty_client_id_v311_persistent_session_is_rejected(broker, raw_client):
    # [MQTT-3.1.3-8]: CONNACK return code 0x02 (identifier rejected), then close.
    raw = raw_client(broker)
    raw.send(connect_packet("", clean=False))
    got = raw.expect_closed()
    assert [(p.type, p.body) for p in got] == [(CONNACK, bytes([0, IDENTIFIER_REJECTED]))]


@pytest.mark.parametrize("version", VERSIONS)
def test_client_id_longer_than_max_client_id_size_is_rejected(start_broker, raw_client, version):
    server = start_broker(broker={"max_client_id_size": 10})
    ok = raw_client(server, version)
    ok.connect("a" * 10)
    bad = raw_client(server, version)
    bad.send(connect_packet("b" * 11, version=version))
    got = bad.expect_closed()
    assert len(got) == 1 and got[0].type == CONNACK
    expected = CLIENT_IDENTIFIER_NOT_VALID if version == V5 else IDENTIFIER_REJECTED
    assert got[0].reason_code == expected
    counters = server.call(server.broker.metrics.snapshot)
    assert counters["mqtt_connack_sent"] == 2
    assert counters["mqtt_connack_accepted_sent"] == 1
    assert counters["mqtt_connack_identifier_rejected_sent"] == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_allow_anonymous_false_refuses_without_credentials(start_broker, raw_client, version):
    server = start_broker(broker={"allow_anonymous": False})
    raw = raw_client(server, version)
    raw.send(connect_packet(unique_id(), version=version))
    got = raw.expect_closed()
    assert len(got) == 1 and got[0].type == CONNACK
    # No plugin can allow anyone: VerneMQ's "no matching hook" is CONNACK 5 / not authorized.
    assert got[0].reason_code == (0x87 if version == V5 else 5)
    counters = server.call(server.broker.metrics.snapshot)
    assert counters["mqtt_connack_not_authorized_sent"] == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_session_takeover_disconnects_the_first_client(broker, paho_client, version):
    # [MQTT-3.1.4-2]: a CONNECT with a client id already connected disconnects the old one.
    client_id = unique_id("dup")
    first = paho_client(broker, version, client_id)
    second = paho_client(broker, version, client_id)
    reason = first.expect_disconnected()
    if version == V5:
        assert reason == SESSION_TAKEN_OVER
    second.subscribe("takeover/t", 1)
    second.publish("takeover/t", b"still here", qos=1)
    assert second.expect_message().payload == b"still here"
    first.expect_no_message(0.2)


def test_session_takeover_v5_sends_disconnect_0x8e(broker, raw_client):
    client_id = unique_id("dup")
    first = raw_client(broker, V5)
    first.connect(client_id)
    second = raw_client(broker, V5)
    second.connect(client_id)
    got = first.expect_closed()
    assert [(p.type, p.reason_code) for p in got] == [(DISCONNECT, SESSION_TAKEN_OVER)]
    assert second.is_open()


def test_session_takeover_v311_closes_without_disconnect(broker, raw_client):
    client_id = unique_id("dup")
    first = raw_client(broker)
    first.connect(client_id)
    second = raw_client(broker)
    second.connect(client_id)
    # MQTT 3.1.1 has no server-to-client DISCONNECT: the connection is just closed.
    assert first.expect_closed() == []
    assert second.is_open()


def test_v5_client_disconnect_with_reason_closes_cleanly(broker, raw_client):
    raw = raw_client(broker, V5)
    raw.connect(unique_id())
    raw.disconnect(reason=0)  # waits for the broker to close


def test_connack_v5_is_well_formed(broker, raw_client):
    raw = raw_client(broker, V5)
    connack = raw.connect(unique_id())
    assert connack.session_present is False
    assert connack.body[0] == 0  # reserved bits of the acknowledge flags [MQTT-3.2.2-1]
    assert raw.is_open()


def test_connect_sent_one_byte_at_a_time(broker, raw_client):
    raw = raw_client(broker)
    for byte in connect_packet(unique_id(), keepalive=30):
        raw.send(bytes([byte]))
    assert raw.expect(CONNACK).body == b"\x00\x00"


def test_connect_version_level_checked_for_v311_name(broker, raw_client):
    # "MQTT" with level 3 is neither 3.1 ("MQIsdp", 3) nor 3.1.1 ("MQTT", 4).
    raw = raw_client(broker)
    raw.send(connect_packet(unique_id(), version=V31, protocol_name="MQTT"))
    got = raw.expect_closed()
    assert all(p.type == CONNACK and p.reason_code != 0 for p in got), got
