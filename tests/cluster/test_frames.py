"""The cluster channel's wire codec on its own (broker/cluster/frames.py): frames in and
out of FrameDecoder however the bytes are cut, its refusals, messages as frames carry
them (pack_message / unpack_message), and the handshake's HELLO and proofs of the
secret."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cluster import frames
from broker.cluster.frames import (
    ACK,
    CHALLENGE,
    ENQUEUE,
    HELLO,
    NONCE_SIZE,
    PING,
    PROOF,
    PUBLISH,
    WELCOME,
    Connecting,
    FrameDecoder,
    FrameError,
    HandshakeError,
    Hello,
    accepting_proof,
    connecting_proof,
    encode,
    hello_of,
    new_nonce,
    nonce_ok,
    pack_message,
    proved,
    unpack_message,
)
from broker.message import Message
from broker.protocol import Property

BIG = 1 << 20  # a max_frame_size no generated frame comes near

# --------------------------------------------------------------------------- strategies

# What msgpack round-trips as itself: no tuples (they come back as lists), no NaN.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(0, 100), inner, max_size=4)
    ),
    max_leaves=12,
)
# A frame: an array starting with its kind (an int), then anything.
frame_lists = st.builds(
    lambda kind, rest: [kind, *rest], st.integers(0, 2**32), st.lists(values, max_size=5)
)


def header(length: int) -> bytes:
    return struct.pack(">I", length)


def framed(body: bytes) -> bytes:
    return header(len(body)) + body


# --------------------------------------------------------------------------- round trips


@given(frame_lists)
@settings(max_examples=60, deadline=None)
def test_a_frame_split_at_every_byte_boundary_comes_out_whole(frame: list[Any]) -> None:
    data = encode(*frame)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    for cut in range(len(data) + 1):
        decoder = FrameDecoder(BIG)
        first = decoder.feed(data[:cut])
        second = decoder.feed(data[cut:])
        assert first + second == [frame], f"cut at {cut}"
        assert first == ([frame] if cut == len(data) else [])
        assert decoder.feed(b"") == []  # nothing left over


@given(st.lists(frame_lists, min_size=1, max_size=5), st.data())
@settings(max_examples=60, deadline=None)
def test_several_frames_cut_anywhere_come_out_in_order(
    sent: list[list[Any]], data: st.DataObject
) -> None:
    stream = b"".join(encode(*frame) for frame in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = FrameDecoder(BIG)
    received: list[list[Any]] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += decoder.feed(stream[start:end])
    assert received == sent


def test_byte_by_byte() -> None:
    sent: list[list[Any]] = [
        [HELLO, frames.PROTOCOL_VERSION, "a", "boot", "s3cret"],
        [PING, 7],
        [ACK, 3, None],
    ]
    stream = b"".join(encode(*frame) for frame in sent)
    decoder = FrameDecoder(BIG)
    received = []
    for i in range(len(stream)):
        received += decoder.feed(stream[i : i + 1])
    assert received == sent


def test_several_frames_in_one_feed_and_a_partial_one_kept() -> None:
    one, two, three = encode(PING, 1), encode(ACK, 9, "no session"), encode(PING, 3)
    decoder = FrameDecoder(BIG)
    assert decoder.feed(one + two + three[:5]) == [[PING, 1], [ACK, 9, "no session"]]
    assert decoder.feed(three[5:]) == [[PING, 3]]


def test_integer_map_keys_survive() -> None:
    # Properties travel as a map keyed by property ids (ints): strict_map_key must be off.
    assert FrameDecoder(BIG).feed(encode(PUBLISH, {1: "x", 38: [["k", "v"]]})) == [
        [PUBLISH, {1: "x", 38: [["k", "v"]]}]
    ]


# --------------------------------------------------------------------------- size limit


def test_a_frame_of_exactly_max_frame_size_is_accepted() -> None:
    data = encode(PING, "x" * 20)
    limit = len(data) - 4
    assert FrameDecoder(limit).feed(data) == [[PING, "x" * 20]]


def test_a_frame_above_max_frame_size_is_refused_from_its_header_alone() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(FrameError, match="101 bytes"):
        decoder.feed(header(101))  # no body sent: the header says enough


def test_a_huge_length_after_good_frames_is_refused() -> None:
    decoder = FrameDecoder(1000)
    with pytest.raises(FrameError, match="max_frame_size 1000"):
        decoder.feed(encode(PING, 1) + header(2**32 - 1) + b"\x00")


def test_a_header_cut_in_two_is_waited_for() -> None:
    decoder = FrameDecoder(100)
    assert decoder.feed(header(101)[:3]) == []  # not a whole header yet
    with pytest.raises(FrameError):
        decoder.feed(header(101)[3:])


def test_the_limit_is_named_as_the_decoder_was_told() -> None:
    decoder = FrameDecoder(4096, "before HELLO, at most")
    with pytest.raises(
        FrameError, match=r"^a frame of 67108864 bytes \(before HELLO, at most 4096\)$"
    ):
        decoder.feed(header(64 * 1024 * 1024))


def test_a_partial_frame_waits_and_is_counted_as_buffered() -> None:
    decoder = FrameDecoder(100)
    assert decoder.feed(header(100) + b"x" * 60) == []
    assert decoder.buffered == 64  # the header and what came of the body, nothing more


def test_a_raised_limit_takes_the_larger_frames_that_follow() -> None:
    """The cluster listener's way: a small limit until HELLO is accepted, then its
    max_frame_size (broker/cluster/link.py). A peer sends nothing more before WELCOME:
    a larger frame's header right behind the HELLO is refused with it."""
    small = encode(HELLO, 2, "b", "boot", b"n" * 16)
    large = encode(PUBLISH, "x" * 1000)
    with pytest.raises(FrameError, match="before HELLO"):
        FrameDecoder(len(small) - 4, "before HELLO, at most").feed(small + large[:4])
    decoder = FrameDecoder(len(small) - 4, "before HELLO, at most")
    assert decoder.feed(small) == [[HELLO, 2, "b", "boot", b"n" * 16]]
    decoder.set_limit(BIG)
    assert decoder.feed(large[:10]) == []
    assert decoder.feed(large[10:]) == [[PUBLISH, "x" * 1000]]
    assert decoder.buffered == 0


