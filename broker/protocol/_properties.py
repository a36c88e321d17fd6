# MQTT 5.0 properties, section 2.2.2.2 (table 2-4): identifier, data type, and the packets
# each may appear in. "WILL" stands for the will properties inside CONNECT's payload.
from __future__ import annotations

from enum import Enum, IntEnum


class PropertyType(Enum):
    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VAR_INT = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


class Property(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


_T = PropertyType
_ACKS = ("PUBACK", "PUBREC", "PUBREL", "PUBCOMP")

# Property -> (type, packets it may appear in). Keyed by the Property members, looked up
# with the plain ints that key `Properties` (an IntEnum hashes as its value).
PROPERTY_SPEC: dict[int, tuple[PropertyType, frozenset[str]]] = {
    p: (t, frozenset(where))
    for p, t, where in [
        (Property.PAYLOAD_FORMAT_INDICATOR, _T.BYTE, ("PUBLISH", "WILL")),
        (Property.MESSAGE_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, ("PUBLISH", "WILL")),
        (Property.CONTENT_TYPE, _T.UTF8, ("PUBLISH", "WILL")),
        (Property.RESPONSE_TOPIC, _T.UTF8, ("PUBLISH", "WILL")),
        (Property.CORRELATION_DATA, _T.BINARY, ("PUBLISH", "WILL")),
        (Property.SUBSCRIPTION_IDENTIFIER, _T.VAR_INT, ("PUBLISH", "SUBSCRIBE")),
        (Property.SESSION_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, ("CONNECT", "CONNACK", "DISCONNECT")),
        (Property.ASSIGNED_CLIENT_IDENTIFIER, _T.UTF8, ("CONNACK",)),
        (Property.SERVER_KEEP_ALIVE, _T.TWO_BYTE_INT, ("CONNACK",)),
        (Property.AUTHENTICATION_METHOD, _T.UTF8, ("CONNECT", "CONNACK", "AUTH")),
        (Property.AUTHENTICATION_DATA, _T.BINARY, ("CONNECT", "CONNACK", "AUTH")),
        (Property.REQUEST_PROBLEM_INFORMATION, _T.BYTE, ("CONNECT",)),
        (Property.WILL_DELAY_INTERVAL, _T.FOUR_BYTE_INT, ("WILL",)),
        (Property.REQUEST_RESPONSE_INFORMATION, _T.BYTE, ("CONNECT",)),
        (Property.RESPONSE_INFORMATION, _T.UTF8, ("CONNACK",)),
        (Property.SERVER_REFERENCE, _T.UTF8, ("CONNACK", "DISCONNECT")),
        (
            Property.REASON_STRING,
            _T.UTF8,
            ("CONNACK", *_ACKS, "SUBACK", "UNSUBACK", "DISCONNECT", "AUTH"),
        ),
        (Property.RECEIVE_MAXIMUM, _T.TWO_BYTE_INT, ("CONNECT", "CONNACK")),
        (Property.TOPIC_ALIAS_MAXIMUM, _T.TWO_BYTE_INT, ("CONNECT", "CONNACK")),
        (Property.TOPIC_ALIAS, _T.TWO_BYTE_INT, ("PUBLISH",)),
        (Property.MAXIMUM_QOS, _T.BYTE, ("CONNACK",)),
        (Property.RETAIN_AVAILABLE, _T.BYTE, ("CONNACK",)),
        (
            Property.USER_PROPERTY,
            _T.UTF8_PAIR,
            (
                "CONNECT",
                "CONNACK",
                "PUBLISH",
                "WILL",
                *_ACKS,
                "SUBSCRIBE",
                "SUBACK",
                "UNSUBSCRIBE",
                "UNSUBACK",
                "DISCONNECT",
                "AUTH",
            ),
        ),
        (Property.MAXIMUM_PACKET_SIZE, _T.FOUR_BYTE_INT, ("CONNECT", "CONNACK")),
        (Property.WILDCARD_SUBSCRIPTION_AVAILABLE, _T.BYTE, ("CONNACK",)),
        (Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE, _T.BYTE, ("CONNACK",)),
        (Property.SHARED_SUBSCRIPTION_AVAILABLE, _T.BYTE, ("CONNACK",)),
    ]
}

# Properties that may appear more than once; they are held as lists.
REPEATABLE = frozenset({Property.USER_PROPERTY, Property.SUBSCRIPTION_IDENTIFIER})
