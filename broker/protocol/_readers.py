# Packet readers: one function per packet type, chosen from READERS by the type nibble.
#
# Strategy: the decoder hands a reader the fixed-header flags, the complete body as bytes
# and the protocol level; the reader returns a packet or raises RemoteProtocolError. Every
# reader must consume the body exactly: trailing bytes are malformed. Spec references are
# to MQTT 5.0 unless they say otherwise; 3.1.1 rules are the same where both exist.
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ._buffer import (
    decode_utf8,
    read_binary,
    read_byte,
    read_string,
    read_u16,
    read_u32,
    read_varint,
)
from ._errors import RemoteProtocolError, malformed, protocol_error
from ._events import (
    MQTT5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from ._properties import PROPERTY_SPEC, REPEATABLE, Property, PropertyType
from ._reasons import ReasonCode

PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}

# Properties whose value 0 is a Protocol Error, and those that must be 0 or 1.
_NONZERO = frozenset(
    {
        Property.RECEIVE_MAXIMUM,
        Property.MAXIMUM_PACKET_SIZE,
        Property.TOPIC_ALIAS,
        Property.SUBSCRIPTION_IDENTIFIER,
    }
)
_BOOLEAN = frozenset(
    {
        Property.PAYLOAD_FORMAT_INDICATOR,
        Property.REQUEST_PROBLEM_INFORMATION,
        Property.REQUEST_RESPONSE_INFORMATION,
        Property.MAXIMUM_QOS,
        Property.RETAIN_AVAILABLE,
        Property.WILDCARD_SUBSCRIPTION_AVAILABLE,
        Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        Property.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)


class UnsupportedProtocolVersion(RemoteProtocolError):
    """CONNECT names a protocol or level we do not speak; answered with CONNACK 0x84 / 1."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION

    def __init__(self, message: str, protocol_level: int) -> None:
        super().__init__(message)
        self.protocol_level = protocol_level


def _read_value(kind: PropertyType, data: bytes, pos: int):
    if kind is PropertyType.BYTE:
        return read_byte(data, pos)
    if kind is PropertyType.FOUR_BYTE_INT:
        return read_u32(data, pos)
    if kind is PropertyType.TWO_BYTE_INT:
        return read_u16(data, pos)
    if kind is PropertyType.VAR_INT:
        return read_varint(data, pos)
    if kind is PropertyType.UTF8:
        return read_string(data, pos)
    if kind is PropertyType.BINARY:
        return read_binary(data, pos)
    name, pos = read_string(data, pos)
    value, pos = read_string(data, pos)
    return (name, value), pos


def read_properties(data: bytes, pos: int, where: str) -> tuple[Properties, int]:
    """Read a property block [2.2.2] valid for the packet named `where`."""
    length, pos = read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise malformed("property length runs past the end of the packet")
    props: Properties = {}
    while pos < end:
        ident, pos = read_varint(data, pos)
        try:
            prop = Property(ident)
            kind, allowed = PROPERTY_SPEC[prop]
        except ValueError:
            raise malformed(f"unknown property identifier {ident:#04x}") from None
        if where not in allowed:
            raise malformed(f"property {prop.name} is not allowed in {where}")
        value, pos = _read_value(kind, data, pos)
        if pos > end:
            raise malformed("property runs past the property length")
        if prop in _NONZERO and value == 0:
            raise protocol_error(f"property {prop.name} must not be 0")
        if prop in _BOOLEAN and value > 1:
            raise protocol_error(f"property {prop.name} must be 0 or 1")
        if prop in REPEATABLE:
            props.setdefault(prop, []).append(value)
        elif prop in props:
            raise protocol_error(f"property {prop.name} appears twice")
        else:
            props[prop] = value
    return props, end


_P = TypeVar("_P", bound=Packet)


def _end(data: bytes, pos: int, packet: _P) -> _P:
    if pos != len(data):
        raise malformed(f"{type(packet).__name__} has {len(data) - pos} unexpected bytes")
    return packet


def read_connect(flags: int, data: bytes, level: int) -> Connect:
    # The level comes from the packet itself: CONNECT is what sets it for the stream.
    name, pos = read_string(data, 0)
    level, pos = read_byte(data, pos)
    if name not in ("MQTT", "MQIsdp"):
        # Not an MQTT client at all: the server may simply disconnect [MQTT-3.1.2-1].
        raise protocol_error(f"unknown protocol name {name!r}")
    if PROTOCOL_NAMES.get(level) != name:
        # [MQTT-3.1.2-2]: answered with CONNACK "unsupported protocol version".
        raise UnsupportedProtocolVersion(f"unsupported protocol {name!r} level {level}", level)
    cflags, pos = read_byte(data, pos)
    if cflags & 0x01:
        raise malformed("reserved CONNECT flag set [MQTT-3.1.2-3]")
    will_flag = bool(cflags & 0x04)
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    if will_qos == 3:
        raise malformed("will QoS 3 [MQTT-3.1.2-12]")
    if not will_flag and (will_qos or will_retain):
        raise malformed("will QoS or retain set without a will [MQTT-3.1.2-11/13]")
    has_username = bool(cflags & 0x80)
    has_password = bool(cflags & 0x40)
    if level < MQTT5 and has_password and not has_username:
        raise malformed("password without a user name [MQTT-3.1.2-22]")
    keepalive, pos = read_u16(data, pos)
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "CONNECT")
        if Property.AUTHENTICATION_DATA in props and Property.AUTHENTICATION_METHOD not in props:
            raise protocol_error("authentication data without a method [3.1.2.11.10]")
    client_id, pos = read_string(data, pos)
    will = None
    if will_flag:
        will_props: Properties = {}
        if level == MQTT5:
            will_props, pos = read_properties(data, pos, "WILL")
        will_topic, pos = read_string(data, pos)
        will_payload, pos = read_binary(data, pos)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_username:
        username, pos = read_string(data, pos)
    if has_password:
        password, pos = read_binary(data, pos)
    packet = Connect(
        client_id=client_id,
        protocol_level=level,
        clean_start=bool(cflags & 0x02),
        keepalive=keepalive,
        username=username,
        password=password,
        will=will,
        properties=props,
        protocol_name=name,
    )
    return _end(data, pos, packet)


def read_connack(flags: int, data: bytes, level: int) -> ConnAck:
    ack_flags, pos = read_byte(data, 0)
    if ack_flags & 0xFE:
        raise malformed("reserved CONNACK flags set [MQTT-3.2.2-1]")
    code, pos = read_byte(data, pos)
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "CONNACK")
    return _end(data, pos, ConnAck(code, bool(ack_flags & 0x01), props))


def read_publish(flags: int, data: bytes, level: int, start: int = 0) -> Publish:
    """The hot path: `data` is the whole packet, kept as `raw`; the body begins at `start`.

    The topic is read inline rather than through read_string: this runs once per message.
    """
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise malformed("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
    dup = bool(flags & 0x08)
    if dup and not qos:
        raise malformed("DUP flag set on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
    pos = start + 2
    if pos > len(data):
        raise malformed("truncated packet: expected a topic")
    topic_end = pos + ((data[start] << 8) | data[start + 1])
    if topic_end > len(data):
        raise malformed("truncated packet: topic runs past the end")
    topic = decode_utf8(data[pos:topic_end])
    pos = topic_end
    packet_id = None
    if qos:
        packet_id, pos = read_u16(data, pos)
        if not packet_id:
            raise malformed("PUBLISH packet identifier 0 [MQTT-2.2.1-3]")
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "PUBLISH")
    packet = Publish(topic, data[pos:], qos, bool(flags & 0x01), dup, packet_id, props)
    packet.raw = data if start else None
    return packet


def _ack_reader(
    cls: type[PubAck | PubRec | PubRel | PubComp], where: str
) -> Callable[[int, bytes, int], Packet]:
    """PUBACK, PUBREC, PUBREL and PUBCOMP share one layout [3.4.2]."""

    def read_ack(flags: int, data: bytes, level: int) -> Packet:
        packet_id, pos = read_u16(data, 0)
        if level < MQTT5 or pos == len(data):
            return _end(data, pos, cls(packet_id))
        code, pos = read_byte(data, pos)
        props: Properties = {}
        if pos < len(data):
            props, pos = read_properties(data, pos, where)
        return _end(data, pos, cls(packet_id, code, props))

    return read_ack


def _read_packet_id(data: bytes) -> tuple[int, int]:
    packet_id, pos = read_u16(data, 0)
    if not packet_id:
        raise malformed("packet identifier 0 [MQTT-2.2.1-3]")
    return packet_id, pos


def read_subscribe(flags: int, data: bytes, level: int) -> Subscribe:
    packet_id, pos = _read_packet_id(data)
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "SUBSCRIBE")
        if len(props.get(Property.SUBSCRIPTION_IDENTIFIER, ())) > 1:
            raise protocol_error("more than one subscription identifier in SUBSCRIBE")
    subscriptions = []
    while pos < len(data):
        topic_filter, pos = read_string(data, pos)
        options, pos = read_byte(data, pos)
        reserved = 0xC0 if level == MQTT5 else 0xFC
        if options & reserved:
            raise malformed("reserved subscription option bits set [MQTT-3.8.3-5]")
        qos = options & 0x03
        retain_handling = (options >> 4) & 0x03
        if qos == 3:  # 3.1.1 calls it malformed [MQTT-3-8.3-4], 5.0 a protocol error
            message = "subscription QoS 3 [MQTT-3.8.3-4]"
            raise protocol_error(message) if level == MQTT5 else malformed(message)
        if retain_handling == 3:
            raise protocol_error("retain handling 3 [MQTT-3.8.3-1]")
        subscriptions.append(
            Subscription(
                topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling
            )
        )
    if not subscriptions:
        raise protocol_error("SUBSCRIBE without any topic filter [MQTT-3.8.3-2]")
    return Subscribe(packet_id, subscriptions, props)


def read_suback(flags: int, data: bytes, level: int) -> SubAck:
    packet_id, pos = read_u16(data, 0)
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "SUBACK")
    codes = list(data[pos:])
    if level < MQTT5 and any(c > 2 and c != 0x80 for c in codes):
        raise malformed("invalid SUBACK return code [MQTT-3.9.3-2]")
    return SubAck(packet_id, codes, props)


def read_unsubscribe(flags: int, data: bytes, level: int) -> Unsubscribe:
    packet_id, pos = _read_packet_id(data)
    props: Properties = {}
    if level == MQTT5:
        props, pos = read_properties(data, pos, "UNSUBSCRIBE")
    topic_filters = []
    while pos < len(data):
        topic_filter, pos = read_string(data, pos)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise protocol_error("UNSUBSCRIBE without any topic filter [MQTT-3.10.3-2]")
    return Unsubscribe(packet_id, topic_filters, props)


def read_unsuback(flags: int, data: bytes, level: int) -> UnsubAck:
    packet_id, pos = read_u16(data, 0)
    if level < MQTT5:
        return _end(data, pos, UnsubAck(packet_id))
    props, pos = read_properties(data, pos, "UNSUBACK")
    return UnsubAck(packet_id, list(data[pos:]), props)


def _empty_reader(cls: type[PingReq | PingResp]) -> Callable[[int, bytes, int], Packet]:
    def read_empty(flags: int, data: bytes, level: int) -> Packet:
        return _end(data, 0, cls())

    return read_empty


def _reason_reader(cls: type[Disconnect | Auth], where: str) -> Callable[[int, bytes, int], Packet]:
    """DISCONNECT and AUTH: reason code and properties, both optional [3.14.2.1]."""

    def read_reason(flags: int, data: bytes, level: int) -> Packet:
        if level < MQTT5 or not data:
            return _end(data, 0, cls())
        code, pos = read_byte(data, 0)
        props: Properties = {}
        if pos < len(data):
            props, pos = read_properties(data, pos, where)
        return _end(data, pos, cls(code, props))

    return read_reason


Reader = Callable[[int, bytes, int], Packet]

READERS: dict[int, Reader] = {
    PacketType.CONNECT: read_connect,
    PacketType.CONNACK: read_connack,
    PacketType.PUBLISH: read_publish,
    PacketType.PUBACK: _ack_reader(PubAck, "PUBACK"),
    PacketType.PUBREC: _ack_reader(PubRec, "PUBREC"),
    PacketType.PUBREL: _ack_reader(PubRel, "PUBREL"),
    PacketType.PUBCOMP: _ack_reader(PubComp, "PUBCOMP"),
    PacketType.SUBSCRIBE: read_subscribe,
    PacketType.SUBACK: read_suback,
    PacketType.UNSUBSCRIBE: read_unsubscribe,
    PacketType.UNSUBACK: read_unsuback,
    PacketType.PINGREQ: _empty_reader(PingReq),
    PacketType.PINGRESP: _empty_reader(PingResp),
    PacketType.DISCONNECT: _reason_reader(Disconnect, "DISCONNECT"),
    PacketType.AUTH: _reason_reader(Auth, "AUTH"),
}

# Fixed-header flags each type must carry [MQTT-2.1.3-1]; PUBLISH's are checked by its reader.
REQUIRED_FLAGS: dict[int, int] = {
    t: (0x02 if t in (PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE) else 0)
    for t in PacketType
    if t is not PacketType.PUBLISH
}
