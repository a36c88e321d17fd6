"""Compact records (a message's publish and deliveries, or its deliveries, as one record
under consecutive sequence numbers) through every part that stores or reads them:
schema.expand / event_count / record_codes; the EventLog's memory segments; the Spool on
disk; and end to end, a relay broker with paho clients read by the RelayClient, and the
Courier sidecar push.

The log and spool tests hold the reads to a model of the read contract (`expected_read`):
whole records holding the events from `start`, only of the codes asked for, at most
`limit` of them and about `max_bytes`, and the position after the last record looked at.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from event_relay.client import OutOfRange as ClientOutOfRange
from event_relay.log import SEGMENT, EventLog, OutOfRange
from event_relay.schema import (
    CODES,
    DELIVERIES,
    PUBLISH_DELIVERIES,
    SESSION_EVENTS,
    TYPES,
    decode_event,
    event_count,
    expand,
    record_codes,
)
from event_relay.sidecar_pb.matched_acl_pb2 import MatchedACL
from event_relay.sidecar_pb.on_deliver_pb2 import OnDeliver
from event_relay.spool import STALE_PER_WRITE, Spool
from tests.broker.helpers import PUBLISH, V5, V311, RawClient, publish_packet, unique_id

from .conftest import RECORDERS, UUID4, RelayBroker, Stream, assert_gap_free, flood, with_recorder
from .test_sidecar import Sidecar, memory_log, running

to_thread = asyncio.to_thread

BIG = 1 << 40
TS = 1_700_000_000 * 10**9
ON_PUBLISH = CODES["on_publish"]
ON_DELIVER = CODES["on_deliver"]
ON_COMPLETE = CODES["on_delivery_complete"]
WAKEUP = CODES["on_client_wakeup"]
PLAIN_CODES = (ON_PUBLISH, ON_DELIVER, ON_COMPLETE, WAKEUP, CODES["on_message_drop"])


# --------------------------------------------------------------------------- records


def pack_receivers(receivers: list[list[Any]]) -> bytes:
    """A compact record's receivers bin: their msgpack arrays one after another."""
    return b"".join(msgpack.packb(receiver) for receiver in receivers)


def receivers_of(seq: int, count: int) -> list[list[Any]]:
    """`count` receivers told apart by the record's seq and their place, with every qos,
    both retain flags, both persisted flags, and a receiver without a username."""
    return [
        [
            f"sub-{seq}-{i}",
            "",
            None if i % 3 == 2 else f"user-{i}",
            f"session-{seq}-{i}",
            i % 3,
            i % 2 == 1,
            i % 4 == 3,
        ]
        for i in range(count)
    ]


def items_of(seq: int, count: int) -> list[list[Any]]:
    """`count` items of a SESSION_EVENTS record: deliveries and completions in turn, of
    messages told apart by the record's seq and their place."""
    return [
        [
            ON_DELIVER if i % 2 == 0 else ON_COMPLETE,
            f"drain/{seq}/{i}",
            i,
            b"x" * i,
            "fleet" if i % 3 else "",
            i % 3,
            i % 2 == 1,
            i % 4 == 3,
        ]
        for i in range(count)
    ]


def make_record(code: int, seq: int, receivers: int = 0) -> list[Any]:
    """A record numbered from `seq`: compact (PUBLISH_DELIVERIES, DELIVERIES,
    SESSION_EVENTS) with `receivers` receivers (items), or one plain event of type `code`
    (its own fields made up)."""
    if code == SESSION_EVENTS:
        items = items_of(seq, receivers)
        packed = pack_receivers(items)
        return [seq, TS + seq, code, f"sub-{seq}", "", "bob", f"session-{seq}", receivers, packed]
    if code == PUBLISH_DELIVERIES:
        return [
            seq,
            TS + seq,
            code,
            f"pub-{seq}",
            "",
            "alice",
            f"pub-session-{seq}",
            f"fan/{seq}",
            2,
            False,
            5,
            b"hello",
            "fleet",
            "fan/#",
            receivers,
            pack_receivers(receivers_of(seq, receivers)),
        ]
    if code == DELIVERIES:
        return [
            seq,
            TS + seq,
            code,
            f"queue/{seq}",
            6,
            b"queued",
            "",
            receivers,
            pack_receivers(receivers_of(seq, receivers)),
        ]
    own = TYPES[code][1]
    return [seq, TS + seq, code, f"client-{seq}", "", None, f"s-{seq}"] + [
        f"{name}-{seq}" for name in own
    ]


Spec = tuple[int, int]  # (record code, receivers)


def layout(specs: list[Spec], first: int = 1) -> list[list[Any]]:
    """The records of `specs`, numbered one after another from `first`."""
    records = []
    seq = first
    for code, receivers in specs:
        record = make_record(code, seq, receivers)
        records.append(record)
        seq += event_count(record)
    return records


# Plain events, and compact records of 1 to 6 receivers (a publish with none too).
SPEC = st.one_of(
    st.tuples(st.sampled_from(PLAIN_CODES), st.just(0)),
    st.tuples(st.just(DELIVERIES), st.integers(1, 6)),
    st.tuples(st.just(PUBLISH_DELIVERIES), st.integers(0, 6)),
    st.tuples(st.just(SESSION_EVENTS), st.integers(1, 6)),
)
# A mix with large fan-outs, for the logs that fill segments.
MIX: list[Spec] = [
    (WAKEUP, 0),
    (PUBLISH_DELIVERIES, 3),
    (ON_PUBLISH, 0),
    (DELIVERIES, 2),
    (PUBLISH_DELIVERIES, 1),
    (ON_COMPLETE, 0),
    (DELIVERIES, 5),
    (SESSION_EVENTS, 4),
]


def mix(count: int, offset: int = 0) -> list[Spec]:
    return [MIX[(i + offset) % len(MIX)] for i in range(count)]


# --------------------------------------------------------------------------- schema


