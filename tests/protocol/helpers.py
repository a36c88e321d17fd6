# Feeding helpers in the style of h11's tests/test_io.py: the same bytes whole, one byte at
# a time, or cut at given offsets, draining every complete packet after each chunk.
from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from broker.protocol import Connect, Decoder, ProtocolError, encode

from .strategies import PROTOCOL_NAMES

# The smallest CONNECT of each level, as a client would send it (and its decoded form).
MINIMAL_CONNECT = {
    level: Connect("c", protocol_level=level, keepalive=60, protocol_name=PROTOCOL_NAMES[level])
    for level in (3, 4, 5)
}
# Literal bytes, so the malformed corpus does not depend on the encoder.
CONNECT_BYTES = {
    3: b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01c",
    4: b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c",
    5: b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01c",
}


def new_decoder(role: str, level: int, **kwargs) -> Decoder:
    """A decoder ready for post-CONNECT traffic: a server has already read a CONNECT."""
    if role == "client":
        return Decoder("client", protocol_level=level, **kwargs)
    decoder = Decoder("server", **kwargs)
    decoder.receive_data(CONNECT_BYTES[level])
    assert decoder.next_packet() == MINIMAL_CONNECT[level]
    return decoder


def drain(decoder: Decoder) -> list:
    out = []
    # Each packet is at least two bytes, so this bound can only trip on a decoder that
    # returns packets out of nothing (a hang in disguise).
    for _ in range(1_000_000):
        packet = decoder.next_packet()
        if packet is None:
            return out
        out.append(packet)
    raise AssertionError("decoder never asked for more data")


def feed_chunks(decoder: Decoder, chunks: Iterable[bytes]) -> list:
    out = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        out += drain(decoder)
    return out


def feed_whole(decoder: Decoder, data: bytes) -> list:
    return feed_chunks(decoder, [data])


def feed_bytewise(decoder: Decoder, data: bytes) -> list:
    return feed_chunks(decoder, [data[i : i + 1] for i in range(len(data))])


def cut(data: bytes, offsets: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(set(offsets)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


def encode_all(packets: Iterable, level: int) -> bytes:
    return b"".join(encode(p, level) for p in packets)


def expect_error(decoder: Decoder, data: bytes, codes: set[int] | int) -> ProtocolError:
    """Feed `data` whole; the decoder must raise a ProtocolError with one of `codes`."""
    codes = {codes} if isinstance(codes, int) else codes
    decoder.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        drain(decoder)
    assert info.value.reason_code in codes, (
        f"reason {info.value.reason_code:#04x} not in {sorted(hex(c) for c in codes)}: {info.value}"
    )
    return info.value
