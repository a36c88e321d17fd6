"""Decoder.take_like and give_back: runs of alike QoS 0 PUBLISHes, which the broker
routes at once. Run with each decoder implementation (conftest.py)."""

from __future__ import annotations

import pytest

from broker.protocol import PingReq, Publish, RemoteProtocolError, encode

from .helpers import new_decoder


def _wire(*packets) -> bytes:
    return b"".join(encode(packet, 4) for packet in packets)


def test_a_run_stops_at_the_first_unlike_packet():
    alike = [Publish("t", b"%d" % i) for i in range(3)]
    unlike = [
        Publish("u", b"x"),
        Publish("t", b"r", retain=True),
        Publish("t", b"1", 1, packet_id=1),
    ]
    for other in unlike:
        decoder = new_decoder("server", 4)
        decoder.receive_data(_wire(*alike, other, alike[0]))
        first = decoder.next_packet()
        assert first == alike[0]
        assert decoder.take_like(first, 1 << 16) == alike[1:]
        assert decoder.next_packet() == other  # left for the next call, in order
        assert decoder.next_packet() == alike[0]


def test_a_run_is_bounded_by_bytes():
    packets = [Publish("t", bytes(100)) for _ in range(10)]
    decoder = new_decoder("server", 4)
    decoder.receive_data(_wire(*packets))
    first = decoder.next_packet()
    size = len(encode(first, 4))
    run = decoder.take_like(first, 3 * size)
    assert len(run) == 2
    assert [decoder.next_packet() for _ in range(7)] == packets[3:]


def test_given_back_packets_come_again_first_in_order():
    packets = [Publish("t", b"%d" % i) for i in range(5)]
    decoder = new_decoder("server", 4)
    decoder.receive_data(_wire(*packets, PingReq()))
    first = decoder.next_packet()
    run = decoder.take_like(first, 1 << 16)
    decoder.give_back(run[1:])
    assert [decoder.next_packet() for _ in range(4)] == [*packets[2:], PingReq()]


def test_an_error_after_a_run_is_raised_by_the_next_call():
    decoder = new_decoder("server", 4)
    decoder.receive_data(_wire(Publish("t", b"1"), Publish("t", b"2")) + b"\x00\x00")
    first = decoder.next_packet()
    assert decoder.take_like(first, 1 << 16) == [Publish("t", b"2")]
    with pytest.raises(RemoteProtocolError):
        decoder.next_packet()