def test_expand_spells_out_each_event_of_compact_records():
    receivers: list[list[Any]] = [
        ["sub-a", "", "alice", "sa", 0, False, False],
        ["sub-b", "", None, "sb", 1, True, True],
        ["sub-c", "", "carol", "sc", 2, False, True],
    ]
    publish_deliveries = [
        10,
        TS,
        PUBLISH_DELIVERIES,
        "pub",
        "",
        "bob",
        "sp",
        "fan/x",
        2,
        True,
        5,
        b"hello",
        "fleet",
        "fan/#",
        3,
        pack_receivers(receivers),
    ]
    deliveries = [14, TS + 1, DELIVERIES, "queue/y", 2, b"hi", "", 2, pack_receivers(receivers[1:])]
    wakeup = [16, TS + 2, WAKEUP, "c", "", None, "s"]
    # Through msgpack, as the log keeps them and readers decode them.
    records = [msgpack.unpackb(msgpack.packb(r)) for r in (publish_deliveries, deliveries, wakeup)]
    assert [event_count(r) for r in records] == [4, 2, 1]

    message = ["fan/x", 5, b"hello", "fleet"]
    events = expand(records)
    assert events == [
        [
            10,
            TS,
            ON_PUBLISH,
            "pub",
            "",
            "bob",
            "sp",
            "fan/x",
            2,
            True,
            5,
            b"hello",
            "fleet",
            "fan/#",
        ],
        [11, TS, ON_DELIVER, "sub-a", "", "alice", "sa", "fan/x", 0, False, *message[1:], False],
        [12, TS, ON_DELIVER, "sub-b", "", None, "sb", "fan/x", 1, True, *message[1:], True],
        [13, TS, ON_DELIVER, "sub-c", "", "carol", "sc", "fan/x", 2, False, *message[1:], True],
        [14, TS + 1, ON_DELIVER, "sub-b", "", None, "sb", "queue/y", 1, True, 2, b"hi", "", True],
        [
            15,
            TS + 1,
            ON_DELIVER,
            "sub-c",
            "",
            "carol",
            "sc",
            "queue/y",
            2,
            False,
            2,
            b"hi",
            "",
            True,
        ],
        [16, TS + 2, WAKEUP, "c", "", None, "s"],
    ]
    # Each is an event like any other: decode_event names its fields.
    assert decode_event(events[0]) == {
        "seq": 10,
        "ts": TS,
        "type": "on_publish",
        "client_id": "pub",
        "mountpoint": "",
        "username": "bob",
        "session_id": "sp",
        "topic": "fan/x",
        "qos": 2,
        "retain": True,
        "payload_size": 5,
        "payload": b"hello",
        "acl_name": "fleet",
        "acl_pattern": "fan/#",
    }
    assert decode_event(events[2]) == {
        "seq": 12,
        "ts": TS,
        "type": "on_deliver",
        "client_id": "sub-b",
        "mountpoint": "",
        "username": None,
        "session_id": "sb",
        "topic": "fan/x",
        "qos": 1,
        "retain": True,
        "payload_size": 5,
        "payload": b"hello",
        "acl_name": "fleet",
        "persisted": True,
    }

    # start / end cut inside records: only start <= seq < end.
    assert expand(records, 12) == events[2:]
    assert expand(records, 12, 15) == events[2:5]
    assert expand(records, 11, 12) == [events[1]]
    assert expand(records, 15, 16) == [events[5]]
    assert expand(records, 0, 10) == []
    assert expand(records, 17) == []
    assert expand(records, 13, 13) == []
    assert expand([records[1]], 15) == [events[5]]
    # and by type: a compact record holds types a reader may not want.
    assert expand(records, codes={ON_PUBLISH}) == [events[0]]
    assert expand(records, 12, codes={ON_DELIVER}) == events[2:6]
    assert expand(records, codes={WAKEUP}) == [events[6]]


def test_a_publish_record_without_receivers_is_its_publish():
    record = make_record(PUBLISH_DELIVERIES, 7, 0)
    assert event_count(record) == 1
    (event,) = expand([record])
    assert event[:3] == [7, TS + 7, ON_PUBLISH] and len(event) == 7 + len(TYPES[3][1])


def test_record_codes_add_the_compact_records_that_hold_the_types_asked_for():
    compact = {DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS}
    assert record_codes(frozenset({ON_DELIVER})) == {ON_DELIVER, *compact}
    assert record_codes(frozenset({ON_PUBLISH})) == {ON_PUBLISH, PUBLISH_DELIVERIES}
    assert record_codes(frozenset({ON_PUBLISH, ON_DELIVER})) == {ON_PUBLISH, ON_DELIVER, *compact}
    assert record_codes(frozenset({ON_COMPLETE, WAKEUP})) == {ON_COMPLETE, WAKEUP, SESSION_EVENTS}
    assert record_codes(frozenset()) == frozenset()
    assert record_codes(frozenset(TYPES)) == frozenset(TYPES) | compact


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(SPEC, max_size=25),
    first=st.integers(1, 1 << 40),
    cut=st.tuples(st.integers(-3, 120), st.integers(-3, 120)),
)
def test_expand_counts_and_numbers_every_event(specs, first, cut):
    records = [msgpack.unpackb(msgpack.packb(r)) for r in layout(specs, first)]
    events = expand(records)
    assert sum(event_count(r) for r in records) == len(events)
    assert [e[0] for e in events] == list(range(first, first + len(events)))
    assert all(e[2] in TYPES for e in events)
    # Record by record: the same events, each record's from its own seq on.
    by_record = [expand([r]) for r in records]
    assert [e for part in by_record for e in part] == events
    assert all(part[0][0] == r[0] for part, r in zip(by_record, records, strict=True))
    start, end = first + cut[0], first + cut[1]
    assert expand(records, start, end) == [e for e in events if start <= e[0] < end]
    assert expand(records, start) == [e for e in events if start <= e[0]]


# --------------------------------------------------------------------------- the read model


