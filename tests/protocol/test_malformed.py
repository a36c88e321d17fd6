"""Malformed and forbidden input: a corpus with exact reason codes, then fuzzing.

Reason codes follow MQTT 5.0 (0x81 Malformed Packet, 0x82 Protocol Error). Where 5.0 names
the class of error the test asserts that one code; where the spec only says "MUST" without
naming a class, either 0x81 or 0x82 is accepted (`EITHER`). MQTT 3.x clients never see the
code (the broker just closes), but the codec reports the same one for every level.

Section numbers are MQTT 5.0 unless marked "3.1.1".
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    ConnAck,
    Connect,
    Decoder,
    LocalProtocolError,
    Property,
    ProtocolError,
    PubAck,
    Publish,
    RemoteProtocolError,
    SubAck,
    Subscribe,
    Subscription,
    UnsupportedProtocolVersion,
    Will,
    encode,
)

from .helpers import (
    CONNECT_BYTES,
    cut,
    encode_all,
    expect_error,
    feed_bytewise,
    feed_whole,
    new_decoder,
)
from .strategies import FAST, LEVELS, stream_packets

MALFORMED = 0x81
PROTOCOL = 0x82
EITHER = {MALFORMED, PROTOCOL}
TOO_LARGE = 0x95
UNSUPPORTED = 0x84


def case(role: str, level: int, data: bytes, codes, name: str):
    """`role` "connect" is a fresh server decoder (no CONNECT read yet)."""
    return pytest.param(role, level, data, codes, id=f"{name}-v{level}")


CORPUS = [
    # -- fixed header ----------------------------------------------------------------------
    # Remaining Length is a Variable Byte Integer of at most four bytes [1.5.5], [2.1.4];
    # the decoder can tell as soon as the fourth byte has its continuation bit set.
    case("server", 4, b"\x30\xff\xff\xff\xff\x01", MALFORMED, "varint-5-bytes"),
    case("server", 5, b"\x30\x80\x80\x80\x80", MALFORMED, "varint-4-continuations"),
    case("connect", 4, b"\x10\xff\xff\xff\xff\x01", MALFORMED, "varint-5-bytes-first"),
    # Packet type 0 is "Reserved, Forbidden" [2.1.2, table 2-1].
    case("server", 4, b"\x00\x00", EITHER, "type-0"),
    case("connect", 5, b"\x00\x00", EITHER, "type-0-first"),
    case("client", 5, b"\x00\x00", EITHER, "type-0-client"),
    # Type 15 is reserved before MQTT 5 (3.1.1 [2.2.1, table 2.1]).
    case("server", 4, b"\xf0\x00", EITHER, "auth-in-3.1.1"),
    case("client", 3, b"\xf0\x00", EITHER, "auth-in-3.1"),
    # -- remaining length does not match the fields -----------------------------------------
    # 3.1.1 PUBACK has Remaining Length 2 [3.4.1]; a packet that "cannot be parsed according
    # to this specification" is malformed [1.2].
    case("server", 4, b"\x40\x03\x00\x01\x00", MALFORMED, "puback-too-long"),
    case("server", 4, b"\x40\x01\x00", MALFORMED, "puback-truncated-id"),
    case("server", 5, b"\x40\x01\x00", MALFORMED, "puback-truncated-id"),
    # PINGREQ/PINGRESP have no variable header or payload [3.12], [3.13].
    case("server", 4, b"\xc0\x01\x00", MALFORMED, "pingreq-with-body"),
    case("client", 5, b"\xd0\x01\x00", MALFORMED, "pingresp-with-body"),
    # 3.1.1 DISCONNECT has no variable header or payload (3.1.1 [3.14]).
    case("server", 4, b"\xe0\x01\x00", MALFORMED, "disconnect-with-body"),
    # 3.1.1 CONNACK has Remaining Length 2 (3.1.1 [3.2.1]).
    case("client", 4, b"\x20\x03\x00\x00\x00", MALFORMED, "connack-too-long"),
    case("client", 4, b"\x20\x01\x00", MALFORMED, "connack-truncated"),
    # 3.1.1 UNSUBACK "has no payload" (3.1.1 [3.11.3]).
    case("client", 4, b"\xb0\x03\x00\x01\x00", MALFORMED, "unsuback-with-payload"),
    # Property Length runs past the packet [2.2.2.1].
    case("server", 5, b"\x40\x05\x00\x01\x00\x05\x1f", MALFORMED, "props-past-end"),
    case("server", 5, b"\xe0\x02\x00\x03", MALFORMED, "disconnect-props-past-end"),
    # Bytes after the last field of a PUBACK [3.4.2].
    case("server", 5, b"\x40\x05\x00\x01\x00\x00\xff", MALFORMED, "puback-trailing-byte"),
    # -- truncated fields inside a complete packet ------------------------------------------
    # A UTF-8 string's 2-byte length prefix promises more bytes than the packet has [1.5.4].
    case("server", 4, b"\x30\x04\x00\x0aab", MALFORMED, "topic-past-end"),
    # QoS 1 PUBLISH without its Packet Identifier [3.3.2.2].
    case("server", 4, b"\x32\x03\x00\x01t", MALFORMED, "publish-missing-id"),
    # MQTT 5 PUBLISH must carry a Property Length, even if 0 [3.3.2.3].
    case("server", 5, b"\x30\x03\x00\x01t", MALFORMED, "publish-missing-props"),
    # Topic Filter without its options byte [3.8.3].
    case("server", 4, b"\x82\x05\x00\x01\x00\x01a", MALFORMED, "subscribe-missing-options"),
    # CONNECT missing the Client Identifier, which is always present [MQTT-3.1.3-3].
    case("connect", 4, b"\x10\x0a\x00\x04MQTT\x04\x02\x00\x3c", MALFORMED, "connect-no-client-id"),
    # User Name flag set but no User Name [MQTT-3.1.2-17].
    case(
        "connect",
        4,
        b"\x10\x0d\x00\x04MQTT\x04\x82\x00\x3c\x00\x01c",
        MALFORMED,
        "connect-missing-username",
    ),
    # Will flag set but no Will Topic [MQTT-3.1.2-9].
    case(
        "connect", 4, b"\x10\x0d\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c", MALFORMED, "connect-no-will"
    ),
    case(
        "connect",
        4,
        b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x01cX",
        MALFORMED,
        "connect-trailing-byte",
    ),
    # User Property with a name and no value [1.5.7]: a UTF-8 String Pair is two strings.
    case(
        "server", 5, b"\x40\x08\x00\x01\x00\x04\x26\x00\x01k", MALFORMED, "user-property-no-value"
    ),
    # A Four Byte Integer property with two bytes left [1.5.3].
    case("server", 5, b"\xe0\x05\x00\x03\x11\x00\x00", MALFORMED, "truncated-u32-property"),
    # -- UTF-8 ------------------------------------------------------------------------------
    # Ill-formed UTF-8 is a Malformed Packet [MQTT-1.5.4-1] (3.1.1 [MQTT-1.5.3-1]).
    case("server", 4, b"\x30\x04\x00\x02\xc3\x28", MALFORMED, "utf8-bad-continuation"),
    case("server", 4, b"\x30\x04\x00\x02\xc0\xaf", MALFORMED, "utf8-overlong"),
    case("server", 5, b"\x30\x05\x00\x02\xe2\x82\x00", MALFORMED, "utf8-truncated-sequence"),
    case("server", 4, b"\x30\x06\x00\x04\xf4\x90\x80\x80", MALFORMED, "utf8-above-10ffff"),
    # Encoded surrogates U+D800..U+DFFF MUST NOT appear [MQTT-1.5.4-1].
    case("server", 4, b"\x30\x05\x00\x03\xed\xa0\x80", MALFORMED, "utf8-surrogate"),
    case("server", 5, b"\x30\x06\x00\x03\xed\xbf\xbf\x00", MALFORMED, "utf8-surrogate"),
    # U+0000 MUST NOT appear [MQTT-1.5.4-2] (3.1.1 [MQTT-1.5.3-2]).
    case("server", 4, b"\x30\x03\x00\x01\x00", MALFORMED, "utf8-nul-in-topic"),
    case("server", 3, b"\x30\x05\x00\x03a\x00b", MALFORMED, "utf8-nul-in-topic"),
    case(
        "connect",
        4,
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01\xff",
        MALFORMED,
        "utf8-bad-client-id",
    ),
    case(
        "server",
        5,
        b"\x40\x0b\x00\x01\x00\x07\x26\x00\x01k\x00\x01\x00",
        MALFORMED,
        "utf8-nul-in-user-property",
    ),
    case(
        "server",
        5,
        b"\x40\x08\x00\x01\x00\x04\x1f\x00\x01\xff",
        MALFORMED,
        "utf8-bad-reason-string",
    ),
    case("server", 4, b"\x82\x06\x00\x01\x00\x01\xff\x00", MALFORMED, "utf8-bad-topic-filter"),
    case("server", 4, b"\xa2\x05\x00\x01\x00\x01\xff", MALFORMED, "utf8-bad-unsubscribe"),
    # -- CONNECT ----------------------------------------------------------------------------
    # "The Server MUST validate that the reserved flag in the CONNECT packet is set to 0
    # [MQTT-3.1.2-3]. If the reserved flag is not 0 it is a Malformed Packet."
    case(
        "connect",
        4,
        b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01c",
        MALFORMED,
        "connect-reserved",
    ),
    case(
        "connect",
        5,
        b"\x10\x0e\x00\x04MQTT\x05\x03\x00\x3c\x00\x00\x01c",
        MALFORMED,
        "connect-reserved",
    ),
    # Will QoS 3: "A value of 3 (0x03) is a Malformed Packet" [3.1.2.6], [MQTT-3.1.2-12].
    case(
        "connect",
        4,
        b"\x10\x12\x00\x04MQTT\x04\x1e\x00\x3c\x00\x01c\x00\x01w\x00\x00",
        MALFORMED,
        "will-qos-3",
    ),
    # Will QoS / Will Retain set without the Will flag [MQTT-3.1.2-11], [MQTT-3.1.2-13]
    # ("MUST be set to 0"; 5.0 does not name the error class).
    case(
        "connect", 4, b"\x10\x0d\x00\x04MQTT\x04\x0a\x00\x3c\x00\x01c", EITHER, "will-qos-no-will"
    ),
    case(
        "connect",
        5,
        b"\x10\x0e\x00\x04MQTT\x05\x22\x00\x3c\x00\x00\x01c",
        EITHER,
        "will-retain-no-will",
    ),
    # 3.1.1: "If the User Name Flag is set to 0, the Password Flag MUST be set to 0"
    # (3.1.1 [MQTT-3.1.2-22]); MQTT 5 dropped the rule.
    case(
        "connect",
        4,
        b"\x10\x10\x00\x04MQTT\x04\x42\x00\x3c\x00\x01c\x00\x01p",
        EITHER,
        "password-without-username",
    ),
    # A protocol name that is neither "MQTT" nor "MQIsdp": the Server "MAY disconnect"
    # [MQTT-3.1.2-1]; it is not an MQTT client, so no CONNACK is owed.
    case(
        "connect", 4, b"\x10\x0d\x00\x04MQTX\x04\x02\x00\x3c\x00\x01c", EITHER, "protocol-name-MQTX"
    ),
    case(
        "connect", 4, b"\x10\x0d\x00\x04HTTP\x04\x02\x00\x3c\x00\x01c", EITHER, "protocol-name-HTTP"
    ),
    # [MQTT-3.1.0-1]: the first packet from the Client MUST be CONNECT.
    case("connect", 4, b"\xc0\x00", PROTOCOL, "pingreq-before-connect"),
    case("connect", 5, b"\x30\x04\x00\x01t\x00", PROTOCOL, "publish-before-connect"),
    # [MQTT-3.1.0-2]: a second CONNECT is a Protocol Error.
    case("server", 3, CONNECT_BYTES[3], PROTOCOL, "second-connect"),
    case("server", 4, CONNECT_BYTES[4], PROTOCOL, "second-connect"),
    case("server", 5, CONNECT_BYTES[5], PROTOCOL, "second-connect"),
    # -- PUBLISH ----------------------------------------------------------------------------
    # "If a Server or Client receives a PUBLISH packet which has both QoS bits set to 1 it
    # is a Malformed Packet" [MQTT-3.3.1-4].
    case("server", 4, b"\x36\x05\x00\x01t\x00\x01", MALFORMED, "publish-qos-3"),
    case("client", 5, b"\x36\x06\x00\x01t\x00\x01\x00", MALFORMED, "publish-qos-3"),
    # QoS > 0 needs a non-zero Packet Identifier [MQTT-2.2.1-3] (3.1.1 [MQTT-2.3.1-1]).
    case("server", 4, b"\x32\x05\x00\x01t\x00\x00", EITHER, "publish-id-0"),
    case("client", 5, b"\x34\x06\x00\x01t\x00\x00\x00", EITHER, "publish-id-0"),
    # "The DUP flag MUST be set to 0 for all QoS 0 messages" [MQTT-3.3.1-2].
    case("server", 4, b"\x38\x03\x00\x01t", EITHER, "publish-dup-qos-0"),
    # -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------
    # "A SUBSCRIBE packet with no Payload is a Protocol Error" [MQTT-3.8.3-2];
    # 3.1.1 calls it a protocol violation (3.1.1 [MQTT-3.8.3-3]).
    case("server", 5, b"\x82\x03\x00\x01\x00", PROTOCOL, "subscribe-no-filters"),
    case("server", 4, b"\x82\x02\x00\x01", EITHER, "subscribe-no-filters"),
    # "An UNSUBSCRIBE packet with no Payload is a Protocol Error" [MQTT-3.10.3-2].
    case("server", 5, b"\xa2\x03\x00\x01\x00", PROTOCOL, "unsubscribe-no-filters"),
    case("server", 4, b"\xa2\x02\x00\x01", EITHER, "unsubscribe-no-filters"),
    # Reserved option bits 6-7: "MUST treat a SUBSCRIBE packet as malformed" [MQTT-3.8.3-5].
    case("server", 5, b"\x82\x07\x00\x01\x00\x00\x01a\x40", MALFORMED, "subscribe-reserved-bit6"),
    case("server", 5, b"\x82\x07\x00\x01\x00\x00\x01a\x80", MALFORMED, "subscribe-reserved-bit7"),
    # 3.1.1: bits 2-7 reserved, and QoS must be 0..2: malformed (3.1.1 [MQTT-3-8.3-4]).
    case("server", 4, b"\x82\x06\x00\x01\x00\x01a\x04", MALFORMED, "subscribe-reserved-bit2"),
    case("server", 4, b"\x82\x06\x00\x01\x00\x01a\x03", MALFORMED, "subscribe-qos-3"),
    # 5.0: "It is a Protocol Error if the Maximum QoS field has the value 3" [3.8.3.1].
    case("server", 5, b"\x82\x07\x00\x01\x00\x00\x01a\x03", PROTOCOL, "subscribe-qos-3"),
    # "It is a Protocol Error to send a Retain Handling value of 3" [3.8.3.1].
    case(
        "server", 5, b"\x82\x07\x00\x01\x00\x00\x01a\x30", PROTOCOL, "subscribe-retain-handling-3"
    ),
    # Non-zero Packet Identifier [MQTT-2.2.1-3] (3.1.1 [MQTT-2.3.1-1]).
    case("server", 4, b"\x82\x06\x00\x00\x00\x01a\x00", EITHER, "subscribe-id-0"),
    case("server", 4, b"\xa2\x05\x00\x00\x00\x01a", EITHER, "unsubscribe-id-0"),
    # "It is a Protocol Error if the Subscription Identifier has a value of 0", and to
    # include it more than once in SUBSCRIBE [3.8.2.1.2].
    case("server", 5, b"\x82\x09\x00\x01\x02\x0b\x00\x00\x01a\x00", PROTOCOL, "subscription-id-0"),
    case(
        "server",
        5,
        b"\x82\x0b\x00\x01\x04\x0b\x01\x0b\x02\x00\x01a\x00",
        PROTOCOL,
        "subscription-id-twice",
    ),
    # The identifier is a Variable Byte Integer: five bytes are malformed [1.5.5].
    case(
        "server",
        5,
        b"\x82\x0d\x00\x01\x06\x0b\xff\xff\xff\xff\x01\x00\x01a\x00",
        MALFORMED,
        "subscription-id-5-bytes",
    ),
    # -- properties (MQTT 5) ----------------------------------------------------------------
    # "A Control Packet which contains an Identifier which is not valid for its packet type,
    # or contains a value not of the specified data type, is a Malformed Packet" [2.2.2.2].
    case("server", 5, b"\x40\x06\x00\x01\x00\x02\x05\x00", MALFORMED, "unknown-property-0x05"),
    case("server", 5, b"\x40\x06\x00\x01\x00\x02\x00\x00", MALFORMED, "unknown-property-0x00"),
    case("client", 5, b"\xe0\x03\x00\x01\x7f", MALFORMED, "unknown-property-0x7f"),
    case("server", 5, b"\x40\x07\x00\x01\x00\x03\x23\x00\x01", MALFORMED, "topic-alias-in-puback"),
    case(
        "server",
        5,
        b"\x30\x09\x00\x01t\x05\x11\x00\x00\x00\x01",
        MALFORMED,
        "session-expiry-in-publish",
    ),
    case(
        "connect",
        5,
        b"\x10\x13\x00\x04MQTT\x05\x02\x00\x3c\x05\x18\x00\x00\x00\x01\x00\x01c",
        MALFORMED,
        "will-delay-in-connect-props",
    ),
    case("client", 5, b"\x20\x05\x00\x00\x02\x0b\x01", MALFORMED, "subscription-id-in-connack"),
    # Property Length is a Variable Byte Integer [2.2.2.1].
    case("server", 5, b"\x40\x08\x00\x01\x00\x80\x80\x80\x80\x01", MALFORMED, "props-len-5-bytes"),
    # Duplicates: "It is a Protocol Error to include the Session Expiry Interval more than
    # once" [3.1.2.11.2]; same for the Reason String [3.4.2.2.2].
    case(
        "connect",
        5,
        b"\x10\x18\x00\x04MQTT\x05\x02\x00\x3c\x0a\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02\x00\x01c",
        PROTOCOL,
        "duplicate-session-expiry",
    ),
    case(
        "server",
        5,
        b"\x40\x0c\x00\x01\x00\x08\x1f\x00\x01a\x1f\x00\x01b",
        PROTOCOL,
        "duplicate-reason-string",
    ),
    # Out-of-range values, each "a Protocol Error" in its section:
    # Receive Maximum 0 [3.1.2.11.3]; Maximum Packet Size 0 [3.1.2.11.4];
    # Request Problem Information 2 [3.1.2.11.7]; Request Response Information 2
    # [3.1.2.11.6]; Maximum QoS 2 [3.2.2.3.4]; Retain Available 2 [3.2.2.3.5];
    # Wildcard Subscription Available 2 [3.2.2.3.11].
    case(
        "connect",
        5,
        b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x03\x21\x00\x00\x00\x01c",
        PROTOCOL,
        "receive-maximum-0",
    ),
    case(
        "connect",
        5,
        b"\x10\x13\x00\x04MQTT\x05\x02\x00\x3c\x05\x27\x00\x00\x00\x00\x00\x01c",
        PROTOCOL,
        "maximum-packet-size-0",
    ),
    case(
        "connect",
        5,
        b"\x10\x10\x00\x04MQTT\x05\x02\x00\x3c\x02\x17\x02\x00\x01c",
        PROTOCOL,
        "request-problem-info-2",
    ),
    case(
        "connect",
        5,
        b"\x10\x10\x00\x04MQTT\x05\x02\x00\x3c\x02\x19\x02\x00\x01c",
        PROTOCOL,
        "request-response-info-2",
    ),
    case("client", 5, b"\x20\x05\x00\x00\x02\x24\x02", PROTOCOL, "maximum-qos-2"),
    case("client", 5, b"\x20\x05\x00\x00\x02\x25\x02", PROTOCOL, "retain-available-2"),
    case("client", 5, b"\x20\x05\x00\x00\x02\x28\x02", PROTOCOL, "wildcard-available-2"),
    # Payload Format Indicator is 0 or 1 [3.3.2.3.2]; 5.0 does not name the error class.
    case("server", 5, b"\x30\x06\x00\x01t\x02\x01\x02", EITHER, "payload-format-2"),
    # "It is a Protocol Error to include Authentication Data if there is no Authentication
    # Method" [3.1.2.11.10].
    case(
        "connect",
        5,
        b"\x10\x12\x00\x04MQTT\x05\x02\x00\x3c\x04\x16\x00\x01x\x00\x01c",
        PROTOCOL,
        "auth-data-without-method",
    ),
    # -- packets sent the wrong way [2.1.2, table 2-1 "Direction of flow"] -------------------
    case("server", 4, b"\x20\x02\x00\x00", PROTOCOL, "server-gets-connack"),
    case("server", 5, b"\x20\x03\x00\x00\x00", PROTOCOL, "server-gets-connack"),
    case("server", 4, b"\x90\x03\x00\x01\x00", PROTOCOL, "server-gets-suback"),
    case("server", 5, b"\x90\x04\x00\x01\x00\x00", PROTOCOL, "server-gets-suback"),
    case("server", 4, b"\xb0\x02\x00\x01", PROTOCOL, "server-gets-unsuback"),
    case("server", 5, b"\xb0\x04\x00\x01\x00\x00", PROTOCOL, "server-gets-unsuback"),
    case("server", 3, b"\xd0\x00", PROTOCOL, "server-gets-pingresp"),
    case("server", 5, b"\xd0\x00", PROTOCOL, "server-gets-pingresp"),
    case("client", 4, CONNECT_BYTES[4], PROTOCOL, "client-gets-connect"),
    case("client", 5, CONNECT_BYTES[5], PROTOCOL, "client-gets-connect"),
    case("client", 4, b"\x82\x06\x00\x01\x00\x01a\x00", PROTOCOL, "client-gets-subscribe"),
    case("client", 5, b"\x82\x07\x00\x01\x00\x00\x01a\x00", PROTOCOL, "client-gets-subscribe"),
    case("client", 4, b"\xa2\x05\x00\x01\x00\x01a", PROTOCOL, "client-gets-unsubscribe"),
    case("client", 3, b"\xc0\x00", PROTOCOL, "client-gets-pingreq"),
    case("client", 5, b"\xc0\x00", PROTOCOL, "client-gets-pingreq"),
    # -- server-to-client oddities --------------------------------------------------------------
    # CONNACK "Bits 7-1 are reserved and MUST be set to 0" [3.2.2.1].
    case("client", 4, b"\x20\x02\x02\x00", EITHER, "connack-reserved-flags"),
    # 3.1.1: "SUBACK return codes other than 0x00, 0x01, 0x02 and 0x80 are reserved and
    # MUST NOT be used" (3.1.1 [MQTT-3.9.3-2]).
    case("client", 4, b"\x90\x03\x00\x01\x03", EITHER, "suback-return-code-3"),
]

# Reserved fixed-header flags: "MUST be set to the value listed ... If invalid flags are
# received it is a Malformed Packet" [MQTT-2.1.3-1] (3.1.1 [MQTT-2.2.2-1/2]). PUBREL,
# SUBSCRIBE and UNSUBSCRIBE must carry 0b0010 [MQTT-3.6.1-1], [MQTT-3.8.1-1],
# [MQTT-3.10.1-1]; the others 0b0000.
_BAD_FLAGS = [
    ("server", b"\x42\x02\x00\x01", "puback"),
    ("server", b"\x58\x02\x00\x01", "pubrec"),
    ("server", b"\x60\x02\x00\x01", "pubrel-0000"),
    ("server", b"\x63\x02\x00\x01", "pubrel-0011"),
    ("server", b"\x71\x02\x00\x01", "pubcomp"),
    ("server", b"\x80\x06\x00\x01\x00\x01a\x00", "subscribe-0000"),
    ("server", b"\x8a\x06\x00\x01\x00\x01a\x00", "subscribe-1010"),
    ("server", b"\xa0\x05\x00\x01\x00\x01a", "unsubscribe"),
    ("server", b"\xc1\x00", "pingreq"),
    ("server", b"\xe8\x00", "disconnect"),
    ("client", b"\x24\x02\x00\x00", "connack"),
    ("client", b"\x92\x03\x00\x01\x00", "suback"),
    ("client", b"\xb2\x02\x00\x01", "unsuback"),
    ("client", b"\xd1\x00", "pingresp"),
]
for _level in (4, 5):
    CORPUS += [
        case(role, _level, data, MALFORMED, f"flags-{name}")
        for role, data, name in _BAD_FLAGS
        # Bodies above are 3.1.1 ones; in 5.0 SUBSCRIBE/UNSUBSCRIBE/CONNACK/SUBACK/UNSUBACK
        # also need a Property Length, but the flags are checked first either way.
    ]
CORPUS += [
    case("connect", 4, b"\x11" + CONNECT_BYTES[4][1:], MALFORMED, "flags-connect"),
    case("connect", 5, b"\x18" + CONNECT_BYTES[5][1:], MALFORMED, "flags-connect"),
    case("server", 5, b"\xf1\x00", MALFORMED, "flags-auth"),
]


def _decoder(role: str, level: int, **kwargs) -> Decoder:
    return Decoder("server", **kwargs) if role == "connect" else new_decoder(role, level, **kwargs)


@pytest.mark.parametrize(("role", "level", "data", "codes"), CORPUS)
def test_corpus_whole(role, level, data, codes):
    decoder = _decoder(role, level)
    error = expect_error(decoder, data, codes)
    assert isinstance(error, RemoteProtocolError)
    # The decoder stays broken, even if good bytes follow.
    with pytest.raises(ProtocolError):
        decoder.next_packet()
    decoder.receive_data(b"\xc0\x00")
    with pytest.raises(ProtocolError):
        decoder.next_packet()


@pytest.mark.parametrize(("role", "level", "data", "codes"), CORPUS)
def test_corpus_bytewise(role, level, data, codes):
    """The error surfaces by the packet's last byte, whatever the chunking."""
    decoder = _decoder(role, level)
    codes = {codes} if isinstance(codes, int) else codes
    with pytest.raises(ProtocolError) as info:
        feed_bytewise(decoder, data)
    assert info.value.reason_code in codes