# --------------------------------------------------------------------------- garbage


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xc1", id="never-used byte"),
        pytest.param(b"\x93\x01", id="array cut short"),
        pytest.param(b"\x91\x01\x01", id="extra data after the array"),
        pytest.param(b"", id="empty body"),
        pytest.param(b"\x92\x01\xa1\xff", id="string not utf-8"),
        pytest.param(b"\x91" * 5000 + b"\x01", id="nested too deep"),
    ],
)
def test_garbage_is_a_frame_error(body: bytes) -> None:
    with pytest.raises(FrameError, match="not MessagePack"):
        FrameDecoder(BIG).feed(framed(body))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("hello", id="string"),
        pytest.param(7, id="int"),
        pytest.param({"kind": 1}, id="map"),
        pytest.param(None, id="nil"),
        pytest.param([], id="empty array"),
        pytest.param(["4", 1], id="array starting with a string"),
        pytest.param([1.0, 1], id="array starting with a float"),
        pytest.param([None], id="array starting with nil"),
    ],
)
def test_not_an_array_starting_with_an_int_is_a_frame_error(value: Any) -> None:
    with pytest.raises(FrameError, match="array starting with its kind"):
        FrameDecoder(BIG).feed(framed(msgpack.packb(value)))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x92\x04\x81\x91\x01\x01", id="array as map key"),
        pytest.param(b"\x92\x04\x81\x80\x01", id="map as map key"),
    ],
)
def test_a_map_with_an_unhashable_key_is_a_frame_error(body: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder(BIG).feed(framed(body))


# --------------------------------------------------------------------------- messages


def message_fields(message: Message) -> tuple[Any, ...]:
    return (
        message.topic,
        message.payload,
        message.qos,
        message.retain,
        message.properties,
        message.sender,
        message.acl_name,
    )


def through_the_wire(message: Message, now_out: float, now_in: float) -> Message:
    """pack_message, a PUBLISH frame, bytes, FrameDecoder, unpack_message."""
    (frame,) = FrameDecoder(BIG).feed(encode(PUBLISH, pack_message(message, now_out)))
    assert frame[0] == PUBLISH
    return unpack_message(frame[1], now_in)


def test_a_message_keeps_everything() -> None:
    user = [("k", "v"), ("a", "1"), ("k", "v"), ("k", "other")]  # order and duplicates
    properties: dict[int, Any] = {
        Property.PAYLOAD_FORMAT_INDICATOR: 1,
        Property.CONTENT_TYPE: "text/plain",
        Property.RESPONSE_TOPIC: "reply/here",
        Property.CORRELATION_DATA: b"\x00\xffid",
        Property.USER_PROPERTY: user,
    }
    message = Message("a/b/c", b"\x00\x01payload\xff", 2, True, dict(properties), "publisher")
    message.acl_name = "rule-7"
    got = through_the_wire(message, 5.0, 9.0)
    assert message_fields(got) == (
        "a/b/c",
        b"\x00\x01payload\xff",
        2,
        True,
        properties,
        "publisher",
        "rule-7",
    )
    assert got.properties[Property.USER_PROPERTY] == user
    assert all(type(pair) is tuple for pair in got.properties[Property.USER_PROPERTY])
    assert got.expires_at is None
    assert Property.MESSAGE_EXPIRY_INTERVAL not in got.properties


def test_a_message_without_properties_or_sender() -> None:
    got = through_the_wire(Message("t", b"", 0), 0.0, 0.0)
    assert message_fields(got) == ("t", b"", 0, False, {}, None, "")


def test_a_message_with_an_expiry_carries_the_time_it_has_left() -> None:
    message = Message("t", b"x", 1, properties={Property.MESSAGE_EXPIRY_INTERVAL: 100}, now=0)
    assert message.expires_at == 100
    got = through_the_wire(message, 30.0, 1000.0)
    assert got.properties[Property.MESSAGE_EXPIRY_INTERVAL] == 70
    assert got.expires_at == 1070  # the receiver's clock plus what was left
    assert not got.expired(1069.9)
    assert got.expired(1070)
    # The sender's message is untouched: it still expires on its own clock.
    assert message.properties[Property.MESSAGE_EXPIRY_INTERVAL] == 100
    assert message.expires_at == 100


def test_an_expired_message_carries_zero_not_a_negative_interval() -> None:
    message = Message("t", b"x", 1, properties={Property.MESSAGE_EXPIRY_INTERVAL: 10}, now=0)
    got = through_the_wire(message, 50.0, 7.0)
    assert got.properties[Property.MESSAGE_EXPIRY_INTERVAL] == 0
    assert got.expired(7.0)


user_properties = st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=6)


