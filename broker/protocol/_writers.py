# Packet writers: one function per packet class, chosen from WRITERS by type(packet).
#
# Strategy: a writer returns the variable header and payload as a list of byte chunks;
# `encode` prepends the fixed header. PUBLISH has its own path (`encode_publish`) because it
# is the one packet on the hot path: the broker encodes a message once per wire form and
# reuses the bytes for every subscriber, patching only the packet id (see `PublishTemplate`).
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ._buffer import encode_binary, encode_string, encode_u16, encode_varint
from ._errors import LocalProtocolError
from ._events import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from ._properties import PROPERTY_SPEC, Property, PropertyType
from ._readers import MQTT5, PROTOCOL_NAMES

_u32 = struct.Struct(">I").pack

# A writer takes the packet class it is filed under in WRITERS, which a Callable type
# cannot say of a table keyed by class: the packet parameter is typed Any there.
Writer = Callable[[Any, int], tuple[int, list[bytes]]]


def _encode_value(kind: PropertyType, value) -> bytes:
    if kind is PropertyType.BYTE:
        return bytes((value,))
    if kind is PropertyType.TWO_BYTE_INT:
        return encode_u16(value)
    if kind is PropertyType.FOUR_BYTE_INT:
        return _u32(value)
    if kind is PropertyType.VAR_INT:
        return encode_varint(value)
    if kind is PropertyType.UTF8:
        return encode_string(value)
    if kind is PropertyType.BINARY:
        return encode_binary(value)
    return encode_string(value[0]) + encode_string(value[1])


def encode_properties(props: Properties, where: str) -> bytes:
    """A property block for the packet named `where`: its length, then each property."""
    if not props:
        return b"\x00"
    chunks = []
    for prop, value in props.items():
        kind, allowed = PROPERTY_SPEC[prop]
        if where not in allowed:
            raise ValueError(f"property {Property(prop).name} is not allowed in {where}")
        for item in value if isinstance(value, list) else (value,):
            chunks.append(encode_varint(prop))
            chunks.append(_encode_value(kind, item))
    body = b"".join(chunks)
    return encode_varint(len(body)) + body


def _props(level: int, props: Properties, where: str) -> list[bytes]:
    return [encode_properties(props, where)] if level == MQTT5 else []


def _check_qos(qos: int) -> int:
    if not 0 <= qos <= 2:
        raise ValueError(f"QoS {qos}")
    return qos


def write_connect(p: Connect, level: int) -> tuple[int, list[bytes]]:
    will = p.will
    flags = (p.clean_start << 1) | ((p.password is not None) << 6)
    flags |= (p.username is not None) << 7
    if will is not None:
        flags |= 0x04 | (_check_qos(will.qos) << 3) | (will.retain << 5)
    chunks = [encode_string(PROTOCOL_NAMES[level]), bytes((level, flags)), encode_u16(p.keepalive)]
    chunks += _props(level, p.properties, "CONNECT")
    chunks.append(encode_string(p.client_id))
    if will is not None:
        chunks += _props(level, will.properties, "WILL")
        chunks += [encode_string(will.topic), encode_binary(will.payload)]
    if p.username is not None:
        chunks.append(encode_string(p.username))
    if p.password is not None:
        chunks.append(encode_binary(p.password))
    return 0x10, chunks


def write_connack(p: ConnAck, level: int) -> tuple[int, list[bytes]]:
    return 0x20, [
        bytes((p.session_present, p.reason_code)),
        *_props(level, p.properties, "CONNACK"),
    ]


def _ack_writer(first_byte: int, where: str) -> Writer:
    def write_ack(p: PubAck | PubRec | PubRel | PubComp, level: int) -> tuple[int, list[bytes]]:
        chunks = [encode_u16(p.packet_id)]
        if level == MQTT5 and (p.reason_code or p.properties):
            chunks.append(bytes((p.reason_code,)))
            if p.properties:
                chunks.append(encode_properties(p.properties, where))
        return first_byte, chunks

    return write_ack


def write_subscribe(p: Subscribe, level: int) -> tuple[int, list[bytes]]:
    chunks = [encode_u16(p.packet_id), *_props(level, p.properties, "SUBSCRIBE")]
    for sub in p.subscriptions:
        options = _check_qos(sub.qos)
        if level == MQTT5:
            options |= (sub.no_local << 2) | (sub.retain_as_published << 3)
            options |= sub.retain_handling << 4
        chunks += [encode_string(sub.topic_filter), bytes((options,))]
    return 0x82, chunks


def write_suback(p: SubAck, level: int) -> tuple[int, list[bytes]]:
    props = _props(level, p.properties, "SUBACK")
    return 0x90, [encode_u16(p.packet_id), *props, bytes(p.reason_codes)]


def write_unsubscribe(p: Unsubscribe, level: int) -> tuple[int, list[bytes]]:
    chunks = [encode_u16(p.packet_id), *_props(level, p.properties, "UNSUBSCRIBE")]
    chunks += [encode_string(f) for f in p.topic_filters]
    return 0xA2, chunks


def write_unsuback(p: UnsubAck, level: int) -> tuple[int, list[bytes]]:
    chunks = [encode_u16(p.packet_id)]
    if level == MQTT5:
        chunks += [encode_properties(p.properties, "UNSUBACK"), bytes(p.reason_codes)]
    return 0xB0, chunks


def _reason_writer(first_byte: int, where: str) -> Writer:
    """DISCONNECT and AUTH: in MQTT 5 the reason and properties may be left out."""

    def write_reason(p: Disconnect | Auth, level: int) -> tuple[int, list[bytes]]:
        if level < MQTT5 or not (p.reason_code or p.properties):
            return first_byte, []
        chunks = [bytes((p.reason_code,))]
        if p.properties:
            chunks.append(encode_properties(p.properties, where))
        return first_byte, chunks

    return write_reason


