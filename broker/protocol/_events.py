# One slotted dataclass per MQTT control packet.
#
# Strategy: packets are plain data. The same classes serve MQTT 3.1, 3.1.1 and 5.0; fields
# a version lacks keep their defaults (reason code 0, no properties) and are neither read
# nor written for that version. Properties are a dict keyed by `Property`; the two
# properties that may repeat are lists: USER_PROPERTY (list of (name, value) pairs, order
# kept) and SUBSCRIPTION_IDENTIFIER (list of ints, PUBLISH only).
#
# The classes are not frozen: the broker rewrites a PUBLISH's packet id, dup flag and
# properties on the way out, and a frozen dataclass would cost a copy per subscriber.
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

MQTT5 = 5  # the protocol level of an MQTT 5.0 CONNECT (3.1 is 3, 3.1.1 is 4)


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


Properties = dict[int, Any]


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = 4  # 3 = MQTT 3.1, 4 = 3.1.1, 5 = 5.0
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)
    # Set from the wire: the 3.1 name is "MQIsdp", later versions use "MQTT".
    protocol_name: str = ""


@dataclass(slots=True)
class ConnAck:
    reason_code: int = 0  # MQTT 3.x: the connect return code (0..5)
    session_present: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)
    # Set by the decoder: the packet's own bytes, reusable as the outbound encoding.
    raw: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    # MQTT 5 subscription options [MQTT-3.8.3.1]; zero on older versions.
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reason_codes: list[int]  # granted QoS 0..2 or a failure code (0x80 and up)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # MQTT 5 only
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