@dataclass
class Held:
    """What a log or spool was given, in order: the records, their encoded sizes."""

    records: list[list[Any]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    next_seq: int = 1

    def add(self, record: list[Any]) -> bytes:
        assert record[0] == self.next_seq
        data: bytes = msgpack.packb(record)
        self.records.append(record)
        self.sizes.append(len(data))
        self.starts.append(record[0])
        self.next_seq = record[0] + event_count(record)
        return data

    def end_of(self, index: int) -> int:
        """The seq after the record at `index`."""
        return self.starts[index + 1] if index + 1 < len(self.starts) else self.next_seq

    def record_at(self, seq: int) -> int:
        """The index of the record holding `seq`."""
        return bisect_right(self.starts, seq) - 1

    def events(self, start: int = 0, end: int | None = None) -> list[list[Any]]:
        first = max(self.record_at(start), 0)
        last = len(self.starts) if end is None else bisect_left(self.starts, end)
        return expand(self.records[first:last], start, end)


def expected_read(
    held: Held,
    start: int,
    stop: int,
    limit: int = BIG,
    codes: Container[int] | None = None,
    max_bytes: int = BIG,
) -> tuple[list[list[Any]], int]:
    """What a read must give: the records holding the events start <= seq < stop, of
    `codes`, up to `limit` records and `max_bytes` (at least one), and the position after
    the last record looked at (the start of the first one that did not fit)."""
    if start >= stop:
        return [], start
    first, last = held.record_at(start), bisect_left(held.starts, stop)
    position = held.end_of(last - 1)
    taken: list[list[Any]] = []
    size = 0
    for index in range(first, last):
        record = held.records[index]
        if codes is not None and record[2] not in codes:
            continue
        if taken and size + held.sizes[index] > max_bytes:
            return taken, held.starts[index]
        taken.append(record)
        size += held.sizes[index]
        if len(taken) >= limit:
            return taken, held.end_of(index)
    return taken, position


def decoded(raws: list[bytes]) -> list[list[Any]]:
    return [msgpack.unpackb(raw) for raw in raws]


Read = Callable[[int, int, int, Container[int] | None, int], tuple[list[bytes], int]]


def log_reader(log: EventLog) -> Read:
    """(start, end, limit, codes, max_bytes) -> EventLog.read."""
    return lambda start, end, limit, codes, max_bytes: log.read(start, limit, codes, end, max_bytes)


def spool_reader(spool: Spool) -> Read:
    """Spool.read up to `end`, or the spool's end (as the log asks it)."""
    return lambda start, end, limit, codes, max_bytes: spool.read(
        start, min(end, spool.next_seq), limit, codes, max_bytes
    )


def check_read(
    read: Read,
    held: Held,
    start: int,
    end: int,
    *,
    limit: int = BIG,
    codes: Container[int] | None = None,
    max_bytes: int = BIG,
    split: int = 0,
) -> tuple[list[list[Any]], int]:
    """One read held to the model. `split`: a log's memory_first_seq, where a read from
    the spool below it stops. Returns the records it gave and its position."""
    stop = min(end, held.next_seq)
    if start < split:
        stop = min(stop, split)
    raws, position = read(start, end, limit, codes, max_bytes)
    got = (decoded(raws), position)
    assert got == expected_read(held, start, stop, limit, codes, max_bytes), (
        start,
        end,
        limit,
        codes,
        max_bytes,
    )
    return got


def read_all(
    read: Read,
    held: Held,
    start: int,
    end: int,
    *,
    limit: int = BIG,
    codes: frozenset[int] | None = None,
    max_bytes: int = BIG,
    split: int = 0,
) -> list[list[Any]]:
    """Reads from `start` on, each held to the model, until `end` (or the end): the
    events they gave (of the types of `codes`), from `start`, before `end`."""
    stop = min(end, held.next_seq)
    records: list[list[Any]] = []
    position = start
    while position < stop:
        got, after = check_read(
            read,
            held,
            position,
            end,
            limit=limit,
            codes=codes,
            max_bytes=max_bytes,
            split=split,
        )
        assert after > position
        records += got
        position = after
    events = expand(records, start, end)
    if codes is not None:
        events = [e for e in events if e[2] in codes]
    return events


def append_records(log: EventLog, held: Held, specs: list[Spec]) -> list[list[Any]]:
    """One record at a time (append_record), each encoding log.next_seq."""
    records = []
    for code, receivers in specs:
        record = make_record(code, log.next_seq, receivers)
        data = held.add(record)
        assert log.append_record(code, data, event_count(record)) == record[0]
        records.append(record)
    assert log.next_seq == held.next_seq
    return records


def append_batch(log: EventLog, held: Held, specs: list[Spec]) -> list[list[Any]]:
    """One append_records call, as the compiled recorder hands a turn's records over:
    their codes, encodings, first seqs (an int64 array's bytes), size and the next seq."""
    records = layout(specs, log.next_seq)
    datas = [held.add(record) for record in records]
    starts = array("q", [record[0] for record in records]).tobytes()
    codes = bytes(record[2] for record in records)
    log.append_records(codes, datas, starts, sum(map(len, datas)), held.next_seq)
    assert log.next_seq == held.next_seq
    return records


CODE_SETS: list[frozenset[int] | None] = [
    None,
    record_codes(frozenset({ON_DELIVER})),
    record_codes(frozenset({ON_PUBLISH})),
    record_codes(frozenset({ON_COMPLETE, WAKEUP})),
    frozenset({DELIVERIES}),
    frozenset({SESSION_EVENTS}),
]


# --------------------------------------------------------------------------- the log


def test_log_reads_begin_and_end_inside_records():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    held = Held()
    append_records(log, held, mix(9))
    append_batch(log, held, mix(6, offset=3))
    append_records(log, held, [(PUBLISH_DELIVERIES, 4)])  # the last record is compact
    events = held.events()
    assert [e[0] for e in events] == list(range(1, log.next_seq))
    read = log_reader(log)

    for start in range(1, log.next_seq + 1):
        for end in range(start, log.next_seq + 3):
            records, position = check_read(read, held, start, end)
            # The events asked for, whole records around them.
            assert expand(records, start, end) == events[start - 1 : end - 1]
            if start < end and start < log.next_seq:
                assert records[0][0] <= start < records[0][0] + event_count(records[0])
                assert position >= min(end, log.next_seq)
        for codes in CODE_SETS[1:]:
            for end in (start + 1, start + 4, log.next_seq):
                check_read(read, held, start, end, codes=codes)
    # With no end: to the end of the log.
    raws, position = log.read(12, BIG)
    assert expand(decoded(raws), 12) == events[11:] and position == log.next_seq


@pytest.mark.parametrize("codes", CODE_SETS, ids=["all", "deliver", "publish", "other", "14", "16"])
def test_log_reads_page_by_limit_and_bytes(codes):
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    held = Held()
    append_records(log, held, mix(40))
    read = log_reader(log)
    wanted = [e for e in held.events() if codes is None or e[2] in codes]
    sizes = sorted(held.sizes)
    for limit in (1, 2, 5, BIG):
        for max_bytes in (1, sizes[len(sizes) // 2], 3 * sizes[-1], BIG):
            for start in (1, 3, 4, 6, 17, 30):
                got = read_all(
                    read, held, start, BIG, limit=limit, codes=codes, max_bytes=max_bytes
                )
                assert got == [e for e in wanted if e[0] >= start]
                end = start + 23
                got = read_all(
                    read, held, start, end, limit=limit, codes=codes, max_bytes=max_bytes
                )
                assert got == [e for e in wanted if start <= e[0] < end]


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(SPEC, min_size=1, max_size=30),
    batch=st.integers(0, 30),
    start=st.integers(0, 200),
    length=st.integers(0, 200),
    limit=st.integers(1, 8),
    codes=st.sampled_from(CODE_SETS),
    max_bytes=st.sampled_from([1, 60, 200, 600, BIG]),
)
def test_log_reads_match_the_model(specs, batch, start, length, limit, codes, max_bytes):
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    held = Held()
    append_records(log, held, specs[:batch])
    append_batch(log, held, specs[batch:])
    start = 1 + start % log.next_seq  # 1 .. next_seq
    end = start + length
    read = log_reader(log)
    check_read(read, held, start, end, limit=limit, codes=codes, max_bytes=max_bytes)
    got = read_all(read, held, start, end, limit=limit, codes=codes, max_bytes=max_bytes)
    assert got == [e for e in held.events(start, end) if codes is None or e[2] in codes]


def test_log_reads_across_segment_boundaries():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    held = Held()
    # The last record of each segment (of SEGMENT records) is a fan-out of 6 receivers.
    specs = mix(2 * SEGMENT + 300)
    specs[SEGMENT - 1] = specs[2 * SEGMENT - 1] = (PUBLISH_DELIVERIES, 6)
    specs[SEGMENT] = (DELIVERIES, 4)  # and the first of the second a compact one
    append_records(log, held, specs)
    read = log_reader(log)
    events = held.events()
    assert [e[0] for e in events] == list(range(1, log.next_seq))

    raws, position = log.read(1, BIG)
    assert decoded(raws) == held.records and position == log.next_seq

    for boundary in (SEGMENT, 2 * SEGMENT):  # the first record of a segment
        edge = held.starts[boundary]
        low, high = held.starts[boundary - 2], held.end_of(boundary + 1)
        for start in range(low, high + 1):
            for end in range(start, high + 3):
                check_read(read, held, start, end)
            for codes in CODE_SETS[1:]:
                check_read(read, held, start, high + 2, codes=codes)
            for limit in (1, 2, 3):
                check_read(read, held, start, BIG, limit=limit)
                check_read(read, held, start, BIG, limit=limit, codes=CODE_SETS[1])
            size = held.sizes[boundary - 1]
            check_read(read, held, start, BIG, max_bytes=size + 1)
            check_read(read, held, start, high, max_bytes=size + 1, codes=CODE_SETS[2])
        # Paged by records and bytes across it, from inside the segment's last record.
        start = edge - 3
        for codes in CODE_SETS:
            got = read_all(read, held, start, edge + 40, limit=4, codes=codes, max_bytes=500)
            assert got == [e for e in events[start - 1 : edge + 39] if not codes or e[2] in codes]

    # The segments end after SEGMENT records: letting go of what is before a segment's
    # first record lets the whole segment before it go.
    log.trim_to(held.starts[SEGMENT] + 2)
    assert log.first_seq == held.starts[SEGMENT]
    with pytest.raises(OutOfRange):
        log.read(held.starts[SEGMENT] - 1, 10)
    got = read_all(read, held, log.first_seq + 2, BIG, limit=1000)
    assert got == events[log.first_seq + 1 :]


def test_memory_lets_go_of_whole_segments_by_memory_events():
    memory_events = 6 * SEGMENT  # 2.6 segments of MIX (16 events per 7 records)
    log = EventLog(memory_events=memory_events, memory_bytes=BIG)
    held = Held()
    segment_starts = [1]
    trimmed = False
    for spec in mix(6 * SEGMENT):
        append_records(log, held, [spec])
        if len(held.records) % SEGMENT == 0:
            segment_starts.append(log.next_seq)
        first = log.first_seq
        assert log.next_seq - first <= memory_events
        if first > 1:
            trimmed = True
            assert first in segment_starts  # whole segments go, at record starts
            before = segment_starts[segment_starts.index(first) - 1]
            assert log.next_seq - before > memory_events  # and no more than needed
    assert trimmed and log.first_seq > 3 * SEGMENT
    with pytest.raises(OutOfRange):
        log.read(log.first_seq - 1, 10)
    read = log_reader(log)
    first = log.first_seq
    assert read_all(read, held, first, BIG, limit=3000) == held.events(first)
    check_read(read, held, first + 1, first + 50)


def test_a_batch_may_push_a_segment_past_segment_records():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    held = Held()
    append_records(log, held, [(WAKEUP, 0)] * (SEGMENT - 3))
    batch = append_batch(log, held, mix(10))  # the segment ends after all ten
    after_batch = log.next_seq
    append_records(log, held, mix(SEGMENT + 5, offset=2))
    assert [e[0] for e in held.events()] == list(range(1, log.next_seq))
    read = log_reader(log)
    for start in range(batch[0][0] - 2, after_batch + 8):
        check_read(read, held, start, after_batch + 10)
        check_read(read, held, start, BIG, limit=3)
        check_read(read, held, start, BIG, codes=CODE_SETS[1], limit=2)
    assert read_all(read, held, 1, BIG, limit=500) == held.events()

    log.trim_to(after_batch - 1)  # inside the batch's segment: memory keeps it whole
    assert log.first_seq == 1
    log.trim_to(after_batch)
    assert log.first_seq == after_batch  # the segment ended with the batch
    assert read_all(read, held, after_batch, BIG, limit=500) == held.events(after_batch)


def test_memory_bounds_count_every_event_of_a_batch():
    log = EventLog(memory_events=SEGMENT, memory_bytes=BIG)
    held = Held()
    append_batch(log, held, [(PUBLISH_DELIVERIES, 5)] * SEGMENT)  # 6 events each: one segment
    assert log.next_seq == 6 * SEGMENT + 1
    append_records(log, held, [(WAKEUP, 0)])
    # The full segment held 6 * SEGMENT events, more than memory_events: it went.
    assert log.first_seq == 6 * SEGMENT + 1
    check_read(log_reader(log), held, log.first_seq, BIG)


# --------------------------------------------------------------------------- the spool


def write_specs(spool: Spool, held: Held, specs: list[Spec]) -> list[list[Any]]:
    records = layout(specs, held.next_seq)
    entries = [(r[0], r[2], event_count(r), held.add(r)) for r in records]
    assert spool.write(entries)
    return records


def keys_on_disk(spool: Spool) -> list[int]:
    with spool.db.iterator(prefix=b"e", include_value=False) as keys:
        return [int.from_bytes(key[1:], "big") for key in keys]


def test_spool_reads_begin_and_end_inside_records(tmp_path):
    spool = Spool(str(tmp_path / "spool"), max_events=BIG)
    held = Held()
    write_specs(spool, held, mix(8))
    write_specs(spool, held, [*mix(7, offset=4), (DELIVERIES, 3)])
    assert (spool.first_seq, spool.next_seq) == (1, held.next_seq)
    assert keys_on_disk(spool) == held.starts  # one key per record
    read = spool_reader(spool)
    events = held.events()
    for start in range(1, spool.next_seq):
        for end in range(start + 1, spool.next_seq + 1):
            check_read(read, held, start, end)
            raws, _ = spool.read(start, end, BIG)
            assert expand(decoded(raws), start, end) == events[start - 1 : end - 1]
        for codes in CODE_SETS[1:]:
            check_read(read, held, start, spool.next_seq, codes=codes)
            check_read(read, held, start, spool.next_seq, codes=codes, limit=1)
        for limit in (1, 2):
            check_read(read, held, start, spool.next_seq, limit=limit)
        check_read(read, held, start, spool.next_seq, max_bytes=150)
    for codes in CODE_SETS:
        got = read_all(read, held, 5, spool.next_seq, limit=2, codes=codes, max_bytes=200)
        assert got == [e for e in events[4:] if codes is None or e[2] in codes]
    spool.close()


def test_raise_floor_inside_a_record_keeps_that_record(tmp_path):
    path = str(tmp_path / "spool")
    spool = Spool(path, max_events=BIG)
    held = Held()
    write_specs(spool, held, [(WAKEUP, 0), (PUBLISH_DELIVERIES, 4), (DELIVERIES, 3), (WAKEUP, 0)])
    assert held.starts == [1, 2, 7, 10]
    spool.raise_floor(4)  # inside the fan-out 2..6
    assert spool.first_seq == 2
    read = spool_reader(spool)
    assert read_all(read, held, 4, BIG) == held.events(4)
    check_read(read, held, 2, BIG)
    spool.raise_floor(3)  # below the floor already
    assert spool.first_seq == 2
    assert spool.write([])  # the floor, and what is below it deleted
    assert keys_on_disk(spool) == [2, 7, 10]
    spool.raise_floor(8)  # inside the deliveries 7..9
    assert spool.write([])
    assert (spool.first_seq, keys_on_disk(spool)) == (7, [7, 10])
    assert read_all(read, held, 8, BIG) == held.events(8)
    spool.close()

    again = Spool(path, max_events=BIG)
    assert (again.first_seq, again.next_seq) == (7, 11)
    assert read_all(spool_reader(again), held, 7, BIG) == held.events(7)
    again.close()


def test_a_floor_inside_a_record_survives_a_reopen_before_what_is_below_is_gone(tmp_path):
    """What is below the floor goes a chunk of seqs per write: a reopen before a record
    below it is gone still starts at the record holding the floor."""
    path = str(tmp_path / "spool")
    spool = Spool(path, max_events=BIG)
    held = Held()
    big = STALE_PER_WRITE + 1000
    write_specs(spool, held, [(WAKEUP, 0), (DELIVERIES, big), (WAKEUP, 0), (DELIVERIES, 5)])
    write_specs(spool, held, [(WAKEUP, 0)])
    stale, floor_record = held.starts[2], held.starts[3]
    assert stale > STALE_PER_WRITE
    spool.raise_floor(floor_record + 2)
    assert spool.first_seq == floor_record
    assert spool.write([])  # the floor, and the first chunk below it deleted
    assert keys_on_disk(spool) == [stale, floor_record, held.starts[4]]
    spool.close()

    again = Spool(path, max_events=BIG)
    assert (again.first_seq, again.next_seq) == (floor_record, held.next_seq)
    read = spool_reader(again)
    assert read_all(read, held, floor_record + 2, BIG) == held.events(floor_record + 2)
    assert read_all(read, held, floor_record, BIG) == held.events(floor_record)
    assert again.write([])  # the rest below the floor
    assert keys_on_disk(again) == [floor_record, held.starts[4]]
    again.close()


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(SPEC, min_size=1, max_size=8), min_size=1, max_size=8),
    max_events=st.integers(1, 25),
)
def test_trimming_by_max_events_never_cuts_a_record(batches, max_events):
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "spool")
        spool = Spool(path, max_events=max_events)
        held = Held()
        for batch in batches:
            write_specs(spool, held, batch)
            first = spool.first_seq
            # The record holding the first seq that max_events keeps is kept whole.
            keep_from = max(1, spool.next_seq - max_events)
            assert first == held.starts[held.record_at(keep_from)]
            assert spool.next_seq == held.next_seq
            assert keys_on_disk(spool) == [s for s in held.starts if s >= first]
            read = spool_reader(spool)
            assert read_all(read, held, first, BIG) == held.events(first)  # none missing
            check_read(read, held, first, BIG, limit=1)
        spool.close()
        again = Spool(path, max_events=max_events)
        assert (again.first_seq, again.next_seq) == (first, held.next_seq)
        again.close()


