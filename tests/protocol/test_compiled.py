"""The compiled decoder (broker/protocol/_speedups.c) against the pure-Python one on the
same bytes, valid and damaged: the same packets (raw bytes included), then the same error.
(Every other test in this directory runs with each of them in turn: tests/protocol/conftest.py.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import Decoder, ProtocolError, Publish, _compiled, encode
from broker.protocol._writers import publish_with_id

from .helpers import new_decoder
from .strategies import LEVELS, packets, stream_packets


def publishes_with_id(level: int) -> st.SearchStrategy[Publish]:
    return packets("publish", level).filter(lambda packet: packet.qos > 0)


pytestmark = pytest.mark.skipif(not _compiled.BUILT, reason="_speedups.c was not built")


def _decode(role: str, level: int, chunks: list[bytes], compiled: bool) -> tuple[list, str]:
    """What a decoder makes of `chunks`: its packets (with their raw bytes), then the
    error that ended the stream, if any."""
    was = _compiled.hot.decode_run is not None
    _compiled.use_compiled(compiled)
    try:
        decoder: Decoder = new_decoder(role, level)
        out: list = []
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (packet := decoder.next_packet()) is not None:
                out.append((packet, packet.raw if type(packet) is Publish else None))
        return out, ""
    except ProtocolError as exc:
        return out, f"{type(exc).__name__} {exc.reason_code:#x}: {exc}"
    finally:
        _compiled.use_compiled(was)


@pytest.mark.parametrize("role", ["server", "client"])
@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_and_python_decoders_agree(role, level, data):
    batch = data.draw(st.lists(stream_packets(role, level), min_size=1, max_size=8))
    wire = bytearray(b"".join(encode(packet, level) for packet in batch))
    # Damage a few bytes (or none): both must keep the same packets and fail alike.
    for _ in range(data.draw(st.integers(0, 3), label="damaged")):
        at = data.draw(st.integers(0, len(wire) - 1))
        wire[at] = data.draw(st.integers(0, 255))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=3), label="cuts"))
    chunks = [bytes(wire[a:b]) for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    assert _decode(role, level, chunks, True) == _decode(role, level, chunks, False)


def test_a_run_to_one_topic_shares_its_string():
    """The compiled decoder gives a run of PUBLISHes to one topic one str (hashed once)."""
    _compiled.use_compiled(True)  # the fixture puts the one it found back
    wire = encode(Publish("a/b", b"1"), 4) * 3
    decoder = new_decoder("server", 4)
    decoder.receive_data(wire)
    topics = [decoder.next_packet().topic for _ in range(3)]
    assert topics[0] is topics[1] is topics[2]


@settings(max_examples=300, deadline=None)
@given(
    packet=st.one_of(st.binary(max_size=12), st.binary(min_size=2, max_size=40)),
    packet_id=st.integers(1, 0xFFFF),
    retain=st.booleans(),
)
def test_publish_with_id_agrees_on_any_bytes(packet, packet_id, retain):
    """On any bytes, the same PUBLISH or the same refusal."""

    def outcome(function):
        try:
            return function(packet, packet_id, retain)
        except ValueError as exc:
            return str(exc)

    assert outcome(_compiled._speedups.publish_with_id) == outcome(publish_with_id)


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_publish_with_id_is_the_packet_under_its_new_id(level, data):
    packet = data.draw(publishes_with_id(level))
    new_id = data.draw(st.integers(1, 0xFFFF))
    retain = data.draw(st.booleans())
    wire = _compiled.hot.publish_with_id(encode(packet, level), new_id, retain)
    expected = replace(packet, packet_id=new_id, retain=retain, dup=False)
    assert wire == encode(expected, level)