# -- oversized packets: 0x95 as soon as the fixed header is read ---------------------------
# "If a Server receives a packet whose size exceeds this limit, this is a Protocol Error,
# the Server uses DISCONNECT with Reason Code 0x95 (Packet too large)" [3.2.2.3.6]. The size
# is "the total number of bytes in an MQTT Control Packet" [3.1.2.11.4].


@pytest.mark.parametrize("level", LEVELS)
def test_oversized_publish_is_refused_before_its_body(level):
    decoder = new_decoder("server", level, max_packet_size=100)
    expect_error(decoder, b"\x30\xe8\x07", TOO_LARGE)  # remaining length 1000, no body yet


def test_oversized_connect_is_refused_before_its_body():
    expect_error(Decoder("server", max_packet_size=100), b"\x10\xe8\x07", TOO_LARGE)


def test_oversized_for_client():
    expect_error(new_decoder("client", 5, max_packet_size=100), b"\x30\xff\xff\x7f", TOO_LARGE)


def test_packet_size_limit_is_inclusive():
    # Publish("t", payload) at 3.1.1: 1 type byte + 1 length byte + 3 topic bytes + payload.
    decoder = new_decoder("server", 4, max_packet_size=100)
    fits = Publish("t", bytes(95))
    assert len(encode(fits, 4)) == 100
    assert feed_whole(decoder, encode(fits, 4)) == [fits]
    expect_error(decoder, encode(Publish("t", bytes(96)), 4), TOO_LARGE)