def test_a_reopened_spool_goes_on_after_its_last_compact_record(tmp_path):
    path = str(tmp_path / "spool")
    spool = Spool(path, max_events=BIG)
    held = Held()
    write_specs(spool, held, [(WAKEUP, 0), (ON_PUBLISH, 0), (PUBLISH_DELIVERIES, 3)])
    assert spool.next_seq == 7
    spool.close()

    async def scenario() -> None:
        again = Spool(path, max_events=BIG)
        assert (again.first_seq, again.next_seq) == (1, 7)
        log = EventLog(memory_events=BIG, memory_bytes=BIG, spool=again)
        assert (log.first_seq, log.next_seq) == (1, 7)
        append_records(log, held, [(DELIVERIES, 2), (WAKEUP, 0)])
        assert held.starts[-2:] == [7, 9]
        log.flush()
        # Readers get the spool's records and the new ones alike, from inside either.
        assert log.memory_first_seq == 7
        got = read_all(log_reader(log), held, 5, BIG, split=7)
        assert got == held.events(5)
        log.close()

    asyncio.run(scenario())
    last = Spool(path, max_events=BIG)
    assert (last.first_seq, last.next_seq) == (1, 10)
    assert read_all(spool_reader(last), held, 8, BIG) == held.events(8)
    last.close()


