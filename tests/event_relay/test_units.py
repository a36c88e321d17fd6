"""The relay's pure logic: EventLog (segments, reads with and without a type filter,
trimming by count and by bytes, OutOfRange), the spool behind it, FrameReader and the
frame builders, and schema.decode_event for every type."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from event_relay import frames
from event_relay.config import RelayConfig
from event_relay.log import SEGMENT, EventLog, OutOfRange
from event_relay.plugin import EventRelay
from event_relay.schema import CODES, COMMON, HOOK_NAMES, TYPES, decode_event
from event_relay.spool import Spool
from hooks import ClientContext, RegisterContext

BIG = 1 << 40


def values(i: int, payload: bytes = b"") -> list[Any]:
    """A publish-like event's fields, seq and type left to the log."""
    return [0, 1_000 + i, 0, f"c{i % 7}", "", None, "s", "t", 0, False, len(payload), payload]


def code_of(i: int) -> int:
    return (3, 6, 9)[i % 3]


def fill(log: EventLog, count: int, payload: bytes = b"") -> None:
    for i in range(count):
        log.append(code_of(i), values(i, payload))


def seqs(events: list[bytes]) -> list[int]:
    return [msgpack.unpackb(e)[0] for e in events]


# --------------------------------------------------------------------------- reading


def test_append_numbers_and_encodes():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    assert (log.first_seq, log.next_seq) == (1, 1)
    assert log.append(3, values(0, b"hi")) == 1
    assert log.append(6, values(1)) == 2
    events, position = log.read(1, 10)
    assert position == 3
    decoded = [msgpack.unpackb(e) for e in events]
    assert decoded[0] == [1, 1000, 3, "c0", "", None, "s", "t", 0, False, 2, b"hi"]
    assert decoded[1][:3] == [2, 1001, 6]


def test_read_across_segments_with_and_without_codes():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    total = 2 * SEGMENT + 100
    fill(log, total)
    assert log.next_seq == total + 1

    events, position = log.read(SEGMENT - 5, 20)
    assert seqs(events) == list(range(SEGMENT - 5, SEGMENT + 15))
    assert position == SEGMENT + 15
    events, position = log.read(1, BIG)
    assert seqs(events) == list(range(1, total + 1)) and position == total + 1
    events, position = log.read(SEGMENT - 5, BIG, end=2 * SEGMENT + 3)
    assert seqs(events) == list(range(SEGMENT - 5, 2 * SEGMENT + 3))
    assert position == 2 * SEGMENT + 3
    events, position = log.read(10, BIG, end=10_000_000)  # end in the future: next_seq
    assert position == total + 1

    # A filter: only those codes, the position after the last event looked at.
    wanted = {i + 1 for i in range(total) if code_of(i) == 9}
    events, position = log.read(1, BIG, codes={9})
    assert seqs(events) == sorted(wanted) and position == total + 1
    events, position = log.read(SEGMENT - 10, 5, codes={9})
    expected = sorted(s for s in wanted if s >= SEGMENT - 10)[:5]
    assert seqs(events) == expected and position == expected[-1] + 1
    events, position = log.read(SEGMENT, 10, codes={42})  # none of those: read to the end
    assert (events, position) == ([], total + 1)
    events, position = log.read(SEGMENT, 10, codes={42}, end=SEGMENT + 50)
    assert (events, position) == ([], SEGMENT + 50)

    assert log.read(total + 1, 10) == ([], total + 1)  # the end: nothing yet


def test_out_of_range_bounds():
    log = EventLog(memory_events=SEGMENT, memory_bytes=BIG)
    fill(log, 2 * SEGMENT + 10)
    first, next_seq = log.first_seq, log.next_seq
    assert first > 1
    for bad in (first - 1, 1, 0, next_seq + 1):
        with pytest.raises(OutOfRange) as caught:
            log.read(bad, 10)
        assert (caught.value.requested, caught.value.first_seq, caught.value.next_seq) == (
            bad,
            first,
            next_seq,
        )
        assert str(first) in str(caught.value) and str(next_seq) in str(caught.value)
    assert seqs(log.read(first, 1)[0]) == [first]
    assert log.read(next_seq, 1) == ([], next_seq)