@given(
    topic=st.text(min_size=1, max_size=30),
    payload=st.binary(max_size=64),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    sender=st.none() | st.text(max_size=10),
    acl_name=st.text(max_size=10),
    user=user_properties,
    correlation=st.none() | st.binary(max_size=10),
    interval=st.none() | st.integers(0, 2**32 - 1),
    elapsed=st.integers(0, 1000),
)
@settings(max_examples=80, deadline=None)
def test_messages_round_trip(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    sender: str | None,
    acl_name: str,
    user: list[tuple[str, str]],
    correlation: bytes | None,
    interval: int | None,
    elapsed: int,
) -> None:
    properties: dict[int, Any] = {}
    if user:
        properties[Property.USER_PROPERTY] = list(user)
    if correlation is not None:
        properties[Property.CORRELATION_DATA] = correlation
    if interval is not None:
        properties[Property.MESSAGE_EXPIRY_INTERVAL] = interval
    message = Message(topic, payload, qos, retain, dict(properties), sender, now=0)
    message.acl_name = acl_name
    got = through_the_wire(message, elapsed, 0)
    expected = dict(properties)
    if interval is not None:
        expected[Property.MESSAGE_EXPIRY_INTERVAL] = max(0, interval - elapsed)
    assert message_fields(got) == (topic, payload, qos, retain, expected, sender, acl_name)