def test_the_log_serves_mid_record_reads_from_the_spool(tmp_path):
    async def scenario() -> None:
        spool = Spool(str(tmp_path / "spool"), max_events=BIG)
        log = EventLog(memory_events=1, memory_bytes=BIG, spool=spool)
        held = Held()
        specs = mix(SEGMENT + 200)
        specs[SEGMENT - 1] = (PUBLISH_DELIVERIES, 6)
        specs[SEGMENT + 9] = (DELIVERIES, 6)  # the last record memory let go of
        append_records(log, held, specs[: SEGMENT - 5])
        append_batch(log, held, specs[SEGMENT - 5 : SEGMENT + 10])
        append_records(log, held, specs[SEGMENT + 10 :])
        log.flush()
        memory_first = log.memory_first_seq
        assert memory_first == held.starts[SEGMENT + 10]  # after the batch's segment
        assert log.first_seq == 1
        read = log_reader(log)
        edge = held.starts[SEGMENT - 1]  # the fan-out, on disk only
        disk = held.starts[SEGMENT + 9]
        for start in [*range(edge - 4, edge + 8), *range(disk - 2, memory_first + 3)]:
            # From disk, a read stops where memory begins (split).
            for end in (start + 1, start + 3, memory_first + 5, BIG):
                check_read(read, held, start, end, split=memory_first)
            check_read(read, held, start, BIG, limit=2, codes=CODE_SETS[1], split=memory_first)
            check_read(read, held, start, BIG, codes=CODE_SETS[2], split=memory_first)
            size = held.sizes[SEGMENT - 1] - 1
            check_read(read, held, start, BIG, max_bytes=size, split=memory_first)
        for codes in CODE_SETS:
            got = read_all(
                read, held, edge + 2, BIG, limit=3, codes=codes, max_bytes=400, split=memory_first
            )
            assert got == [e for e in held.events(edge + 2) if codes is None or e[2] in codes]
        log.close()

    asyncio.run(scenario())