# --------------------------------------------------------------------------- trimming


@pytest.mark.parametrize("memory_events", [SEGMENT, 2 * SEGMENT + 100, 3 * SEGMENT])
def test_trimming_by_count_keeps_whole_segments_within_the_bound(memory_events):
    log = EventLog(memory_events=memory_events, memory_bytes=BIG)
    trimmed = False
    for i in range(5 * SEGMENT):
        log.append(code_of(i), values(i))
        held = log.next_seq - log.first_seq
        assert held <= memory_events, i
        if log.first_seq > 1:
            trimmed = True
            assert (log.first_seq - 1) % SEGMENT == 0  # whole segments go
            assert held > memory_events - SEGMENT, i  # and no more than needed
    assert trimmed
    events, _ = log.read(log.first_seq, BIG)
    assert seqs(events) == list(range(log.first_seq, log.next_seq))


def test_trimming_by_bytes():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    log.append(3, values(0, b"x" * 100))
    size = len(log.read(1, 1)[0][0])
    limit = int(2.5 * SEGMENT * size)
    log = EventLog(memory_events=BIG, memory_bytes=limit)
    for i in range(6 * SEGMENT):
        log.append(3, values(0, b"x" * 100))
        held = log.next_seq - log.first_seq
        if held > SEGMENT:  # more than the segment being written: within the bound
            assert held * size <= limit, i
    assert log.first_seq > 3 * SEGMENT
    events, _ = log.read(log.first_seq, BIG)
    assert sum(map(len, events)) <= limit
    assert seqs(events) == list(range(log.first_seq, log.next_seq))


def test_memory_bytes_bounds_large_events_too():
    """Segments also end at a sixteenth of memory_bytes: large events go in steps that
    keep memory within its bound."""
    limit = 1 << 20
    log = EventLog(memory_events=BIG, memory_bytes=limit)
    for i in range(64):
        log.append(3, values(i, b"x" * (64 * 1024)))  # 4 MiB in all
        events, _ = log.read(log.memory_first_seq, BIG)
        assert sum(map(len, events)) <= limit, i
    assert log.first_seq > 40
    events, _ = log.read(log.first_seq, BIG)
    assert seqs(events) == list(range(log.first_seq, 65))