# -- unsupported protocol level: 0x84, and the server can still answer -----------------------


@pytest.mark.parametrize("level_byte", [0, 1, 2, 6, 0x84, 255])
def test_unsupported_protocol_level(level_byte):
    # "The Server MAY respond to the CONNECT packet with a CONNACK packet with Reason Code
    # of 0x84 (Unsupported Protocol Version)" [MQTT-3.1.2-2] (3.1.1: return code 0x01).
    data = b"\x10\x0d\x00\x04MQTT" + bytes((level_byte,)) + b"\x02\x00\x3c\x00\x01c"
    error = expect_error(Decoder("server"), data, UNSUPPORTED)
    assert isinstance(error, UnsupportedProtocolVersion)
    assert error.protocol_level == level_byte


def test_unsupported_protocol_level_in_pieces():
    decoder = Decoder("server")
    with pytest.raises(UnsupportedProtocolVersion):
        feed_bytewise(decoder, b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01c")


# -- encoding invalid packets: LocalProtocolError --------------------------------------------

BAD_PACKETS = [
    pytest.param(Publish("t", qos=3, packet_id=1), id="publish-qos-3"),
    pytest.param(Publish("t", qos=1), id="publish-qos-1-without-id"),
    pytest.param(Publish("t", qos=1, packet_id=0x10000), id="packet-id-too-big"),
    pytest.param(PubAck(-1), id="negative-packet-id"),
    pytest.param(Publish("\ud800"), id="surrogate-in-topic"),
    pytest.param(Publish("a\x00b"), id="nul-in-topic"),  # [MQTT-1.5.4-2]
    pytest.param(Publish("t" * 65536), id="topic-too-long"),  # [1.5.4] max 65,535 bytes
    pytest.param(Subscribe(1, [Subscription("a", qos=3)]), id="subscription-qos-3"),
    pytest.param(
        Connect("c", protocol_level=4, will=Will("w", b"", qos=3)),
        id="will-qos-3",
    ),
    pytest.param(SubAck(1, [256]), id="reason-code-too-big"),
]


@pytest.mark.parametrize("packet", BAD_PACKETS)
def test_encode_rejects_invalid_packets(packet):
    with pytest.raises(LocalProtocolError):
        encode(packet, 4)


MQTT5_BAD_PACKETS = [
    # A property the packet may not carry [2.2.2.2].
    pytest.param(Publish("t", properties={Property.SESSION_EXPIRY_INTERVAL: 1}), id="wrong-prop"),
    pytest.param(PubAck(1, properties={0x05: 1}), id="unknown-prop"),
    pytest.param(ConnAck(properties={Property.MAXIMUM_PACKET_SIZE: 2**32}), id="u32-overflow"),
]


@pytest.mark.parametrize("packet", MQTT5_BAD_PACKETS)
def test_encode_rejects_invalid_properties(packet):
    with pytest.raises(LocalProtocolError):
        encode(packet, 5)


# -- fuzzing: nothing but ProtocolError, ever ----------------------------------------------


def _decode_or_error(decoder: Decoder, chunks: list[bytes]) -> tuple[list, int | None]:
    """Packets decoded and the reason code of the error that ended the stream, if any."""
    out: list = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (packet := decoder.next_packet()) is not None:
                out.append(packet)
                assert len(out) <= sum(map(len, chunks)), "packets out of nothing"
    except ProtocolError as exc:  # anything else fails the test
        return out, exc.reason_code
    return out, None


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.binary(max_size=300))
def test_fuzz_server_after_connect(level, data):
    _decode_or_error(new_decoder("server", level), [data])