def test_a_small_spool_under_the_log_keeps_whole_records(tmp_path):
    async def scenario() -> None:
        spool = Spool(str(tmp_path / "spool"), max_events=SEGMENT // 2)
        log = EventLog(memory_events=1, memory_bytes=BIG, spool=spool)
        held = Held()
        append_records(log, held, mix(SEGMENT + 40))
        log.flush()
        first = log.first_seq
        assert first == spool.first_seq > 1
        assert first in held.starts
        assert held.next_seq - first >= SEGMENT // 2
        with pytest.raises(OutOfRange):
            log.read(first - 1, 10)
        got = read_all(log_reader(log), held, first, BIG, limit=700, split=log.memory_first_seq)
        assert got == held.events(first)
        log.close()

    asyncio.run(scenario())


def test_an_empty_range_inside_a_record_holds_no_record(tmp_path):
    """read(s, end=s) asks for no event: from memory or from the spool alike, no record
    and the position where it began."""

    async def scenario() -> None:
        spool = Spool(str(tmp_path / "spool"), max_events=BIG)
        log = EventLog(memory_events=1, memory_bytes=BIG, spool=spool)
        held = Held()
        append_records(log, held, mix(SEGMENT + 20))
        log.flush()
        memory_first = log.memory_first_seq
        assert memory_first == held.starts[SEGMENT]
        # The second event of each compact record of two or more.
        inside = [
            record[0] + 1
            for index, record in enumerate(held.records)
            if record[2] in (DELIVERIES, PUBLISH_DELIVERIES) and held.end_of(index) - record[0] > 1
        ]
        in_memory = [seq for seq in inside if seq > memory_first][:5]
        on_disk = [seq for seq in inside if seq < memory_first][-5:]
        assert len(in_memory) == len(on_disk) == 5
        for seq in in_memory + on_disk:
            assert log.read(seq, 10, end=seq) == ([], seq), seq
            assert log.read(seq, 10, codes=CODE_SETS[1], end=seq) == ([], seq), seq
        log.close()

    asyncio.run(scenario())


class FullDisk(Spool):
    """A real LevelDB spool whose writes fail while `full` (as tests/event_relay/
    test_spool_full.py has it)."""

    full = False

    def write(self, records: list[tuple[int, int, int, bytes]], sync: bool = False) -> bool:
        if self.full:
            self.failed = True
            return False
        return super().write(records, sync)


def test_events_of_records_memory_lets_go_of_unwritten_are_counted_lost(tmp_path):
    async def scenario() -> None:
        spool = FullDisk(str(tmp_path / "spool"), max_events=BIG)
        log = EventLog(memory_events=1, memory_bytes=BIG, spool=spool)
        held = Held()
        append_records(log, held, mix(10))
        log.flush()
        spool.full = True
        append_records(log, held, mix(SEGMENT + 5, offset=3))
        memory_first = log.memory_first_seq
        assert memory_first == held.starts[SEGMENT]
        # Every event of the records not written (compact ones count all theirs).
        assert log.lost == memory_first - held.starts[10]
        assert log.first_seq == memory_first
        with pytest.raises(OutOfRange):
            log.read(memory_first - 1, 10)
        spool.full = False
        assert log.flush()
        check_read(log_reader(log), held, memory_first, BIG)
        log.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- end to end


@dataclass
class FanOut:
    """A relay broker, three subscribers to fan/# at QoS 0, 1, 2 and a publisher."""

    broker: RelayBroker
    subscribers: list[Any]  # PahoClient, in the order of their QoS
    publisher: Any

    def publish(self, topic: str, payload: bytes, qos: int = 2) -> None:
        """Publish, and wait until every subscriber has the message."""
        self.publisher.publish(topic, payload, qos)
        for sub in self.subscribers:
            received = sub.expect_message()
            assert (received.topic, received.payload) == (topic, payload)


def fan_out_of(broker: RelayBroker, paho_client: Any, subscribers: int = 3) -> FanOut:
    subs = []
    for qos in range(subscribers):
        sub = paho_client(broker, (V311, V5)[qos % 2], unique_id(f"sub{qos}"))
        assert sub.subscribe("fan/#", qos % 3) == [qos % 3]
        subs.append(sub)
    return FanOut(broker, subs, paho_client(broker, V5, unique_id("pub")))


@pytest.fixture(params=RECORDERS)
def fan_out(request, relay_broker, paho_client) -> FanOut:
    return fan_out_of(with_recorder(relay_broker, request.param), paho_client)


def check_fan_out(fan: FanOut, events: list[dict[str, Any]], topic: str, payload: bytes) -> None:
    """on_publish by the publisher, then one on_deliver per subscriber (their QoS, not
    persisted: the memory store), numbered one after another."""
    publish, *delivers = events
    assert_gap_free(events)
    assert (publish["type"], publish["client_id"]) == ("on_publish", fan.publisher.client_id)
    assert (publish["topic"], publish["payload"], publish["qos"]) == (topic, payload, 2)
    assert all(d["type"] == "on_deliver" for d in delivers)
    assert sorted((d["client_id"], d["qos"], d["persisted"]) for d in delivers) == sorted(
        (sub.client_id, qos, False) for qos, sub in enumerate(fan.subscribers)
    )
    for d in delivers:
        assert (d["topic"], d["payload"], d["payload_size"]) == (topic, payload, len(payload))
        assert d["mountpoint"] == "" and d["username"] is None and UUID4.match(d["session_id"])
        assert d["ts"] == publish["ts"]  # one record: one ts
    assert len({d["session_id"] for d in delivers}) == len(delivers)


def test_a_fan_out_is_one_record_streamed_as_publish_then_its_deliveries(fan_out):
    fan = fan_out
    start = fan.broker.next_seq()

    async def scenario() -> None:
        async with await fan.broker.connect(start=start) as client:
            stream = Stream(client)
            await to_thread(fan.publish, "fan/a", b"one")
            events = await stream.take(4)
            check_fan_out(fan, events, "fan/a", b"one")
            assert events[0]["seq"] == start
            # Then a delivery complete for each subscriber at QoS 1 and 2, in any order.
            completes = await stream.take(2)
            assert_gap_free(events + completes)
            assert {(c["type"], c["client_id"]) for c in completes} == {
                ("on_delivery_complete", sub.client_id) for sub in fan.subscribers[1:]
            }
        async with await fan.broker.connect(start=None) as reader:
            records, position = await reader.read_raw(start, start + 4)
            (record,) = records
            assert (record[0], record[2], record[14]) == (start, PUBLISH_DELIVERIES, 3)
            assert position == start + 4
            assert [decode_event(e) | {"node": "nautilus"} for e in expand(records)] == events

    asyncio.run(scenario())


@pytest.mark.parametrize("recorder", RECORDERS)
def test_stored_messages_are_delivered_as_persisted_deliveries(
    relay_broker, paho_client, tmp_path, recorder
):
    store = {"backend": "leveldb", "path": str(tmp_path / "store")}
    broker = with_recorder(relay_broker, recorder, store=store)
    online = paho_client(broker, V311, unique_id("online"))
    assert online.subscribe("keep/#", 1) == [1]
    keeper_id = unique_id("keeper")
    keeper = paho_client(broker, V311, keeper_id, clean=False)
    assert keeper.subscribe("keep/#", 1) == [1]
    keeper.disconnect()
    pub = paho_client(broker, V311, unique_id("pub"))
    start = broker.next_seq()

    async def scenario() -> None:
        async with await broker.connect(start=start) as client:
            stream = Stream(client)
            for n in range(2):
                await to_thread(pub.publish, "keep/x", b"kept %d" % n, 1)
                assert (await to_thread(online.expect_message)).payload == b"kept %d" % n
            # Each: on_publish, on_deliver (online) and on_offline_message (the keeper)
            # in the order the router took them, then the online delivery's complete.
            sent = await stream.take(8)
            assert_gap_free(sent, first=start)
            kinds = [e["type"] for e in sent]
            assert kinds.count("on_deliver") == 2 and kinds.count("on_offline_message") == 2
            assert [e["persisted"] for e in sent if e["type"] == "on_deliver"] == [False] * 2

            back = await to_thread(paho_client, broker, V311, keeper_id, clean=False)
            for n in range(2):
                assert (await to_thread(back.expect_message)).payload == b"kept %d" % n
            register, wakeup, *rest = await stream.take(6)
            assert (register["type"], wakeup["type"]) == ("on_register", "on_client_wakeup")
            delivers = [e for e in rest if e["type"] == "on_deliver"]
            assert [(d["client_id"], d["payload"], d["qos"], d["persisted"]) for d in delivers] == [
                (keeper_id, b"kept 0", 1, True),
                (keeper_id, b"kept 1", 1, True),
            ]
            assert_gap_free([*sent, register, wakeup, *rest], first=start)
        async with await broker.connect(start=None) as reader:
            records, _ = await reader.read_raw(delivers[0]["seq"], delivers[1]["seq"] + 1)
            # The queue drained on the reconnect: one record of the keeper's events.
            assert (records[0][2], records[0][3]) == (SESSION_EVENTS, keeper_id)
            assert event_count(records[0]) >= 2

    asyncio.run(scenario())


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_qos0_flood_routed_in_runs_is_recorded_message_by_message(relay_broker, recorder):
    """QoS 0 PUBLISHes that arrive together go out in runs (Routing.publish_run), told to
    the recorder in one call each: the relay still has every publish, each followed by
    its deliveries, in the order they were sent, with their payloads."""
    broker = with_recorder(relay_broker, recorder)
    routing = broker.server.broker.routing
    run_lengths: list[int] = []
    route_run = routing.publish_run

    def watched(topic: str, packets: list[bytes], publisher: Any) -> Any:
        receivers = route_run(topic, packets, publisher)
        if receivers:
            run_lengths.append(len(packets))
        return receivers

    routing.publish_run = watched  # type: ignore[method-assign]
    subs = [RawClient(broker.host, broker.port) for _ in range(2)]
    pub = RawClient(broker.host, broker.port)
    count = 300
    sub_ids = [unique_id(f"sub{n}") for n in range(len(subs))]
    try:
        for sub, sub_id in zip(subs, sub_ids, strict=True):
            sub.connect(sub_id)
            assert sub.subscribe(("runs/x", 0)) == [0]
        pub_id = unique_id("pub")
        pub.connect(pub_id)
        start = broker.next_seq()
        pub.send(b"".join(publish_packet("runs/x", b"%d" % n) for n in range(count)))
        for sub in subs:
            assert [sub.expect(PUBLISH).payload for _ in range(count)] == [
                b"%d" % n for n in range(count)
            ]
    finally:
        for client in (pub, *subs):
            client.close()
    assert sum(run_lengths) > count // 2, run_lengths  # most of them went in runs
    events = broker.read_all(start=start, until=lambda e: e["seq"] >= start + 3 * count - 1)
    mine = [e for e in events if e["type"] in ("on_publish", "on_deliver")][: 3 * count]
    assert_gap_free(mine, first=start)
    for n in range(count):
        publish, *delivers = mine[3 * n : 3 * n + 3]
        assert (publish["type"], publish["client_id"], publish["payload"]) == (
            "on_publish",
            pub_id,
            b"%d" % n,
        )
        assert (publish["topic"], publish["qos"], publish["retain"]) == ("runs/x", 0, False)
        seen = sorted((d["type"], d["client_id"], d["payload"], d["persisted"]) for d in delivers)
        assert seen == [("on_deliver", sub_id, b"%d" % n, False) for sub_id in sorted(sub_ids)]


def test_resuming_from_a_commit_inside_a_record(fan_out):
    fan = fan_out
    start = fan.broker.next_seq()
    name = unique_id("resumer")

    async def scenario() -> None:
        await to_thread(fan.publish, "fan/a", b"one")
        await to_thread(fan.publish, "fan/b", b"two")
        async with await fan.broker.connect(name="whole", start=None) as reader:
            info = await reader.info()
            everything = await reader.read(start, info["next_seq"])
        assert_gap_free(everything, first=start)
        firsts = [e for e in everything if e["type"] == "on_publish"]
        assert len(firsts) == 2

        async with await fan.broker.connect(name=name, start=start) as client:
            stream = Stream(client)
            publish, deliver = await stream.take(2)
            assert (publish["type"], deliver["type"]) == ("on_publish", "on_deliver")
            await client.commit(deliver["seq"] + 1)  # two deliveries of the record remain
        assert deliver["seq"] + 1 == start + 2

        # While it is away: a third fan-out.
        await to_thread(fan.publish, "fan/c", b"three")
        async with await fan.broker.connect(start=None) as reader:
            last = (await reader.info())["next_seq"] - 1
            everything = await reader.read(start, last + 1)

        async with await fan.broker.connect(name=name, start="committed") as client:
            assert client.start == start + 2
            after = await Stream(client).until(lambda e: e["seq"] == last)
        assert after == everything[2:]  # none before the commit, none missing

        # A commit right after the on_publish: the first delivery is next.
        second = firsts[1]["seq"]
        async with await fan.broker.connect(name=name, start="committed") as client:
            await client.commit(second + 1)
        async with await fan.broker.connect(name=name, start="committed") as client:
            after = await Stream(client).until(lambda e: e["seq"] == last)
        assert after == everything[second + 1 - start :]
        assert after[0]["type"] == "on_deliver" and after[0]["topic"] == "fan/b"

    asyncio.run(scenario())


def test_range_reads_inside_records(fan_out):
    fan = fan_out
    start = fan.broker.next_seq()

    async def scenario() -> None:
        for n in range(3):
            await to_thread(fan.publish, f"fan/{n}", b"%d" % n)
        async with await fan.broker.connect(start=None) as reader:
            next_seq = (await reader.info())["next_seq"]
            everything = await reader.read(start, next_seq)
            assert_gap_free(everything, first=start)
            publishes = [e["seq"] for e in everything if e["type"] == "on_publish"]
            assert len(publishes) == 3
            first, second = publishes[0], publishes[1]
            records, _ = await reader.read_raw(start, next_seq)
            assert sum(map(event_count, records)) == next_seq - start
            assert [r[2] for r in records].count(PUBLISH_DELIVERIES) == 3

            def slice_(a: int, b: int) -> list[dict[str, Any]]:
                return everything[a - start : b - start]

            a, b = first + 2, second + 2  # both inside fan-outs
            assert await reader.read(a, b) == slice_(a, b)
            assert await reader.read(first + 1, first + 3) == slice_(first + 1, first + 3)
            assert await reader.read(first + 3, first + 4) == slice_(first + 3, first + 4)
            records, position = await reader.read_raw(a, b)
            assert (records[0][0], records[-1][0]) == (first, second)  # whole records
            assert position == second + 4
            delivers = [e for e in slice_(a, b) if e["type"] == "on_deliver"]
            assert await reader.read(a, b, types=["on_deliver"]) == delivers
            assert await reader.read(a, b, types=["on_publish"]) == slice_(second, second + 1)
            assert await reader.read(first + 1, second, types=["on_publish"]) == []
            records, position = await reader.read_raw(a, b, limit=1)
            assert ([r[0] for r in records], position) == ([first], first + 4)

    asyncio.run(scenario())


def test_consumers_of_one_type_get_only_that_type(fan_out):
    fan = fan_out
    start = fan.broker.next_seq()
    kinds = ("on_deliver", "on_publish")

    async def scenario() -> None:
        connect = fan.broker.connect
        async with (
            await connect(start=start, types=["on_deliver"]) as delivers,
            await connect(start=start, types=["on_publish"]) as publishes,
            await connect(start=start) as everything,
        ):
            for n in range(2):
                await to_thread(fan.publish, f"fan/{n}", b"%d" % n)
            await to_thread(fan.publisher.publish, "nobody/x", b"end", 1)
            all_events = await Stream(everything).until(lambda e: e.get("topic") == "nobody/x")
            want = {kind: [e for e in all_events if e["type"] == kind] for kind in kinds}
            assert len(want["on_deliver"]) == 6 and len(want["on_publish"]) == 3
            deliver_stream, publish_stream = Stream(delivers), Stream(publishes)
            assert await deliver_stream.take(6) == want["on_deliver"]
            assert await publish_stream.take(3) == want["on_publish"]

            # From inside the first fan-out: its on_publish was before the start.
            for types in (["on_publish", "on_deliver"], ["on_publish"], ["on_deliver"]):
                wanted = [e for e in all_events[2:] if e["type"] in types]
                async with await connect(start=start + 2, types=types) as late:
                    assert await Stream(late).take(len(wanted)) == wanted, types

            # Nothing else came: the next of each is the next message's.
            await to_thread(fan.publish, "fan/last", b"last")
            assert (await deliver_stream.next())["topic"] == "fan/last"
            assert (await publish_stream.next())["topic"] == "fan/last"

    asyncio.run(scenario())


def test_fan_outs_read_from_the_spool_and_trimmed_inside(relay_broker, paho_client, tmp_path):
    name = unique_id("trimmer")
    relay = {
        "durability": "spool",
        "spool_path": str(tmp_path / "spool"),
        "memory_events": 1,
        "trim_committed": [name],
    }
    broker = relay_broker(relay=relay)
    fan = fan_out_of(broker, paho_client)
    log = broker.plugin.log
    start = broker.next_seq()
    for n in range(2):
        fan.publish(f"fan/{n}", b"%d" % n)
        # its on_publish, 3 on_deliver, and the QoS 1 and 2 subscribers' completes
        broker.server.wait_for(lambda n=n: log.next_seq >= start + 6 * (n + 1))
    assert broker.next_seq() == start + 12
    flood(broker, SEGMENT // 2 + 10)  # the fan-outs' segment fills: memory lets it go
    assert broker.server.call(lambda: log.memory_first_seq) > start + 12
    second = start + 6  # the second fan-out: second .. second + 3

    async def scenario() -> None:
        async with await broker.connect(start=None) as reader:
            everything = await reader.read(start, start + 12)  # from the spool
            assert_gap_free(everything, first=start)
            assert [e["type"] for e in everything[:4]] == ["on_publish"] + ["on_deliver"] * 3
            assert everything[6]["type"] == "on_publish"
            assert await reader.read(start + 2, second + 2) == everything[2:8]
            records, position = await reader.read_raw(start + 2, second + 2)
            assert (records[0][0], records[-1][0], position) == (start, second, second + 4)
            assert [r[2] for r in records].count(PUBLISH_DELIVERIES) == 2

        async with await broker.connect(name=name, start=None) as client:
            await client.commit(second + 2)  # inside the second fan-out
        # The spool lets go of what is before the record holding the commit, not of it.
        assert broker.server.call(lambda: log.spool.first_seq) == second
        async with await broker.connect(name=name, start="committed") as client:
            assert client.start == second + 2
            assert await Stream(client).take(4) == everything[8:12]
        async with await broker.connect(start="earliest") as client:
            assert client.start == second
            assert await Stream(client).take(6) == everything[6:12]
        with pytest.raises(ClientOutOfRange):
            async with await broker.connect(start=None) as reader:
                await reader.read(second - 1, second + 1)

    asyncio.run(scenario())


# --------------------------------------------------------------------------- the sidecar


def test_the_sidecar_push_gets_one_on_deliver_per_subscriber(relay_broker, paho_client):
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()  # connections wait in the backlog until the sidecar serves
    port = listening.getsockname()[1]
    sidecar = {"enabled": True, "port": port, "pool_size": 1, "hooks": ["on_publish", "on_deliver"]}
    broker = relay_broker(relay={"hooks": ["on_register"], "sidecar": sidecar})
    fan = fan_out_of(broker, paho_client, subscribers=4)

    async def scenario() -> list[tuple[int, str, Any]]:
        server = Sidecar()
        await server.start(listening)
        try:
            await to_thread(fan.publish, "fan/a", b"one", 1)
            await to_thread(fan.publisher.publish, "nobody/x", b"end", 0)
            received = await server.wait(6)  # one connection: in log order
        finally:
            await server.close()
        return received

    received = asyncio.run(scenario())
    assert [name for _, name, _ in received] == ["OnPublish"] + ["OnDeliver"] * 4 + ["OnPublish"]
    assert received[0][2].client_id == fan.publisher.client_id
    assert received[-1][2].topic == "nobody/x"
    delivers = [message for _, _, message in received[1:5]]
    assert sorted((d.client_id, d.qos) for d in delivers) == sorted(
        (sub.client_id, min(qos % 3, 1)) for qos, sub in enumerate(fan.subscribers)
    )
    for d in delivers:
        assert (d.topic, d.payload, d.persisted) == ("fan/a", b"one", False)
        assert d.matched_acl == MatchedACL() and UUID4.match(d.session_id)
        assert d.timestamp == received[0][2].timestamp  # the publish's record
    assert len({d.session_id for d in delivers}) == 4


@pytest.mark.parametrize("hooks", [None, ["on_deliver"]], ids=["all", "on_deliver"])
def test_the_sidecar_push_resumes_inside_a_record(hooks):
    """A backlog of one frame: the push stops at each delivery of a record and goes on
    from inside it, sending each event once and in order."""
    config: dict[str, Any] = {"pool_size": 1, "backlog_size": 1}
    if hooks is not None:
        config["hooks"] = hooks
    held = Held()

    async def scenario() -> list[tuple[int, str, Any]]:
        server = Sidecar()
        port = await server.start()
        log = memory_log()
        try:
            async with running(log, port, **config) as push:
                wakeup = [0, TS, 0, "c", "", None, "s"]
                log.append(WAKEUP, wakeup)
                held.add([1, TS, WAKEUP, "c", "", None, "s"])
                append_records(log, held, [(PUBLISH_DELIVERIES, 5), (DELIVERIES, 3)])
                append_batch(log, held, [(PUBLISH_DELIVERIES, 2), (DELIVERIES, 1)])
                wanted = [e for e in held.events() if hooks is None or TYPES[e[2]][0] in hooks]
                received = await server.wait(len(wanted))
                assert push.sent == len(wanted) and push.dropped == 0
        finally:
            await server.close()
        assert len(received) == len(wanted)
        return received

    received = asyncio.run(scenario())
    wanted = [e for e in held.events() if hooks is None or TYPES[e[2]][0] in hooks]
    assert [name for _, name, _ in received] == [
        {WAKEUP: "OnClientWakeUp", ON_PUBLISH: "OnPublish", ON_DELIVER: "OnDeliver"}[e[2]]
        for e in wanted
    ]
    for (_, name, message), event in zip(received, wanted, strict=True):
        if name == "OnDeliver":
            d = decode_event(event)
            assert message == OnDeliver(
                timestamp=message.timestamp,
                username=d["username"],
                client_id=d["client_id"],
                topic=d["topic"],
                qos=d["qos"],
                is_retain=d["retain"],
                payload=d["payload"],
                matched_acl=MatchedACL(name=d["acl_name"]),
                persisted=d["persisted"],
                session_id=d["session_id"],
            )