def write_pingreq(p: PingReq, level: int) -> tuple[int, list[bytes]]:
    return 0xC0, []


def write_pingresp(p: PingResp, level: int) -> tuple[int, list[bytes]]:
    return 0xD0, []


def write_publish(p: Publish, level: int) -> tuple[int, list[bytes]]:
    if not 0 <= p.qos <= 2:
        raise LocalProtocolError(f"PUBLISH with QoS {p.qos}")
    first = 0x30 | (p.dup << 3) | (p.qos << 1) | p.retain
    chunks = [encode_string(p.topic)]
    if p.qos:
        if p.packet_id is None:
            raise LocalProtocolError(f"QoS {p.qos} PUBLISH without a packet identifier")
        chunks.append(encode_u16(p.packet_id))
    chunks += _props(level, p.properties, "PUBLISH")
    chunks.append(p.payload)
    return first, chunks


WRITERS: dict[type[Packet], Writer] = {
    Connect: write_connect,
    ConnAck: write_connack,
    Publish: write_publish,
    PubAck: _ack_writer(0x40, "PUBACK"),
    PubRec: _ack_writer(0x50, "PUBREC"),
    PubRel: _ack_writer(0x62, "PUBREL"),
    PubComp: _ack_writer(0x70, "PUBCOMP"),
    Subscribe: write_subscribe,
    SubAck: write_suback,
    Unsubscribe: write_unsubscribe,
    UnsubAck: write_unsuback,
    PingReq: write_pingreq,
    PingResp: write_pingresp,
    Disconnect: _reason_writer(0xE0, "DISCONNECT"),
    Auth: _reason_writer(0xF0, "AUTH"),
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode one packet for a peer speaking `protocol_level` (3, 4 or 5).

    Raises:
        LocalProtocolError: the packet cannot be expressed (bad value, oversized field).
    """
    if type(packet) is Auth and protocol_level < MQTT5:
        raise LocalProtocolError("AUTH exists only in MQTT 5")
    try:
        first, chunks = WRITERS[type(packet)](packet, protocol_level)
        body = b"".join(chunks)
        return bytes((first,)) + encode_varint(len(body)) + body
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError, struct.error) as exc:
        raise LocalProtocolError(f"cannot encode {type(packet).__name__}: {exc}") from exc


def plain_ack(packet: type[PubAck | PubRec | PubRel | PubComp]) -> Callable[[int], bytes]:
    """A function of a packet id giving that acknowledgement's bytes with success and no
    properties, which every protocol version reads the same (MQTT 5 leaves the reason
    code out when it is 0 and there are no properties [3.4.2.1]): what `encode` gives,
    without its general path, for acknowledgements sent once per message."""
    first, _ = WRITERS[packet](packet(0), MQTT5)
    prefix = bytes((first, 2))

    def ack(packet_id: int) -> bytes:
        return prefix + packet_id.to_bytes(2, "big")

    return ack


encode_puback = plain_ack(PubAck)
encode_pubrec = plain_ack(PubRec)


def _packet_id_offset(packet: bytes) -> int:
    """Where a PUBLISH's packet id is (or, at QoS 0, would be): after the fixed header (type
    byte + remaining length, whose last byte has no continuation bit) and the topic (2-byte
    length + text). Raises ValueError when the packet is too short to say."""
    size = len(packet)
    header = 2
    while header <= 5 and header - 1 < size and packet[header - 1] & 0x80:
        header += 1
    if header + 2 > size:
        raise ValueError("not a PUBLISH with a packet id")
    return header + 2 + ((packet[header] << 8) | packet[header + 1])


def publish_with_id(packet: bytes, packet_id: int, retain: bool) -> bytes:
    """A QoS 1/2 PUBLISH as received (`Publish.raw`), to be sent on under `packet_id`,
    with `retain` as its retain flag and DUP clear: the one copy a delivery needs, without
    a template (the compiled twin: _speedups.c). Raises ValueError on a packet too short
    to hold its packet id."""
    at = _packet_id_offset(packet)
    if at + 2 > len(packet):
        raise ValueError("not a PUBLISH with a packet id")
    out = bytearray(packet)
    out[0] = (out[0] & 0xF6) | retain
    out[at] = packet_id >> 8
    out[at + 1] = packet_id & 0xFF
    return bytes(out)


class PublishTemplate:
    """One PUBLISH encoded once, sent to many subscribers with their own packet ids.

    MQTT puts the packet id right after the topic [3.3.2.2], so for QoS > 0 the bytes are
    copied once per subscriber and two bytes patched; QoS 0 bytes are shared as they are.
    `data` may also be a PUBLISH as received (`Publish.raw`): same layout, reused as is.
    """

    __slots__ = ("data", "id_offset")

    def __init__(self, data: bytes, retain: bool | None = None) -> None:
        if retain is not None and bool(data[0] & 0x01) != retain:
            data = bytes((data[0] ^ 0x01,)) + data[1:]
        if data[0] & 0x08:
            data = bytes((data[0] & 0xF7,)) + data[1:]  # DUP is set per delivery
        self.data = data
        self.id_offset = _packet_id_offset(data)

    @classmethod
    def encode(cls, packet: Publish, protocol_level: int) -> PublishTemplate:
        if packet.qos and packet.packet_id is None:
            packet.packet_id = 1  # placeholder, patched by with_packet_id
        return cls(encode(packet, protocol_level))

    def with_packet_id(self, packet_id: int, dup: bool = False) -> bytes:
        out = bytearray(self.data)
        out[self.id_offset] = packet_id >> 8
        out[self.id_offset + 1] = packet_id & 0xFF
        if dup:
            out[0] |= 0x08
        return bytes(out)
