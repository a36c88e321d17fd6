# Hypothesis strategies for valid MQTT packets, per packet kind and protocol level.
#
# Strategy: `packets(kind, level)` draws one packet that a well-behaved peer could send at
# that level, with every field set the way the decoder will read it back (protocol name,
# packet id None for QoS 0, empty properties before MQTT 5...), so a round trip can compare
# with `==`. Sizes are kept small: the point is coverage of shapes, not volume.
#
# Direction matters: CLIENT_KINDS are decoded by a "server" Decoder (after a CONNECT),
# SERVER_KINDS by a "client" Decoder created with the level.
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from broker.protocol import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Property,
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
from broker.protocol._properties import PROPERTY_SPEC, REPEATABLE

LEVELS = (3, 4, 5)
PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
MAX_VARINT = 268_435_455

# One settings object for the whole directory: enough examples to find shape bugs, few
# enough that tests/protocol stays well under 30 s.
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- primitives ---------------------------------------------------------------------------

# Well-formed UTF-8 (the utf-8 codec excludes surrogates) without U+0000 [MQTT-1.5.4-1/2].
_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")
_TOPIC_CHARS = st.characters(codec="utf-8", exclude_characters="\x00+#")
_LEVEL_CHARS = st.characters(codec="utf-8", exclude_characters="\x00+#/")

u8_bool = st.integers(0, 1)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
packet_ids = st.integers(1, 0xFFFF)
qos_levels = st.integers(0, 2)


def text(min_size: int = 0, max_size: int = 8) -> st.SearchStrategy[str]:
    return st.text(_CHARS, min_size=min_size, max_size=max_size)


def binary(max_size: int = 16) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size)


# A topic name: non-empty, no wildcards [MQTT-4.7.3-1], [MQTT-3.3.2-2].
topic_names = st.text(_TOPIC_CHARS, min_size=1, max_size=12)


@st.composite
def topic_filters(draw) -> str:
    """A syntactically valid topic filter: levels, `+` levels, maybe a final `#`."""
    level = st.text(_LEVEL_CHARS, min_size=1, max_size=5) | st.just("+")
    levels = draw(st.lists(level, min_size=1, max_size=3))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


# -- properties ---------------------------------------------------------------------------

P = Property
_VALUES: dict[Property, st.SearchStrategy] = {
    P.PAYLOAD_FORMAT_INDICATOR: u8_bool,
    P.MESSAGE_EXPIRY_INTERVAL: u32,
    P.CONTENT_TYPE: text(),
    P.RESPONSE_TOPIC: topic_names,  # no wildcards [MQTT-3.3.2-14]
    P.CORRELATION_DATA: binary(),
    P.SUBSCRIPTION_IDENTIFIER: st.integers(1, MAX_VARINT),
    P.SESSION_EXPIRY_INTERVAL: u32,
    P.ASSIGNED_CLIENT_IDENTIFIER: text(),
    P.SERVER_KEEP_ALIVE: u16,
    P.AUTHENTICATION_METHOD: text(min_size=1),
    P.AUTHENTICATION_DATA: binary(),
    P.REQUEST_PROBLEM_INFORMATION: u8_bool,
    P.WILL_DELAY_INTERVAL: u32,
    P.REQUEST_RESPONSE_INFORMATION: u8_bool,
    P.RESPONSE_INFORMATION: text(),
    P.SERVER_REFERENCE: text(),
    P.REASON_STRING: text(),
    P.RECEIVE_MAXIMUM: st.integers(1, 0xFFFF),  # 0 is a Protocol Error [3.1.2.11.3]
    P.TOPIC_ALIAS_MAXIMUM: u16,
    P.TOPIC_ALIAS: st.integers(1, 0xFFFF),  # 0 is not permitted [MQTT-3.3.2-8]
    P.MAXIMUM_QOS: u8_bool,
    P.RETAIN_AVAILABLE: u8_bool,
    P.USER_PROPERTY: st.tuples(text(), text()),
    P.MAXIMUM_PACKET_SIZE: st.integers(1, 0xFFFF_FFFF),  # 0 is a Protocol Error
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: u8_bool,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8_bool,
    P.SHARED_SUBSCRIPTION_AVAILABLE: u8_bool,
}


