# Pre-encoded MQTT 3.1.1 packets for the load generator.
#
# Strategy: every packet the generator sends is encoded once, with the project's own codec,
# before the clock starts. Floods repeat one PUBLISH many times in a single bytes object;
# QoS 1 publishers use a "ring" holding the same PUBLISH for each packet id 1..65535, so
# sending the next k messages is one memoryview slice, with no per-message Python work.
from __future__ import annotations

from dataclasses import dataclass

from broker.protocol import Connect, PubAck, Publish, Subscribe, Subscription, encode

MQTT_311 = 4
MAX_PACKET_ID = 0xFFFF
# Subscribers ack a QoS 1 delivery by appending the broker's two id bytes to this.
PUBACK_HEAD = encode(PubAck(1), MQTT_311)[:2]


def connect(
    client_id: str,
    keepalive: int = 0,
    clean_session: bool = True,
    username: str | None = None,
    password: str | None = None,
) -> bytes:
    """CONNECT (a clean session unless told otherwise); keepalive 0 so idle benchmark
    clients need no PINGREQ."""
    packet = Connect(
        client_id,
        MQTT_311,
        clean_start=clean_session,
        keepalive=keepalive,
        username=username,
        password=None if password is None else password.encode(),
    )
    return encode(packet, MQTT_311)


def subscribe(topic_filter: str, qos: int, packet_id: int = 1) -> bytes:
    return encode(Subscribe(packet_id, [Subscription(topic_filter, qos)]), MQTT_311)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None) -> bytes:
    return encode(Publish(topic, payload, qos=qos, packet_id=packet_id), MQTT_311)


def header_length(packet: bytes) -> int:
    """Length of the fixed header: type byte + remaining-length varint."""
    length = 2
    while packet[length - 1] & 0x80:  # continuation bit
        length += 1
    return length


def packet_id_offset(packet: bytes) -> int:
    """Where a QoS > 0 PUBLISH carries its packet id: right after the topic [3.3.2.2]."""
    header = header_length(packet)
    return header + 2 + int.from_bytes(packet[header : header + 2], "big")


def payload_of(size: int) -> bytes:
    return b"x" * size


@dataclass(frozen=True, slots=True)
class PublishRing:
    """QoS 1 PUBLISHes for packet ids 1..65535, back to back, all `size` bytes long."""

    data: bytes
    size: int

    def chunk(self, start: int, count: int) -> list[memoryview]:
        """`count` packets from ring index `start` (wrapping), as zero-copy views."""
        view = memoryview(self.data)
        first = min(count, MAX_PACKET_ID - start)
        parts = [view[start * self.size : (start + first) * self.size]]
        if first < count:
            parts.append(view[: (count - first) * self.size])
        return parts


def publish_ring(topic: str, payload: bytes) -> PublishRing:
    packet = publish(topic, payload, qos=1, packet_id=1)
    size, offset = len(packet), packet_id_offset(packet)
    ring = bytearray(packet * MAX_PACKET_ID)
    ids = range(1, MAX_PACKET_ID + 1)
    # Patch the id bytes of all packets at once with extended-slice assignment.
    ring[offset::size] = bytes(i >> 8 for i in ids)
    ring[offset + 1 :: size] = bytes(i & 0xFF for i in ids)
    return PublishRing(bytes(ring), size)
