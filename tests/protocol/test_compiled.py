"""The compiled decoder (broker/protocol/_speedups.c) against the pure-Python one on the
same bytes, valid and damaged: the same packets (raw bytes included), then the same error.
(Every other test in this directory runs with each of them in turn: tests/protocol/conftest.py.)
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import Decoder, ProtocolError, Publish, _decoder, encode

from .helpers import new_decoder
from .strategies import LEVELS, stream_packets

pytestmark = pytest.mark.skipif(_decoder.COMPILED is None, reason="_speedups.c was not built")


def _decode(role: str, level: int, chunks: list[bytes], compiled: bool) -> tuple[list, str]:
    """What a decoder makes of `chunks`: its packets (with their raw bytes), then the
    error that ended the stream, if any."""
    saved = _decoder.decode_run
    _decoder.use_compiled(compiled)
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
        _decoder.decode_run = saved


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
    _decoder.use_compiled(True)  # the fixture puts the one it found back
    wire = encode(Publish("a/b", b"1"), 4) * 3
    decoder = new_decoder("server", 4)
    decoder.receive_data(wire)
    topics = [decoder.next_packet().topic for _ in range(3)]
    assert topics[0] is topics[1] is topics[2]
