"""MQTT 5 features beyond the core: payload format, packet size limits, server keep alive."""

from __future__ import annotations

from .helpers import CONNACK, PUBACK, PUBLISH, PUBREC, V5, publish_packet, unique_id

PAYLOAD_FORMAT_INDICATOR = 0x01
SERVER_KEEP_ALIVE = 0x13
MAXIMUM_PACKET_SIZE = 0x27
PAYLOAD_FORMAT_INVALID = 0x99


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
