"""decode(encode(p)) == p for every packet type and protocol level, under any chunking.

Client-to-server packets are decoded by a "server" Decoder after a CONNECT has set the
level; server-to-client packets by a "client" Decoder created with the level.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    Auth,
    ConnAck,
    Connect,
    Decoder,
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
    encode,
    encode_puback,
    encode_pubrec,
)
from broker.protocol._properties import PROPERTY_SPEC

from .helpers import (
    CONNECT_BYTES,
    MINIMAL_CONNECT,
    cut,
    drain,
    encode_all,
    feed_bytewise,
    feed_chunks,
    feed_whole,
    new_decoder,
)
from .strategies import (
    _VALUES,
    FAST,
    LEVELS,
    client_kinds,
    packets,
    server_kinds,
    stream_packets,
)

CASES = [
    pytest.param(role, level, kind, id=f"{kind}-v{level}")
    for level in LEVELS
    for role, kinds in (("server", client_kinds(level)), ("client", server_kinds(level)))
    for kind in kinds
]


def _decoder_for(role: str, level: int, kind: str) -> Decoder:
    # A CONNECT is decoded by a fresh server decoder; anything else after one.
    return Decoder("server") if kind == "connect" else new_decoder(role, level)


@pytest.mark.parametrize(("role", "level", "kind"), CASES)
@FAST
@given(data=st.data())
def test_roundtrip_one_packet(role, level, kind, data):
    packet = data.draw(packets(kind, level), label="packet")
    wire = encode(packet, level)
    assert feed_whole(_decoder_for(role, level, kind), wire) == [packet]
    assert feed_bytewise(_decoder_for(role, level, kind), wire) == [packet]
    offsets = data.draw(st.lists(st.integers(0, len(wire)), max_size=4), label="cuts")
    assert feed_chunks(_decoder_for(role, level, kind), cut(wire, offsets)) == [packet]


STREAMS = [
    pytest.param(role, level, id=f"{role}-v{level}")
    for level in LEVELS
    for role in ("server", "client")
]


@pytest.mark.parametrize(("role", "level"), STREAMS)
@FAST
@given(data=st.data())
def test_stream_with_trailing_partial_packet(role, level, data):
    """Several packets in one buffer, then the first part of one more."""
    batch = data.draw(st.lists(stream_packets(role, level), min_size=1, max_size=5))
    last = data.draw(stream_packets(role, level))
    tail = encode(last, level)
    split = data.draw(st.integers(1, len(tail) - 1))
    wire = encode_all(batch, level) + tail[:split]

    decoder = new_decoder(role, level)
    offsets = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    assert feed_chunks(decoder, cut(wire, offsets)) == batch
    assert decoder.next_packet() is None  # the partial packet waits for its rest
    assert feed_whole(decoder, tail[split:]) == [last]
    assert decoder.next_packet() is None


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.data())
def test_connect_then_traffic_in_one_buffer(level, data):
    """The CONNECT sets the level for the packets that arrive in the same read."""
    connect = data.draw(packets("connect", level))
    rest = data.draw(st.lists(stream_packets("server", level), max_size=4))
    decoder = Decoder("server")
    assert feed_whole(decoder, encode_all([connect, *rest], level)) == [connect, *rest]
    assert decoder.protocol_level == level


def test_every_property_has_a_strategy():
    assert set(_VALUES) == set(PROPERTY_SPEC)


# -- fixed vectors: bytes from the spec's figures, decoded and (where unique) encoded -----

VECTORS = [
    # (role, level, bytes, packet)
    ("server", 4, b"\xc0\x00", PingReq()),
    ("client", 4, b"\xd0\x00", PingResp()),
    ("server", 4, b"\xe0\x00", Disconnect()),
    ("server", 4, b"\x40\x02\x00\x01", PubAck(1)),
    ("server", 4, b"\x50\x02\xff\xff", PubRec(0xFFFF)),
    ("server", 4, b"\x62\x02\x12\x34", PubRel(0x1234)),
    ("server", 4, b"\x70\x02\x00\x07", PubComp(7)),
    ("client", 4, b"\x20\x02\x01\x00", ConnAck(0, session_present=True)),
    ("client", 3, b"\x20\x02\x00\x02", ConnAck(2)),
    ("client", 4, b"\x90\x05\x00\x0a\x00\x01\x80", SubAck(10, [0, 1, 0x80])),
    ("client", 4, b"\xb0\x02\x00\x0a", UnsubAck(10)),
    ("server", 4, b"\x30\x05\x00\x01tab", Publish("t", b"ab")),
    (
        "server",
        4,
        b"\x3b\x05\x00\x01t\x00\x05",
        Publish("t", qos=1, retain=True, dup=True, packet_id=5),
    ),
    ("server", 4, b"\x82\x06\x00\x01\x00\x01a\x02", Subscribe(1, [Subscription("a", 2)])),
    ("server", 4, b"\xa2\x08\x00\x02\x00\x01a\x00\x01b", Unsubscribe(2, ["a", "b"])),
    ("server", 5, b"\xe0\x00", Disconnect()),
    ("client", 5, b"\x30\x04\x00\x01t\x00", Publish("t")),
    ("client", 5, b"\xb0\x04\x00\x01\x00\x11", UnsubAck(1, [0x11])),
    (
        "server",
        5,
        b"\x82\x0b\x00\x01\x02\x0b\x07\x00\x03a/#\x2e",
        Subscribe(
            1,
            [Subscription("a/#", 2, no_local=True, retain_as_published=True, retain_handling=2)],
            {Property.SUBSCRIPTION_IDENTIFIER: [7]},
        ),
    ),
]


@pytest.mark.parametrize(("role", "level", "wire", "packet"), VECTORS)
def test_vectors(role, level, wire, packet):
    assert feed_whole(new_decoder(role, level), wire) == [packet]
    assert encode(packet, level) == wire


@pytest.mark.parametrize("level", LEVELS)
def test_minimal_connect_vector(level):
    assert encode(MINIMAL_CONNECT[level], level) == CONNECT_BYTES[level]


def test_connect_v311_all_fields():
    # [3.1.2.3] flags: user name 0x80, password 0x40, will retain 0x20, will QoS 1 0x08,
    # will flag 0x04, clean session 0x02.
    wire = b"\x10\x1c\x00\x04MQTT\x04\xee\x00\x0a\x00\x02id\x00\x01w\x00\x02hi\x00\x01u\x00\x02pw"
    expected = Connect(
        "id",
        protocol_level=4,
        keepalive=10,
        username="u",
        password=b"pw",
        will=Will("w", b"hi", qos=1, retain=True),
        protocol_name="MQTT",
    )
    decoder = Decoder("server")
    decoder.receive_data(wire)
    assert decoder.next_packet() == expected
    assert encode(expected, 4) == wire


# -- MQTT 5 short forms the decoder must accept --------------------------------------------


@pytest.mark.parametrize(
    ("role", "wire", "packet"),
    [
        # "The Reason Code and Property Length can be omitted if the Reason Code is 0x00
        # (Success) and there are no Properties" [3.4.2.1] (same for PUBREC/REL/COMP).
        ("server", b"\x40\x02\x00\x01", PubAck(1)),
        # "If the Remaining Length is less than 4 there is no Property Length" [3.4.2.2.1].
        ("server", b"\x40\x03\x00\x01\x10", PubAck(1, 0x10)),
        ("server", b"\x40\x04\x00\x01\x00\x00", PubAck(1)),
        ("server", b"\x50\x03\x00\x01\x80", PubRec(1, 0x80)),
        ("server", b"\x62\x03\x00\x01\x92", PubRel(1, 0x92)),
        ("server", b"\x70\x03\x00\x01\x92", PubComp(1, 0x92)),
        # DISCONNECT: remaining length 0 means reason 0x00, no properties; below 2 there
        # is no Property Length [3.14.2.1], [3.14.2.2.1].
        ("server", b"\xe0\x00", Disconnect()),
        ("server", b"\xe0\x01\x04", Disconnect(0x04)),
        ("client", b"\xe0\x01\x8b", Disconnect(0x8B)),
        # AUTH: remaining length 0 means reason 0x00, no properties [3.15.2.1].
        ("server", b"\xf0\x00", Auth()),
        ("client", b"\xf0\x00", Auth()),
    ],
)
def test_mqtt5_short_forms(role, wire, packet):
    assert feed_whole(new_decoder(role, 5), wire) == [packet]


def test_user_properties_keep_order_and_repeats():
    # USER_PROPERTY "is allowed to appear multiple times ... the same name is allowed to
    # appear more than once" [3.1.2.11.8]; order is kept [MQTT-3.3.2-18].
    pairs = [("k", "1"), ("a", "x"), ("k", "2"), ("k", "1")]
    packet = Publish("t", b"", properties={Property.USER_PROPERTY: pairs})
    assert feed_whole(new_decoder("client", 5), encode(packet, 5)) == [packet]


def test_subscription_identifiers_repeat_in_publish():
    ids = [1, 127, 128, 16383, 16384, 2097151, 2097152, 268435455]
    packet = Publish("t", b"x", properties={Property.SUBSCRIPTION_IDENTIFIER: ids})
    assert feed_whole(new_decoder("client", 5), encode(packet, 5)) == [packet]


def test_bom_is_not_stripped():
    # "0xEF 0xBB 0xBF is always interpreted as U+FEFF ... MUST NOT be skipped over or
    # stripped off by a packet receiver" [MQTT-1.5.4-3].
    wire = b"\x30\x08\x00\x04\xef\xbb\xbfa" + b"pl"
    assert feed_whole(new_decoder("server", 4), wire) == [Publish("\ufeffa", b"pl")]


def test_non_ascii_strings():
    packet = Publish("sensor/température/\U0001f321", "°C".encode(), qos=2, packet_id=9)
    for level in LEVELS:
        assert feed_whole(new_decoder("server", level), encode(packet, level)) == [packet]


def test_password_without_user_name_is_fine_in_mqtt5():
    # MQTT 5 drops [MQTT-3.1.2-22]: the password flag is independent [3.1.2.9].
    packet = Connect("c", protocol_level=5, password=b"secret", protocol_name="MQTT")
    assert feed_whole(Decoder("server"), encode(packet, 5)) == [packet]


def test_empty_client_id_and_empty_payloads():
    # A zero-byte client id is allowed by the codec [MQTT-3.1.3-6]; the broker decides.
    connect = Connect("", protocol_level=4, protocol_name="MQTT")
    assert feed_whole(Decoder("server"), encode(connect, 4)) == [connect]
    publish = Publish("t", b"", qos=1, packet_id=1)
    assert feed_whole(new_decoder("server", 4), encode(publish, 4)) == [publish]


def test_large_payload():
    packet = Publish("big", bytes(range(256)) * 1000, qos=1, packet_id=1)
    wire = encode(packet, 5)
    decoder = new_decoder("client", 5)
    chunks = [wire[i : i + 4096] for i in range(0, len(wire), 4096)]
    assert feed_chunks(decoder, chunks) == [packet]
    assert drain(decoder) == []


@given(packet_id=st.integers(1, 0xFFFF), level=st.sampled_from([3, 4, 5]))
def test_the_fast_acknowledgements_are_what_encode_builds(packet_id, level):
    # The hot path's PUBACK and PUBREC (success, no properties) are the codec's own bytes.
    assert encode_puback(packet_id) == encode(PubAck(packet_id), level)
    assert encode_pubrec(packet_id) == encode(PubRec(packet_id), level)
