"""The relay protocol's frames, sans I/O (docs/event-relay.md has the whole protocol).

A frame is a 4-byte big-endian length, then that many bytes: one byte naming the frame's
kind, then its body, one msgpack value. An EVENTS body is a msgpack array of events, each
itself an array (event_relay.schema); the server writes it from events encoded once, when
they were appended, by prefixing an array header.
"""

from __future__ import annotations

from typing import Any

import msgpack

VERSION = 3  # of the protocol; 2: EVENTS carry compact records; 3: SESSION_EVENTS too

# Frame kinds (one ASCII byte each).
HELLO = b"H"  # consumer -> relay: who, which types, where to start
WELCOME = b"W"  # relay -> consumer: the node, the epoch, the retained range
EVENTS = b"E"  # relay -> consumer: a batch of events
COMMIT = b"C"  # consumer -> relay: the position it has processed (next sequence to read)
COMMITTED = b"K"  # relay -> consumer: the commit is kept
READ = b"R"  # consumer -> relay: the events of a range (request connections)
READ_END = b"D"  # relay -> consumer: the range read is complete
QUERY = b"Q"  # consumer -> relay: the retained range and this consumer's commit
INFO = b"I"  # relay -> consumer: the answer to QUERY
ERROR = b"X"  # relay -> consumer: what went wrong; the relay closes the connection next

KINDS = frozenset({HELLO, WELCOME, EVENTS, COMMIT, COMMITTED, READ, READ_END, QUERY, INFO, ERROR})
# Frames larger than these are refused as malformed: a consumer's requests are small;
# an EVENTS frame carries about FRAME_BYTES of events, more only for one larger event
# (an MQTT message may reach 256 MiB).
MAX_FRAME = 1024 * 1024
MAX_EVENTS_FRAME = 512 * 1024 * 1024
FRAME_BYTES = 4 * 1024 * 1024


class FrameError(Exception):
    """Bytes that are not a frame of this protocol."""


def frame(kind: bytes, body: Any) -> bytes:
    """One frame with a msgpack body."""
    data = kind + msgpack.packb(body)
    return len(data).to_bytes(4, "big") + data


def events_frame(events: list[bytes]) -> bytes:
    """An EVENTS frame from encoded events, in one copy (one write per frame; a second
    copy of a frame this large cost a busy broker 2% of its time)."""
    size = 6 + sum(map(len, events))  # kind + msgpack array 32 header + the events
    head = size.to_bytes(4, "big") + EVENTS + b"\xdd" + len(events).to_bytes(4, "big")
    return b"".join([head, *events])


class FrameReader:
    """Bytes in, (kind, body) out. Events stay as decoded msgpack arrays."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[bytes, Any]]:
        buffer = self._buffer
        buffer += data
        frames = []
        start = 0
        with memoryview(buffer) as view:  # bodies decoded in place, not copied out first
            while len(buffer) - start >= 4:
                size = int.from_bytes(view[start : start + 4], "big")
                if size < 1 or size > self.max_frame:
                    raise FrameError(f"frame length {size} is out of bounds (1..{self.max_frame})")
                if len(buffer) - start - 4 < size:
                    break
                kind = bytes(view[start + 4 : start + 5])
                if kind not in KINDS:
                    raise FrameError(f"unknown frame kind {kind!r}")
                try:
                    value = msgpack.unpackb(
                        view[start + 5 : start + 4 + size], raw=False, strict_map_key=False
                    )
                except (ValueError, TypeError, msgpack.UnpackException) as exc:
                    raise FrameError(f"frame {kind.decode()} is not valid msgpack: {exc}") from None
                frames.append((kind, value))
                start += 4 + size
        del buffer[:start]
        return frames
