"""The relay log: every event under a gap-free sequence number, newest in memory, older
ones (optionally) in the spool on disk.

The log holds records: an event, or a compact record of several events about one message
or one receiver (event_relay/schema.py, `expand`) numbered by its first sequence number and
the ones after.
Appending is O(1) and never awaits: the encoded record goes to the end of the last memory
segment. Memory holds whole segments (of SEGMENT events, or fewer large ones: a sixteenth
of `memory_bytes` at most, one event past it), and the oldest segment goes when
the log holds more than `memory_events` events or `memory_bytes` bytes; with a spool, each
loop turn's events are written to it as one batch (`flush`), so what memory let go of is
still served from disk, up to the spool's own bounds.

Readers ask for events by sequence number (`read`) and get the records that hold them (the
first may begin before the position asked for); a position before `first_seq` is gone and
is reported as such (`OutOfRange`), never skipped silently.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from array import array
from collections import deque
from collections.abc import Callable, Container, Sequence
from typing import Any

import msgpack

from event_relay.spool import Spool

log = logging.getLogger("nautilus.event_relay")

SEGMENT = 4096  # records per memory segment: the unit in which memory is given back


class OutOfRange(Exception):
    """The events asked for are no longer retained (or not yet written)."""

    def __init__(self, requested: int, first_seq: int, next_seq: int) -> None:
        super().__init__(
            f"sequence {requested} is outside the retained range "
            f"{first_seq}..{next_seq - 1} (the next event will be {next_seq})"
        )
        self.requested = requested
        self.first_seq = first_seq
        self.next_seq = next_seq


def _first_seq(segment: _Segment) -> int:
    return segment.first_seq


class _Segment:
    __slots__ = ("codes", "events", "first_seq", "size", "starts")

    def __init__(self, first_seq: int, events: list[bytes]) -> None:
        self.first_seq = first_seq
        # The encoded records: the list being appended to, a tuple once the segment is
        # full. A tuple of bytes is one the garbage collector stops looking into; a
        # million records in lists cost a QoS 1 flood 4% of the broker's time in GC.
        self.events: Sequence[bytes] = events
        self.codes = bytearray()  # each record's type code, for filtering without decoding
        self.starts = array("q")  # each record's (first) sequence number
        self.size = 0


class EventLog:
    def __init__(
        self,
        *,
        memory_events: int,
        memory_bytes: int,
        spool: Spool | None = None,
        sync: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`sync`: every write to the spool is fsynced (acknowledged durability)."""
        self.memory_events = memory_events
        # A segment also ends at a sixteenth of the memory bound, so that large events
        # are let go of in steps that keep memory near its bound.
        self._segment_bytes = max(memory_bytes // 16, 64 * 1024)
        self.sync = sync
        self.memory_bytes = memory_bytes
        self.loop = loop
        self._begin(1)
        self._held_bytes = 0  # of the full segments (the one being written: its .size)
        self.spool: Spool | None = None
        # (seq, code, count, record) not yet in the spool; None: there is no spool.
        self._unflushed: list[tuple[int, int, int, bytes]] | None = None
        self._pack = msgpack.Packer().pack
        self._listeners: list[Callable[[], None]] = []
        self._turn_due = False  # _end_of_turn is scheduled
        self._turn_wanted = False  # a spool or readers: _end_of_turn has work
        if spool is not None:
            self.use_spool(spool)
        self.lost = 0  # events memory let go of that the spool could not take
        self.appended_bytes = 0  # of every record appended (what readers have to read)

    def _begin(self, next_seq: int) -> None:
        """An empty log whose first event will be `next_seq`."""
        self.next_seq = next_seq
        self._records: list[bytes] = []  # the segment being written's
        self._tail = _Segment(next_seq, self._records)
        self._trim_at = next_seq + self.memory_events  # the seq that makes one too many
        self._segments: deque[_Segment] = deque([self._tail])

    def use_spool(self, spool: Spool) -> None:
        """Keep the events in `spool` too, numbered on from its last one. Called before the
        first event is appended: the relay opens its spool when it starts, not when it is
        built (`nautilus check-config` builds it beside a running broker)."""
        assert self.spool is None and not self._records, "the log already has events"
        self.spool = spool
        self._begin(spool.next_seq)
        self._unflushed = []
        self._turn_wanted = True

    # -- writing ------------------------------------------------------------------------

    def append(self, code: int, values: list[Any]) -> int:
        """Encode and keep one event: `values` are its fields (event_relay.schema), with
        places held for the sequence number (first) and the type code (third), which are
        filled in here. Returns the event's sequence number."""
        values[0] = self.next_seq
        values[2] = code
        return self.append_record(code, self._pack(values), 1)

    def append_record(self, code: int, data: bytes, count: int) -> int:
        """Keep one encoded record of `count` events, numbered from `next_seq` (which its
        encoding carries). Returns its first sequence number. (Per record only this; the
        bounds, the spool and the readers are seen to per segment and per loop turn.)"""
        seq = self.next_seq
        self.next_seq = seq + count
        segment = self._tail
        events = self._records
        events.append(data)
        segment.codes.append(code)
        segment.starts.append(seq)
        segment.size += len(data)
        self.appended_bytes += len(data)
        if self._unflushed is not None:
            self._unflushed.append((seq, code, count, data))
        if self.next_seq > self._trim_at:  # memory_events would be passed: the oldest go
            self._trim_memory()
        if len(events) >= SEGMENT or segment.size >= self._segment_bytes:
            self._segment_full()
        elif self._turn_wanted and not self._turn_due:
            self._turn_due = True
            self._call_soon(self._end_of_turn)
        return seq

    def append_records(
        self, codes: bytes, records: list[bytes], starts: bytes, size: int, next_seq: int
    ) -> None:
        """The compiled recorder's records (event_relay/_recorder.c), handed over at the
        end of a loop turn (or when it holds too many): their type codes, the records
        (their encodings carry their sequence numbers, from `next_seq` on), their first
        sequence numbers (an int64 array's bytes), their size in bytes and the sequence
        number after them. The turn's records are all in, so the readers are served now,
        not a turn later. The segment being written may pass SEGMENT records by a batch."""
        segment = self._tail
        held = len(segment.starts)
        self._records += records
        segment.codes += codes
        segment.starts.frombytes(starts)
        segment.size += size
        self.appended_bytes += size
        if self._unflushed is not None:
            firsts = segment.starts[held:]
            counts = [
                after - first for first, after in zip(firsts, [*firsts[1:], next_seq], strict=True)
            ]
            self._unflushed += zip(firsts, codes, counts, records, strict=True)
        self.next_seq = next_seq
        if next_seq > self._trim_at:
            self._trim_memory()
        if len(self._records) >= SEGMENT or segment.size >= self._segment_bytes:
            self._segment_full()
        elif self._turn_wanted:
            self._end_of_turn()

    def _segment_full(self) -> None:
        """Start a new segment, keep memory within its bounds, and serve the readers now:
        a long loop turn (a flood's fan-out) fills many segments, and readers (and the
        spool) get them as they fill, not only when the turn ends."""
        self._held_bytes += self._tail.size
        self._tail.events = tuple(self._records)
        self._records = []
        self._tail = _Segment(self.next_seq, self._records)
        self._segments.append(self._tail)
        self._trim_memory()
        self._end_of_turn()

    def _end_of_turn(self) -> None:
        """Write this turn's events to the spool, then wake the readers."""
        self._turn_due = False
        self.flush()  # what the readers are woken for is in the spool first
        for callback in list(self._listeners):
            callback()

    def _call_soon(self, callback: Callable[[], Any]) -> None:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        loop.call_soon(callback)

    def _trim_memory(self) -> None:
        """Let the oldest full segments go (never the one being written)."""
        segments = self._segments
        while len(segments) > 1 and (
            self._held_bytes > self.memory_bytes
            or self.next_seq - segments[0].first_seq > self.memory_events
        ):
            if self._unflushed and not self.flush():  # memory lets go: on disk first
                self._lose(segments[0])
            self._held_bytes -= segments.popleft().size
        self._trim_at = segments[0].first_seq + self.memory_events

    def _lose(self, segment: _Segment) -> None:
        """The spool cannot write (a full disk) and memory keeps its bound: the segment's
        unwritten events are lost. What is retained starts after them from now on, so a
        reader that wanted them is told (OutOfRange), never skipped past them."""
        assert self.spool is not None and self._unflushed is not None
        end = self._segments[1].first_seq  # the segment is never the last one
        kept = [entry for entry in self._unflushed if entry[0] >= end]
        self.lost += (kept[0][0] if kept else self.next_seq) - self._unflushed[0][0]
        self._unflushed = kept
        self.spool.raise_floor(end)
        log.error("event spool cannot write: events before %d are lost", end)

    def trim_to(self, seq: int) -> None:
        """Let go of the events before `seq` (consumers have processed them): in the
        spool exactly, in memory the whole segments before it (never the one written)."""
        seq = min(seq, self.next_seq)
        spool = self.spool
        if spool is not None and self.flush():  # what is let go of is on disk first
            spool.raise_floor(seq)
            spool.write([], self.sync)  # the floor now, and the first chunk below it gone
        segments = self._segments
        while len(segments) > 1 and segments[1].first_seq <= seq:
            self._held_bytes -= segments.popleft().size
        self._trim_at = segments[0].first_seq + self.memory_events

    def flush(self) -> bool:
        """Write the events not yet in the spool as one batch. False if the spool could
        not write them (they are kept for the next try)."""
        if self.spool is None or not self._unflushed:
            return True
        if not self.spool.write(self._unflushed, self.sync):
            return False
        self._unflushed = []
        return True

    # -- reading ------------------------------------------------------------------------

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still retained (next_seq when there is none)."""
        if self.spool is not None:
            return min(self.spool.first_seq, self._segments[0].first_seq)
        return self._segments[0].first_seq

    @property
    def memory_first_seq(self) -> int:
        return self._segments[0].first_seq

    def read(
        self,
        start: int,
        limit: int,
        codes: Container[int] | None = None,
        end: int | None = None,
        max_bytes: int = 1 << 62,
    ) -> tuple[list[bytes], int]:
        """Up to `limit` records (and about `max_bytes`: at least one) holding the events
        from sequence `start` (to `end`, exclusive), only of the types in `codes` when
        given. The first record may begin before `start` and the last go past `end`.
        Returns (records, the position to read from next: after the last record looked
        at). Raises OutOfRange when `start` is no longer retained or lies in the future."""
        readable = self.readable_next
        stop = readable if end is None else min(end, readable)
        if start > self.next_seq or start < self.first_seq:
            raise OutOfRange(start, self.first_seq, self.next_seq)
        if start < self.memory_first_seq:
            assert self.spool is not None
            self.flush()
            stop = min(stop, self.memory_first_seq)
            return self.spool.read(start, stop, limit, codes, max_bytes)
        out: list[bytes] = []
        size = 0
        position = start
        segments = self._segments
        index = bisect.bisect_right(segments, position, key=_first_seq) - 1
        while position < stop and len(out) < limit and size < max_bytes and index < len(segments):
            segment = segments[index]
            starts = segment.starts
            after = segments[index + 1].first_seq if index + 1 < len(segments) else self.next_seq
            first = bisect.bisect_right(starts, position) - 1  # the record holding `position`
            last = bisect.bisect_left(starts, stop)  # the records that begin before `stop`
            if codes is None:
                last = min(last, first + limit - len(out))
                chunk = segment.events[first:last]
                chunk_size = sum(map(len, chunk))
                if size + chunk_size > max_bytes:  # rare: large records; cut the chunk
                    chunk = _within(chunk, max_bytes - size, bool(out))
                    chunk_size = sum(map(len, chunk))
                    last = first + len(chunk)
                out += chunk
                size += chunk_size
                position = starts[last] if last < len(starts) else after
                if last < len(starts):
                    break  # stopped inside this segment (limit, bytes or `stop`): done
            else:
                events, kinds = segment.events, segment.codes
                for i in range(first, last):
                    if kinds[i] in codes:
                        if out and size + len(events[i]) > max_bytes:
                            return out, position
                        out.append(events[i])
                        size += len(events[i])
                    position = starts[i + 1] if i + 1 < len(starts) else after
                    if len(out) >= limit:
                        return out, position
                if last < len(starts):
                    break  # the next record begins at or after `stop`
            index += 1
        return out, position

    # -- waking the readers once per loop turn ------------------------------------------

    def listen(self, callback: Callable[[], None]) -> None:
        """Call `callback` (once per loop turn at most) after events were appended."""
        self._listeners.append(callback)
        self._turn_wanted = True

    def unlisten(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)
        self._turn_wanted = bool(self._listeners) or self.spool is not None

    @property
    def readable_next(self) -> int:
        """Readers are served up to here: with a spool, only events already in it, so a
        sequence number a consumer has seen is never given to another event after a
        crash."""
        return self.next_seq if self.spool is None else self.spool.next_seq

    def close(self) -> None:
        self.flush()
        if self.spool is not None:
            self.spool.close()


def _within(events: Sequence[bytes], room: int, have_some: bool) -> Sequence[bytes]:
    """The first events that fit in `room` bytes (at least one unless `have_some`)."""
    size = 0
    for count, data in enumerate(events):
        size += len(data)
        if size > room:
            return events[: count if (count or have_some) else 1]
    return events