@FAST
@given(data=st.binary(max_size=300))
def test_fuzz_server_first_packet(data):
    _decode_or_error(Decoder("server"), [data])


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.binary(max_size=300))
def test_fuzz_client(level, data):
    _decode_or_error(new_decoder("client", level), [data])


@FAST
@given(
    head=st.sampled_from([b"\x10", b"\x10\x20", b"\x10\x2a\x00\x04MQTT\x05"]),
    data=st.binary(max_size=60),
)
def test_fuzz_connect_bodies(head, data):
    # A plausible CONNECT start followed by noise: exercises the flag and property paths.
    _decode_or_error(Decoder("server"), [head + data])


@st.composite
def _mutated_streams(draw):
    """A valid stream of packets with a few bytes flipped, dropped or inserted."""
    role = draw(st.sampled_from(["server", "client"]))
    level = draw(st.sampled_from(LEVELS))
    wire = bytearray(encode_all(draw(st.lists(stream_packets(role, level), max_size=4)), level))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "drop", "insert"]))
        pos = draw(st.integers(0, len(wire)))
        if op == "insert" or not wire:
            wire[pos:pos] = bytes([draw(st.integers(0, 255))])
        elif op == "drop":
            del wire[min(pos, len(wire) - 1)]
        else:
            wire[min(pos, len(wire) - 1)] ^= 1 << draw(st.integers(0, 7))
    return role, level, bytes(wire)


@FAST
@given(stream=_mutated_streams(), data=st.data())
def test_fuzz_mutated_streams_any_chunking(stream, data):
    """Only ProtocolError, and the outcome does not depend on how the bytes arrive."""
    role, level, wire = stream
    whole = _decode_or_error(new_decoder(role, level), [wire])
    offsets = data.draw(st.lists(st.integers(0, len(wire)), max_size=8))
    assert _decode_or_error(new_decoder(role, level), cut(wire, offsets)) == whole
    bytewise = [wire[i : i + 1] for i in range(len(wire))]
    assert _decode_or_error(new_decoder(role, level), bytewise) == whole


def test_error_is_sticky_without_new_data():
    decoder = new_decoder("server", 4)
    decoder.receive_data(b"\x36\x03\x00\x01t")
    with pytest.raises(ProtocolError) as first:
        decoder.next_packet()
    with pytest.raises(ProtocolError) as second:
        decoder.next_packet()
    assert second.value.reason_code == first.value.reason_code