def test_an_enqueue_frame_carries_packed_messages() -> None:
    message = Message("s/t", b"p", 1, properties={Property.USER_PROPERTY: [("a", "b")]})
    item = [pack_message(message, 0.0), 1, False, [3, 4]]
    (frame,) = FrameDecoder(BIG).feed(encode(ENQUEUE, 12, "client", [item], "$share/g/s/t"))
    kind, ref, client_id, items, share = frame
    assert (kind, ref, client_id, share) == (ENQUEUE, 12, "client", "$share/g/s/t")
    fields, qos, retain, sub_ids = items[0]
    assert (qos, retain, sub_ids) == (1, False, [3, 4])
    got = unpack_message(fields, 0.0)
    assert message_fields(got) == message_fields(message)


# --------------------------------------------------------------------------- the handshake

SECRET = "s3cret"
HELLO_B = Hello("b", "b-boot", b"n" * NONCE_SIZE)
CHALLENGE_NONCE = b"c" * NONCE_SIZE


def test_a_hello_is_read_and_its_refusals_are_named() -> None:
    good = [HELLO, frames.PROTOCOL_VERSION, *HELLO_B]
    assert hello_of(good, "a") == HELLO_B
    for frame, reason in (
        ([PING, 1], "expected HELLO"),
        (good[:4], "expected HELLO"),
        (
            [HELLO, 1, "b", "b-boot", SECRET],
            f"protocol version 1 (this node speaks {frames.PROTOCOL_VERSION})",
        ),
        ([HELLO, frames.PROTOCOL_VERSION, "a", "boot", HELLO_B.nonce], "bad node name 'a'"),
        ([HELLO, frames.PROTOCOL_VERSION, "", "boot", HELLO_B.nonce], "bad node name ''"),
        ([HELLO, frames.PROTOCOL_VERSION, 7, "boot", HELLO_B.nonce], "bad node name 7"),
        (
            [HELLO, frames.PROTOCOL_VERSION, "b", "boot", "text"],
            "a HELLO without a boot id and a nonce",
        ),
        (
            [HELLO, frames.PROTOCOL_VERSION, "b", "boot", b"short"],
            "a HELLO without a boot id and a nonce",
        ),
        (
            [HELLO, frames.PROTOCOL_VERSION, "b", None, HELLO_B.nonce],
            "a HELLO without a boot id and a nonce",
        ),
    ):
        with pytest.raises(HandshakeError) as refused:
            hello_of(frame, "a")
        assert str(refused.value) == reason, frame


def test_nonces_are_fresh() -> None:
    nonces = {new_nonce() for _ in range(100)}
    assert len(nonces) == 100 and all(nonce_ok(n) for n in nonces)


def test_a_proof_holds_for_the_same_secret_and_handshake_only() -> None:
    proof = connecting_proof(SECRET, HELLO_B, "a", CHALLENGE_NONCE)
    assert len(proof) == 32
    assert proved(connecting_proof(SECRET, HELLO_B, "a", CHALLENGE_NONCE), proof)
    others = [
        connecting_proof("other", HELLO_B, "a", CHALLENGE_NONCE),  # another secret
        connecting_proof(SECRET, HELLO_B, "a", b"d" * NONCE_SIZE),  # another challenge
        connecting_proof(SECRET, HELLO_B._replace(nonce=b"m" * NONCE_SIZE), "a", CHALLENGE_NONCE),
        connecting_proof(SECRET, HELLO_B._replace(node="c"), "a", CHALLENGE_NONCE),  # as c
        connecting_proof(SECRET, HELLO_B._replace(boot_id="b-2"), "a", CHALLENGE_NONCE),
        connecting_proof(SECRET, HELLO_B, "z", CHALLENGE_NONCE),  # meant for node z
        # The accepting node's proof is never the connecting node's (nor the reverse).
        accepting_proof(SECRET, HELLO_B, "a", "", CHALLENGE_NONCE),
    ]
    assert not any(proved(other, proof) for other in others)
    assert len(set(others)) == len(others)


def test_the_accepting_proof_covers_its_boot_id() -> None:
    proof = accepting_proof(SECRET, HELLO_B, "a", "a-boot", CHALLENGE_NONCE)
    assert proved(accepting_proof(SECRET, HELLO_B, "a", "a-boot", CHALLENGE_NONCE), proof)
    assert not proved(accepting_proof(SECRET, HELLO_B, "a", "a-boot-2", CHALLENGE_NONCE), proof)