def _value(prop: Property, where: str) -> st.SearchStrategy:
    if prop not in REPEATABLE:
        return _VALUES[prop]
    # Repeatable properties are lists. SUBSCRIBE carries at most one Subscription
    # Identifier [3.8.2.1.2]; PUBLISH may carry several [3.3.2.3.8].
    max_size = 1 if where == "SUBSCRIBE" else 3
    return st.lists(_VALUES[prop], min_size=1, max_size=max_size)


def _auth_data_needs_method(props: dict) -> dict:
    # "It is a Protocol Error to include Authentication Data if there is no
    # Authentication Method" [3.1.2.11.10].
    if P.AUTHENTICATION_DATA in props and P.AUTHENTICATION_METHOD not in props:
        del props[P.AUTHENTICATION_DATA]
    return props


def properties(where: str) -> st.SearchStrategy[dict]:
    """Random valid properties for the packet named `where` (names as in PROPERTY_SPEC)."""
    allowed = {p: _value(p, where) for p, (_, places) in PROPERTY_SPEC.items() if where in places}
    return st.fixed_dictionaries({}, optional=allowed).map(_auth_data_needs_method)


# -- reason codes (MQTT 5, per packet, section 2.4 and each packet's table) ----------------

CONNACK_CODES = [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A]
CONNACK_CODES += [0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F]
PUBACK_CODES = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]  # also PUBREC
PUBREL_CODES = [0x00, 0x92]  # also PUBCOMP
SUBACK_CODES = [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]
UNSUBACK_CODES = [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]
DISCONNECT_CODES = [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F]
DISCONNECT_CODES += [0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D]
DISCONNECT_CODES += [0x9E, 0x9F, 0xA0, 0xA1, 0xA2]
AUTH_CODES = [0x00, 0x18, 0x19]


# -- packets ------------------------------------------------------------------------------


def _props(level: int, where: str) -> st.SearchStrategy[dict]:
    return properties(where) if level == 5 else st.just({})


@st.composite
def wills(draw, level: int) -> Will:
    return Will(
        topic=draw(topic_names),
        payload=draw(binary()),
        qos=draw(qos_levels),
        retain=draw(st.booleans()),
        properties=draw(_props(level, "WILL")),
    )


@st.composite
def connects(draw, level: int) -> Connect:
    username = draw(st.none() | text())
    # Before MQTT 5 a password needs a user name [MQTT-3.1.2-22].
    password = None if level < 5 and username is None else draw(st.none() | binary())
    # MQTT 3.1 allowed client ids of 1 to 23 characters.
    client_id = text(1, 23) if level == 3 else text()
    return Connect(
        client_id=draw(client_id),
        protocol_level=level,
        clean_start=draw(st.booleans()),
        keepalive=draw(u16),
        username=username,
        password=password,
        will=draw(st.none() | wills(level)),
        properties=draw(_props(level, "CONNECT")),
        protocol_name=PROTOCOL_NAMES[level],
    )


@st.composite
def connacks(draw, level: int) -> ConnAck:
    codes = st.sampled_from(CONNACK_CODES) if level == 5 else st.integers(0, 5)
    code = draw(codes)
    # MQTT 3.1 has no session present flag; later versions clear it on refusal
    # [MQTT-3.2.2-4] (3.1.1), [MQTT-3.2.2-6] (5.0).
    session_present = level > 3 and code == 0 and draw(st.booleans())
    return ConnAck(code, session_present, draw(_props(level, "CONNACK")))