def test_read_with_a_byte_cap():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    for i in range(100):
        log.append(code_of(i), values(i, b"x" * 1000))
    size = len(log.read(1, 1)[0][0])
    events, position = log.read(1, BIG, max_bytes=10 * size + size // 2)
    assert seqs(events) == list(range(1, 11)) and position == 11
    events, position = log.read(5, BIG, max_bytes=1)  # at least one event
    assert seqs(events) == [5] and position == 6
    events, position = log.read(1, BIG, codes={9}, max_bytes=3 * size)
    assert seqs(events) == [3, 6, 9] and position == 12  # 10, 11 looked at, 12 next


def test_read_with_a_byte_cap_across_segments_of_mixed_sizes():
    log = EventLog(memory_events=BIG, memory_bytes=BIG)
    for i in range(SEGMENT):
        log.append(3, values(i, b"x" * 3000))  # a segment of large events
    for i in range(SEGMENT):
        log.append(3, values(i, b"y" * 100))  # then one of small ones
    position = 1
    while position <= 2 * SEGMENT:
        events, after = log.read(position, 2000, max_bytes=frames.FRAME_BYTES)
        assert seqs(events) == list(range(position, position + len(events)))
        assert after == position + len(events)
        position = after


# --------------------------------------------------------------------------- the spool


def test_reads_go_to_the_spool_for_what_memory_let_go(tmp_path):
    async def scenario() -> None:
        spool = Spool(str(tmp_path / "spool"), max_events=3 * SEGMENT)
        log = EventLog(memory_events=1, memory_bytes=BIG, spool=spool)
        fill(log, 4 * SEGMENT + 5)
        assert log.memory_first_seq == 4 * SEGMENT + 1
        await asyncio.sleep(0)  # the turn's batch is written
        # The spool keeps its newest 3 * SEGMENT; memory the last segment.
        assert log.first_seq == SEGMENT + 6
        with pytest.raises(OutOfRange):
            log.read(SEGMENT + 5, 10)
        events, position = log.read(SEGMENT + 6, BIG)  # stops where memory begins
        assert seqs(events) == list(range(SEGMENT + 6, 4 * SEGMENT + 1))
        assert position == 4 * SEGMENT + 1
        events, position = log.read(position, BIG)
        assert seqs(events) == list(range(4 * SEGMENT + 1, 4 * SEGMENT + 6))
        events, position = log.read(2 * SEGMENT, 10, codes={6})
        assert all(msgpack.unpackb(e)[2] == 6 for e in events) and len(events) == 10
        events, position = log.read(2 * SEGMENT, 3, end=2 * SEGMENT + 2)
        assert seqs(events) == [2 * SEGMENT, 2 * SEGMENT + 1]
        assert position == 2 * SEGMENT + 2
        spool.commit("billing", 77)
        epoch = spool.epoch
        log.close()

        again = Spool(str(tmp_path / "spool"), max_events=3 * SEGMENT)
        reopened = EventLog(memory_events=1, memory_bytes=BIG, spool=again)
        assert (reopened.first_seq, reopened.next_seq) == (SEGMENT + 6, 4 * SEGMENT + 6)
        assert again.epoch == epoch and again.committed("billing") == 77
        assert again.committed("nobody") is None
        assert reopened.append(3, values(0)) == 4 * SEGMENT + 6
        reopened.close()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- frames


def test_frames_split_across_feeds_byte_by_byte():
    data = (
        frames.frame(frames.HELLO, {"version": frames.VERSION, "name": "tail", "start": "earliest"})
        + frames.events_frame([msgpack.packb([1, 2, 3]), msgpack.packb([2, 2, 10, "c"])])
        + frames.frame(frames.COMMIT, {"seq": 3})
    )
    reader = frames.FrameReader()
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i : i + 1])
    assert got == [
        (frames.HELLO, {"version": frames.VERSION, "name": "tail", "start": "earliest"}),
        (frames.EVENTS, [[1, 2, 3], [2, 2, 10, "c"]]),
        (frames.COMMIT, {"seq": 3}),
    ]
    # All at once, and in two arbitrary pieces.
    assert frames.FrameReader().feed(data) == got
    reader = frames.FrameReader()
    assert reader.feed(data[:7]) == []
    assert reader.feed(data[7:]) == got


def test_frame_layout():
    data = frames.frame(frames.COMMIT, {"seq": 3})
    assert data == bytes.fromhex("00000007 43 81 a3736571 03")
    empty = frames.events_frame([])
    assert empty == b"\x00\x00\x00\x06E\xdd\x00\x00\x00\x00"
    assert frames.FrameReader().feed(empty) == [(frames.EVENTS, [])]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00\x00\x00", "frame length 0 is out of bounds"),
        ((frames.MAX_FRAME + 1).to_bytes(4, "big"), "out of bounds"),
        (b"\xff\xff\xff\xffH", "out of bounds"),
        (b"\x00\x00\x00\x02Zx", "unknown frame kind b'Z'"),
        (b"\x00\x00\x00\x02H\xc1", "frame H is not valid msgpack"),
        (b"\x00\x00\x00\x03H\x92\x01", "frame H is not valid msgpack"),  # truncated array
    ],
)
def test_frame_reader_refuses(data, message):
    with pytest.raises(frames.FrameError, match=message.replace("(", r"\(")):
        frames.FrameReader().feed(data)


def test_frame_reader_checks_the_length_before_the_body_arrives():
    reader = frames.FrameReader(max_frame=100)
    assert reader.feed(frames.frame(frames.QUERY, {"x": "y" * 80})) != []
    with pytest.raises(frames.FrameError, match="frame length 101"):
        reader.feed((101).to_bytes(4, "big"))  # refused at once: no 101 bytes awaited


