"""Variable Byte Integers [1.5.5]: the helpers in _buffer, and the same values on the wire
as Remaining Length, Property Length and Subscription Identifier."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import PingReq, Property, Publish, RemoteProtocolError, encode
from broker.protocol._buffer import MAX_VARINT, encode_varint, read_varint

from .helpers import expect_error, feed_whole, new_decoder
from .strategies import FAST

# Table 1-1 "Size of Variable Byte Integer": the first and last value of each length.
BOUNDARIES = [
    (0, b"\x00"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"),
    (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f"),
]


def test_max_value():
    assert MAX_VARINT == 268_435_455


@pytest.mark.parametrize(("value", "wire"), BOUNDARIES)
def test_encode_boundaries(value, wire):
    assert encode_varint(value) == wire


@pytest.mark.parametrize(("value", "wire"), BOUNDARIES)
def test_read_boundaries(value, wire):
    assert read_varint(wire, 0) == (value, len(wire))
    # Reads stop at the last byte and honour the start offset.
    assert read_varint(b"\xaa" + wire + b"\xff\xff", 1) == (value, 1 + len(wire))


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1, 2**32])
def test_encode_out_of_range(value):
    with pytest.raises(ValueError):
        encode_varint(value)


@pytest.mark.parametrize(
    "wire",
    [
        b"\x80\x80\x80\x80\x01",  # five bytes: 2**28, beyond the four-byte maximum
        b"\xff\xff\xff\xff\x7f",
        b"\x80\x80\x80\x80\x00",  # five bytes even though the value is 0
    ],
)
def test_read_rejects_five_bytes(wire):
    with pytest.raises(RemoteProtocolError) as info:
        read_varint(wire, 0)
    assert info.value.reason_code == 0x81


@pytest.mark.parametrize("wire", [b"", b"\x80", b"\xff\xff", b"\x80\x80\x80"])
def test_read_rejects_truncated(wire):
    # Inside a complete packet a cut-off integer is malformed, not "need more data".
    with pytest.raises(RemoteProtocolError) as info:
        read_varint(wire, 0)
    assert info.value.reason_code == 0x81


@FAST
@given(st.integers(0, MAX_VARINT))
def test_roundtrip_any_value(value):
    wire = encode_varint(value)
    # [MQTT-1.5.5-1]: "MUST use the minimum number of bytes necessary".
    assert len(wire) == 1 + (value >= 128) + (value >= 16_384) + (value >= 2_097_152)
    assert read_varint(wire, 0) == (value, len(wire))


# -- on the wire --------------------------------------------------------------------------


def test_remaining_length_zero():
    assert encode(PingReq(), 4) == b"\xc0\x00"
    assert feed_whole(new_decoder("server", 4), b"\xc0\x00") == [PingReq()]


@pytest.mark.parametrize(("value", "wire"), BOUNDARIES[1:-1], ids=lambda v: str(v))
def test_remaining_length_boundaries(value, wire):
    # A 3.1.1 QoS 0 PUBLISH to "t": 3 bytes of topic, then the payload.
    packet = Publish("t", bytes(value - 3))
    encoded = encode(packet, 4)
    assert encoded[1 : 1 + len(wire)] == wire
    assert len(encoded) == 1 + len(wire) + value
    assert feed_whole(new_decoder("server", 4), encoded) == [packet]


def test_largest_remaining_length_is_accepted_by_default():
    # 268,435,455 is legal [2.1.4]; the default limit must not refuse its header.
    decoder = new_decoder("server", 4)
    decoder.receive_data(b"\x30\xff\xff\xff\x7f\x00\x01t")
    assert decoder.next_packet() is None


@pytest.mark.parametrize("level", [3, 4, 5])
def test_remaining_length_with_five_bytes(level):
    expect_error(new_decoder("server", level), b"\x30\x80\x80\x80\x80\x01", 0x81)


@pytest.mark.parametrize(("value", "wire"), BOUNDARIES[1:], ids=lambda v: str(v))
def test_subscription_identifier_boundaries(value, wire):
    packet = Publish("t", properties={Property.SUBSCRIPTION_IDENTIFIER: [value]})
    encoded = encode(packet, 5)
    assert b"\x0b" + wire in encoded
    assert feed_whole(new_decoder("client", 5), encoded) == [packet]


def test_property_length_over_127():
    # A property block of 200+ bytes needs a two-byte Property Length [2.2.2.1].
    packet = Publish("t", b"x", properties={Property.USER_PROPERTY: [("k", "v" * 200)]})
    encoded = encode(packet, 5)
    assert len(encoded) > 200
    assert feed_whole(new_decoder("server", 5), encoded) == [packet]