@pytest.mark.parametrize("received", [None, "text", 42, b"", b"x" * 32, [b"x"]])
def test_anything_but_the_proof_is_not_proved(received: Any) -> None:
    expected = connecting_proof(SECRET, HELLO_B, "a", CHALLENGE_NONCE)
    assert not proved(expected, received)


def test_no_handshake_frame_carries_the_secret() -> None:
    secret = "a-secret-long-enough-to-see"
    proof = connecting_proof(secret, HELLO_B, "a", CHALLENGE_NONCE)
    said = b"".join(
        (
            encode(HELLO, frames.PROTOCOL_VERSION, *HELLO_B),
            encode(frames.CHALLENGE, "a", CHALLENGE_NONCE),
            encode(frames.PROOF, proof),
            encode(
                frames.WELCOME,
                "a",
                "a-boot",
                accepting_proof(secret, HELLO_B, "a", "a-boot", CHALLENGE_NONCE),
            ),
        )
    )
    assert secret.encode() not in said
    assert len(encode(HELLO, frames.PROTOCOL_VERSION, *HELLO_B)) < 100  # far under HELLO_MAX_SIZE


def accepting(frame: bytes, secret: str = SECRET) -> tuple[Hello, list[Any]]:
    """What node a answers a HELLO with: its HELLO read, and its CHALLENGE."""
    (hello_frame,) = FrameDecoder(BIG).feed(frame)
    return hello_of(hello_frame, "a"), [CHALLENGE, "a", CHALLENGE_NONCE]


def test_the_connecting_side_proves_and_checks_the_proof_it_gets() -> None:
    said = Connecting(SECRET, "b", "b-boot", meant="a")
    hello, challenge = accepting(said.hello())
    (proof_frame,) = FrameDecoder(BIG).feed(said.proof(challenge))
    assert proof_frame[0] == PROOF
    assert proved(connecting_proof(SECRET, hello, "a", CHALLENGE_NONCE), proof_frame[1])
    good = accepting_proof(SECRET, hello, "a", "a-boot", CHALLENGE_NONCE)
    assert said.welcomed([WELCOME, "a", "a-boot", good]) == "a-boot"
    assert said.peer == "a"


def test_the_connecting_side_refuses_what_is_not_right() -> None:
    said = Connecting(SECRET, "b", "b-boot", meant="a")
    with pytest.raises(HandshakeError, match=r"^a WELCOME out of place$"):
        said.welcomed([WELCOME, "a", "a-boot", b"x" * 32])  # before any CHALLENGE
    with pytest.raises(HandshakeError, match=r"^it is node c, not a$"):
        said.proof([CHALLENGE, "c", CHALLENGE_NONCE])  # another node at that address
    with pytest.raises(HandshakeError, match=r"^a CHALLENGE out of place$"):
        said.proof([CHALLENGE, "a", b"short"])
    hello, challenge = accepting(said.hello())
    said.proof(challenge)
    with pytest.raises(HandshakeError, match=r"^a CHALLENGE out of place$"):
        said.proof(challenge)  # a second one
    other_secret = accepting_proof("other", hello, "a", "a-boot", CHALLENGE_NONCE)
    with pytest.raises(HandshakeError, match=r"^wrong cluster secret \(its proof"):
        said.welcomed([WELCOME, "a", "a-boot", other_secret])
    with pytest.raises(HandshakeError, match=r"^a WELCOME out of place$"):
        said.welcomed([WELCOME, "c", "c-boot", b"x" * 32])  # from another node


def test_a_seed_contact_takes_the_node_its_challenge_names() -> None:
    said = Connecting(SECRET, "b", "b-boot")  # no node meant
    hello, _ = accepting(said.hello())
    said.proof([CHALLENGE, "seed-7", CHALLENGE_NONCE])
    good = accepting_proof(SECRET, hello, "seed-7", "s-boot", CHALLENGE_NONCE)
    assert said.welcomed([WELCOME, "seed-7", "s-boot", good]) == "s-boot"
    assert said.peer == "seed-7"