# --------------------------------------------------------------------------- schema


def test_every_type_has_a_code_and_fields():
    # 1-13 the hooks', 14-16 the compact records', 17 the relay's heartbeat.
    assert len(TYPES) == 14 and set(CODES.values()) == {*range(1, 14), 17}
    assert tuple(name for name, _ in TYPES.values()) == (*HOOK_NAMES, "heartbeat")


@pytest.mark.parametrize("code", sorted(TYPES), ids=[TYPES[c][0] for c in sorted(TYPES)])
def test_decode_event_of_every_type(code):
    name, own = TYPES[code]
    common = [7, 123, code, "client", "", "user", "sid"]
    rest = [f"value-{field}" for field in own]
    event = decode_event(common + rest)
    assert event == {
        "seq": 7,
        "ts": 123,
        "type": name,
        "client_id": "client",
        "mountpoint": "",
        "username": "user",
        "session_id": "sid",
        **{field: f"value-{field}" for field in own},
    }
    # A field a later version appends is ignored by this reader.
    assert decode_event([*common, *rest, "from-the-future"]) == event


def test_decode_event_of_an_unknown_type_keeps_its_values():
    event = decode_event([9, 1, 99, "c", "", None, "s", "a", 2])
    assert event == {
        "seq": 9,
        "ts": 1,
        "type": 99,
        "client_id": "c",
        "mountpoint": "",
        "username": None,
        "session_id": "s",
        "values": ["a", 2],
    }
    assert list(decode_event([1, 2, 1, "c", "", None, "s"])) == list(COMMON)  # no own fields


def test_disconnects_say_when_their_session_connected_and_who_is_online():
    relay = EventRelay(RelayConfig(hooks=["on_client_offline", "on_client_gone"]))
    assert relay.on_register is not None  # not relayed, but kept: it records connect times
    relay.on_register(RegisterContext(client_id="a", session_id="sa"))
    relay.on_register(RegisterContext(client_id="b", session_id="sb"))
    relay.on_client_offline(ClientContext(client_id="a", session_id="sa", reason="tcp_closed"))
    # A session that connected before the relay started has no connect time.
    relay.on_client_gone(ClientContext(client_id="old", session_id="s0", reason="tcp_closed"))
    events, _ = relay.log.read(relay.log.first_seq, 10)
    offline, gone = (decode_event(msgpack.unpackb(data)) for data in events)
    assert offline["type"] == "on_client_offline"  # no on_register event: not relayed
    assert offline["ts"] >= offline["connected_ts"] > 0
    assert offline["online"] == 1  # b
    assert (gone["connected_ts"], gone["online"]) == (None, 1)


def test_trim_to_lets_go_of_what_was_processed(tmp_path):
    spool = Spool(str(tmp_path / "spool"), 1_000_000)
    log = EventLog(memory_events=BIG, memory_bytes=BIG, spool=spool)
    log._call_soon = lambda callback: None  # no loop: the test flushes by trimming
    for i in range(SEGMENT + 900):  # two segments in memory
        log.append(3, values(i))
    log.trim_to(SEGMENT + 1)  # everything of the first segment is processed
    assert (log.first_seq, spool.first_seq) == (SEGMENT + 1, SEGMENT + 1)
    with pytest.raises(OutOfRange):
        log.read(SEGMENT, 10)
    events, _ = log.read(SEGMENT + 1, 10)
    assert msgpack.unpackb(events[0])[0] == SEGMENT + 1
    log.trim_to(SEGMENT + 500)  # within the segment being written: the spool only
    assert (log.memory_first_seq, spool.first_seq) == (SEGMENT + 1, SEGMENT + 500)
    log.trim_to(10**9)  # past the end: up to the end
    assert spool.first_seq == log.next_seq
    end = log.next_seq
    log.close()
    again = Spool(str(tmp_path / "spool"), 1_000_000)  # the floor was written: it stays
    assert (again.first_seq, again.next_seq) == (end, end)
    again.close()