@st.composite
def publishes(draw, level: int) -> Publish:
    qos = draw(qos_levels)
    return Publish(
        topic=draw(topic_names),
        payload=draw(binary(64)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=qos > 0 and draw(st.booleans()),  # DUP is 0 for QoS 0 [MQTT-3.3.1-2]
        packet_id=draw(packet_ids) if qos else None,  # [MQTT-2.2.1-2]
        properties=draw(_props(level, "PUBLISH")),
    )


def acks(cls: type, level: int) -> st.SearchStrategy:
    if level < 5:
        return st.builds(cls, packet_ids)
    codes = PUBACK_CODES if cls in (PubAck, PubRec) else PUBREL_CODES
    return st.builds(cls, packet_ids, st.sampled_from(codes), properties(cls.__name__.upper()))


@st.composite
def subscriptions(draw, level: int) -> Subscription:
    if level < 5:  # no subscription options before MQTT 5
        return Subscription(draw(topic_filters()), draw(qos_levels))
    return Subscription(
        topic_filter=draw(topic_filters()),
        qos=draw(qos_levels),
        no_local=draw(st.booleans()),
        retain_as_published=draw(st.booleans()),
        retain_handling=draw(st.integers(0, 2)),  # 3 is a Protocol Error [3.8.3.1]
    )


def subscribes(level: int) -> st.SearchStrategy[Subscribe]:
    subs = st.lists(subscriptions(level), min_size=1, max_size=3)
    return st.builds(Subscribe, packet_ids, subs, _props(level, "SUBSCRIBE"))


def subacks(level: int) -> st.SearchStrategy[SubAck]:
    # 3.1 grants a QoS; 3.1.1 adds 0x80 failure [MQTT-3.9.3-2].
    codes = {3: [0, 1, 2], 4: [0, 1, 2, 0x80], 5: SUBACK_CODES}[level]
    reason_codes = st.lists(st.sampled_from(codes), min_size=1, max_size=3)
    return st.builds(SubAck, packet_ids, reason_codes, _props(level, "SUBACK"))


def unsubscribes(level: int) -> st.SearchStrategy[Unsubscribe]:
    filters = st.lists(topic_filters(), min_size=1, max_size=3)
    return st.builds(Unsubscribe, packet_ids, filters, _props(level, "UNSUBSCRIBE"))


def unsubacks(level: int) -> st.SearchStrategy[UnsubAck]:
    if level < 5:  # no payload before MQTT 5
        return st.builds(UnsubAck, packet_ids)
    codes = st.lists(st.sampled_from(UNSUBACK_CODES), min_size=1, max_size=3)
    return st.builds(UnsubAck, packet_ids, codes, properties("UNSUBACK"))


def disconnects(level: int) -> st.SearchStrategy[Disconnect]:
    if level < 5:
        return st.just(Disconnect())
    codes = st.sampled_from(DISCONNECT_CODES)
    return st.builds(Disconnect, codes, properties("DISCONNECT"))


def _with_method(props: dict) -> dict:
    # AUTH must carry the Authentication Method [3.15.2.2.2].
    props.setdefault(P.AUTHENTICATION_METHOD, "SCRAM-SHA-1")
    return props


def auths(level: int) -> st.SearchStrategy[Auth]:
    assert level == 5, "AUTH exists only in MQTT 5"
    return st.builds(Auth, st.sampled_from(AUTH_CODES), properties("AUTH").map(_with_method))


_FACTORIES = {
    "connect": connects,
    "connack": connacks,
    "publish": publishes,
    "puback": lambda level: acks(PubAck, level),
    "pubrec": lambda level: acks(PubRec, level),
    "pubrel": lambda level: acks(PubRel, level),
    "pubcomp": lambda level: acks(PubComp, level),
    "subscribe": subscribes,
    "suback": subacks,
    "unsubscribe": unsubscribes,
    "unsuback": unsubacks,
    "pingreq": lambda level: st.just(PingReq()),
    "pingresp": lambda level: st.just(PingResp()),
    "disconnect": disconnects,
    "auth": auths,
}

_BOTH = ("publish", "puback", "pubrec", "pubrel", "pubcomp")


def client_kinds(level: int) -> tuple[str, ...]:
    """Packets a client sends (decoded by a server), CONNECT first."""
    kinds = ("connect", *_BOTH, "subscribe", "unsubscribe", "pingreq", "disconnect")
    return (*kinds, "auth") if level == 5 else kinds


def server_kinds(level: int) -> tuple[str, ...]:
    """Packets a server sends (decoded by a client)."""
    kinds = ("connack", *_BOTH, "suback", "unsuback", "pingresp")
    return (*kinds, "disconnect", "auth") if level == 5 else kinds


def packets(kind: str, level: int) -> st.SearchStrategy:
    return _FACTORIES[kind](level)


def stream_packets(role: str, level: int) -> st.SearchStrategy:
    """Any packet that may follow the CONNECT in a stream decoded by `role`."""
    kinds = client_kinds(level)[1:] if role == "server" else server_kinds(level)
    return st.one_of([packets(kind, level) for kind in kinds])
