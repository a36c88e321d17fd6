"""The LevelDB store on its own (broker/store/leveldb.py), on a real database in tmp_path,
with a fake clock whose call_soon only records (commits are called by hand)."""

from __future__ import annotations

import plyvel
import pytest

from broker.inflight import AWAITING_ACK, AWAITING_COMP
from broker.message import Delivery, Message
from broker.protocol import Property
from broker.store import SessionRecord, StoreError, records
from broker.store.leveldb import BODY, INLINE_ENTRY, QUEUE, REFS, LevelDBStore, open_db
from broker.store.tool import survey
from broker.subscription_trie import SubOptions


class Loop:
    def __init__(self) -> None:
        self.now = 1000.0
        self.soon: list = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback, *args) -> None:
        self.soon.append(callback)


@pytest.fixture
def loop() -> Loop:
    return Loop()


@pytest.fixture
def store(tmp_path, loop):
    s = LevelDBStore(str(tmp_path / "db"), loop, sync=False)  # type: ignore[arg-type]
    yield s
    s.close()


def delivery(payload: bytes, qos: int = 1, message: Message | None = None) -> Delivery:
    return Delivery(message or Message("t/a", payload, qos, now=0.0), qos, False)


def keys(store: LevelDBStore, prefix: bytes) -> list[bytes]:
    store.commit()
    return list(store._db.iterator(prefix=prefix, include_value=False))


def test_writes_wait_for_the_commit_of_the_turn(store, loop):
    store.put_entry("c", 0, delivery(b"x"))
    assert loop.soon == [store.commit]  # one commit scheduled for the turn
    assert list(store._db.iterator(prefix=QUEUE)) == []  # nothing written before it
    store.commit()
    assert len(list(store._db.iterator(prefix=QUEUE))) == 1


def test_an_entry_deleted_in_its_own_turn_is_never_written(store):
    store.put_entry("c", 0, delivery(b"x"))
    store.delete_entry("c", 0)
    assert keys(store, QUEUE) == []
    assert store._counters["c"][0] == 0


def test_a_fan_out_stores_one_body_and_counts_its_references(store):
    message = Message("t/a", b"shared", 1, now=0.0)
    for client in ("a", "b", "c"):
        store.put_entry(client, 0, delivery(b"", message=message))
    store.commit()
    assert len(keys(store, BODY)) == 1
    (count,) = [v for _, v in store._db.iterator(prefix=REFS)]
    assert int.from_bytes(count, "big") == 3
    entries = [store.read_entries(client, 10)[0] for client in ("a", "b", "c")]
    assert {e.delivery.message.payload for e in entries if e.delivery} == {b"shared"}
    store.delete_entry("a", 0)
    store.delete_entry("b", 0)
    assert len(keys(store, BODY)) == 1  # one reference left
    store.delete_entry("c", 0)
    assert keys(store, BODY) == [] and keys(store, REFS) == []
    assert survey(store._db).problems == []


def test_body_references_survive_a_reopen(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    message = Message("t/a", b"shared", 1, now=0.0)
    first.put_session(SessionRecord("a", None, 1.0))
    first.put_session(SessionRecord("b", None, 1.0))
    first.put_entry("a", 0, delivery(b"", message=message))
    first.put_entry("b", 0, delivery(b"", message=message))
    first.close()
    second = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    list(second.load_sessions())
    assert second.read_entries("a", 10)[0].delivery is not None
    second.delete_entry("a", 0)  # the count comes from the store: 2 -> 1
    assert len(keys(second, BODY)) == 1
    second.delete_session("b")  # the last reference, without reading the entry first
    assert keys(second, BODY) == []
    assert survey(second._db).problems == []
    second.close()


def test_sessions_load_with_counters_and_without_their_queues(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    first.put_session(SessionRecord("c", 60, 5.0, {"a/#": SubOptions(1, no_local=True)}))
    for seq in range(5):
        first.put_entry("c", seq, delivery(b"%d" % seq))
    first.delete_entry("c", 1)
    first.close()
    second = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    (record,) = second.load_sessions()
    assert (record.client_id, record.expiry, record.offline_since) == ("c", 60, 5.0)
    assert record.subscriptions == {"a/#": SubOptions(1, no_local=True)}
    assert (record.queued, record.next_seq) == (4, 5)
    second.close()


def test_reading_skips_what_is_in_flight_and_reads_from_either_end(store):
    for seq in range(6):
        store.put_entry("c", seq, delivery(b"%d" % seq))
    head = store.read_entries("c", 3, skip=[0, 2])
    assert [e.seq for e in head] == [1, 3, 4]
    assert [e.delivery.message.payload for e in head if e.delivery] == [b"1", b"3", b"4"]
    assert [e.seq for e in store.read_entries("c", 2, newest_first=True)] == [5, 4]


def test_in_flight_and_received_ids_round_trip(store):
    store.put_entry("c", 7, delivery(b"x"))
    store.put_inflight("c", 12, 7, AWAITING_ACK)
    store.put_inflight("c", 13, 0, AWAITING_COMP)
    store.put_received("c", 99)
    assert sorted(store.load_inflight("c")) == [
        (12, 7, AWAITING_ACK, None),
        (13, 0, AWAITING_COMP, None),
    ]
    assert store.load_received("c") == {99}
    store.delete_inflight("c", 12)
    store.delete_received("c", 99)
    assert store.load_inflight("c") == [(13, 0, AWAITING_COMP, None)]
    assert store.load_received("c") == set()


def test_a_reused_packet_id_ends_with_its_last_state(store):
    store.put_inflight("c", 5, 1, AWAITING_ACK)
    store.delete_inflight("c", 5)
    store.put_inflight("c", 5, 2, AWAITING_ACK)  # the same id, the same turn
    assert store.load_inflight("c") == [(5, 2, AWAITING_ACK, None)]


def test_delete_session_leaves_nothing_behind(store):
    store.put_session(SessionRecord("c", None, 0.0))
    store.put_entry("c", 0, delivery(b"x"))
    store.put_inflight("c", 1, 0, AWAITING_ACK)
    store.put_received("c", 2)
    store.put_session(SessionRecord("other", None, 0.0))
    store.commit()
    store.delete_session("c")
    store.commit()
    left = [k for k in store._db.iterator(include_value=False) if k != b"v"]
    assert left == [b"s/other"]


def test_message_expiry_is_stored_as_wall_clock_time(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    message = Message("t", b"x", 1, properties={Property.MESSAGE_EXPIRY_INTERVAL: 30}, now=loop.now)
    first.put_entry("c", 0, Delivery(message, 1, False))
    first.close()
    later = Loop()
    later.now = 5.0  # another run: its loop clock starts elsewhere
    second = LevelDBStore(path, later, sync=False)  # type: ignore[arg-type]
    (entry,) = second.read_entries("c", 1)
    assert entry.delivery is not None
    left = entry.delivery.message.expires_at - later.now
    assert 29 <= left <= 30  # the same deadline, on the new clock
    second.close()


def test_expired_retained_messages_are_deleted_at_load(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    short = {Property.MESSAGE_EXPIRY_INTERVAL: 1}
    first.put_retained(Message("gone", b"x", 1, True, short, now=loop.now - 10))
    first.put_retained(Message("kept", b"y", 1, True))
    first.close()
    second = LevelDBStore(path, Loop(), sync=False)  # type: ignore[arg-type]
    assert [m.topic for m in second.load_retained()] == ["kept"]
    second.commit()
    assert [k for k in second._db.iterator(prefix=b"r/", include_value=False)] == [b"r/kept"]
    second.close()


def test_a_locked_store_is_refused_in_one_line(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="in use by another process"):
        open_db(path)
    first.close()


def test_a_store_of_the_older_layout_is_refused_untouched(tmp_path, loop):
    path = tmp_path / "db"
    path.mkdir()
    db = plyvel.DB(str(path / "messages"), create_if_missing=True)
    db.put(b"s/old", b"{}")
    db.close()
    with pytest.raises(StoreError, match="older Nautilus"):
        LevelDBStore(str(path), loop, sync=False)  # type: ignore[arg-type]
    db = plyvel.DB(str(path / "messages"))
    assert list(db.iterator()) == [(b"s/old", b"{}")]
    db.close()


@pytest.mark.parametrize("level", [3, 4, 5])
def test_a_message_is_stored_as_the_bytes_its_publisher_sent(store, level):
    from broker.protocol import Publish, encode

    props = {Property.USER_PROPERTY: [("k", "v")]} if level == 5 else {}
    raw = encode(Publish("t/raw", b"as sent", 1, False, False, 9, props), level)
    message = Message("t/raw", b"as sent", 1, False, dict(props), "pub", raw, level)
    store.put_entry("c", 0, Delivery(message, 0, False, (3,)))
    store.commit()
    (value,) = [v for _, v in store._db.iterator(prefix=QUEUE)]
    assert raw in value  # no second encoding
    (entry,) = store.read_entries("c", 1)
    assert entry.delivery is not None
    got = entry.delivery
    assert (got.qos, got.retain, got.sub_ids) == (0, False, (3,))
    assert (got.message.topic, got.message.payload, got.message.qos) == ("t/raw", b"as sent", 1)
    assert got.message.properties == props


def test_a_message_sent_at_once_is_one_in_flight_record_that_carries_it(store):
    store.put_inflight_entry("c", 9, delivery(b"sent at once"))
    assert keys(store, QUEUE) == []  # no queue entry of its own
    ((packet_id, _, state, inline),) = store.load_inflight("c")
    assert (packet_id, state) == (9, AWAITING_ACK)
    assert inline is not None and inline.delivery is not None
    assert inline.delivery.message.payload == b"sent at once"
    store.delete_inflight("c", 9)
    assert store.load_inflight("c") == []


def test_an_in_flight_record_deleted_in_its_own_turn_is_never_written(store):
    store.put_inflight_entry("c", 9, delivery(b"x"))
    store.delete_inflight("c", 9)
    assert keys(store, b"f/") == []


def test_a_fan_out_sent_at_once_shares_one_body_too(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    message = Message("t/a", b"to everyone", 1, now=0.0)
    for packet_id, client in enumerate(("a", "b", "c"), start=1):
        first.put_session(SessionRecord(client, None, 1.0))
        first.put_inflight_entry(client, packet_id, delivery(b"", message=message))
    first.commit()
    assert len(keys(first, BODY)) == 1
    first.delete_inflight("a", 1)  # a PUBACK
    assert survey(first._db).problems == []
    first.close()
    second = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    list(second.load_sessions())
    ((_, _, _, entry),) = second.load_inflight("b")  # at attach: its reference is known
    assert entry is not None and entry.delivery is not None
    assert entry.delivery.message.payload == b"to everyone"
    second.delete_inflight("b", 2)
    second.delete_session("c")  # never attached: its record is read to find the body
    assert keys(second, BODY) == [] and keys(second, REFS) == []
    assert survey(second._db).problems == []
    second.close()


# -- work that must not grow with the store's history ------------------------------------


class CountingDB:
    """The store's database, counting the iterators opened on it (each one a seek that
    steps over every tombstone between its target and the next live key)."""

    def __init__(self, db: plyvel.DB) -> None:
        self.db = db
        self.iterators: list[dict] = []

    def iterator(self, **kwargs):
        self.iterators.append(kwargs)
        return self.db.iterator(**kwargs)

    def __getattr__(self, name: str):
        return getattr(self.db, name)


def counting(store: LevelDBStore) -> CountingDB:
    spy = CountingDB(store._db)
    store._db = spy  # type: ignore[assignment]
    return spy


def age(store: LevelDBStore, client: str, count: int) -> None:
    """`count` messages through a persistent session: queued, sent, acknowledged."""
    store.put_session(SessionRecord(client, None, 0.0))
    for seq in range(count):
        store.put_entry(client, seq, delivery(b"%d" % seq))
        if seq % 100 == 99:
            store.commit()
            for done in range(seq - 99, seq + 1):
                store.put_inflight(client, done % 65535 + 1, done, AWAITING_ACK)
            store.commit()
            for done in range(seq - 99, seq + 1):
                store.delete_inflight(client, done % 65535 + 1)
                store.delete_entry(client, done)
    store.commit()


def test_a_clean_session_touches_no_key_of_an_aged_store(store, loop):
    age(store, "sub", 2000)
    spy = counting(store)
    loop.soon.clear()
    for client in ("a-clean", "z-clean"):  # before and after the old session's keys
        store.delete_session(client)  # CONNECT with clean start, and its disconnect
        assert store.load_inflight(client) == [] and store.read_entries(client, 10) == []
    assert spy.iterators == [] and loop.soon == [] and store._batch is None


def test_a_session_with_an_empty_queue_is_deleted_without_a_scan(store):
    age(store, "sub", 2000)
    store.put_received("sub", 7)
    store.put_inflight("sub", 3, 1999, AWAITING_COMP)
    store.commit()
    spy = counting(store)
    store.delete_session("sub")
    store.commit()
    assert spy.iterators == []
    assert [k for k in store._db.iterator(include_value=False) if k != b"v"] == []
    assert survey(store._db).problems == []


def test_reads_start_at_the_floor_and_stop_at_the_last_entry(store):
    for seq in range(10):
        store.put_entry("c", seq, delivery(b"%d" % seq))
    store.commit()
    for seq in (0, 1, 2, 4):  # 4 out of order: the floor stops at 3
        store.delete_entry("c", seq)
    assert store._counters["c"][:3] == [6, 10, 3]
    store.delete_entry("c", 3)  # and now moves past 4
    assert store._counters["c"][2] == 5
    spy = counting(store)
    assert [e.seq for e in store.read_entries("c", 100)] == [5, 6, 7, 8, 9]
    (opened,) = spy.iterators
    assert opened["start"].endswith((5).to_bytes(8, "big"))
    assert [e.seq for e in store.read_entries("c", 2, skip=[5])] == [6, 7]
    assert [e.seq for e in store.read_entries("c", 3, newest_first=True)] == [9, 8, 7]
    assert store.read_entries("c", 5, after=9) == []  # past the last seq: no seek at all
    assert len(spy.iterators) == 3


def test_floor_and_flags_survive_a_reopen_and_spare_the_scans(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    age(first, "sub", 1000)
    first.put_entry("sub", 1000, delivery(b"left"))
    first.put_session(SessionRecord("sub", None, 0.0))  # at disconnect: nothing in flight
    first.put_session(SessionRecord("crashed", None, 0.0))
    first.put_inflight_entry("crashed", 5, delivery(b"in flight"))
    first.put_received("crashed", 6)
    first.close()
    second = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    records_ = {r.client_id: r for r in second.load_sessions()}
    assert (records_["sub"].queued, records_["sub"].next_seq) == (1, 1001)
    assert second._counters["sub"][2] == 1000  # the floor
    spy = counting(second)
    assert second.load_inflight("sub") == [] and second.load_received("sub") == set()
    assert [e.seq for e in second.read_entries("sub", 10)] == [1000]
    assert len(spy.iterators) == 1  # the read, from the floor
    ((packet_id, _, _, inline),) = second.load_inflight("crashed")  # its flag is set
    assert packet_id == 5 and inline is not None and second.load_received("crashed") == {6}
    spy.iterators.clear()
    second.delete_session("crashed")  # known from here on: deleted without a scan
    assert spy.iterators == []
    assert survey(second._db).problems == []
    second.close()


def test_a_layout_2_store_is_upgraded_by_the_first_start(tmp_path, loop):
    path = tmp_path / "db"
    path.mkdir()
    db = plyvel.DB(str(path / "messages"), create_if_missing=True)
    entry = b"\x00\x01\x00\x00" + records.encode_message(Message("t", b"old", 1, now=0.0), 0.0)
    db.put(b"v", b"2")
    db.put(b"s/q", b'{"expiry": null, "offline_since": 1.0, "subscriptions": {}}')
    db.put(b"n/q", records.encode_counters(2, 10))  # layout 2: 16 bytes
    db.put(b"q/q\x00" + (8).to_bytes(8, "big"), entry)
    db.put(b"q/q\x00" + (9).to_bytes(8, "big"), b"\x02\x01\x00\x00" + (7).to_bytes(8, "big"))
    db.put(b"b/" + (7).to_bytes(8, "big"), entry[4:])  # a shared body, referenced by seq 9
    db.put(b"c/" + (7).to_bytes(8, "big"), (1).to_bytes(4, "big"))
    db.put(b"s/f", b'{"expiry": null, "offline_since": 1.0, "subscriptions": {}}')
    db.put(b"f/f\x00\x00\x05", INLINE_ENTRY + b"\x00" + entry)  # and no counters at all
    db.close()
    store = LevelDBStore(str(path), loop, sync=False)  # type: ignore[arg-type]
    assert sorted(r.client_id for r in store.load_sessions()) == ["f", "q"]
    assert store._db.get(b"v") == b"3"
    assert store._db.get(b"B") == (8).to_bytes(8, "big")  # body ids from 8 on: no more scan
    assert records.decode_counters(store._db.get(b"n/f")) == (0, 0, 0, records.MAY_HAVE_ANY)
    assert [e.seq for e in store.read_entries("q", 10)] == [8, 9]  # from floor 0
    assert store._counters["q"][2] == 8  # the read found where the queue begins
    assert [p for p, *_ in store.load_inflight("f")] == [5]
    assert survey(store._db).problems == []
    store.close()


def test_check_finds_a_record_its_counters_deny(store):
    store.put_session(SessionRecord("c", None, 0.0))
    store.commit()
    store._db.put(b"i/c\x00\x00\x07", b"")  # written behind the store's back
    assert survey(store._db).problems == ["'c': inbound QoS 2 ids, its counters say none"]


def test_check_finds_an_entry_below_the_floor(store):
    for seq in range(3):
        store.put_entry("c", seq, delivery(b"%d" % seq))
    store.put_session(SessionRecord("c", None, 0.0))
    store.commit()
    store.delete_entry("c", 0)
    store.commit()
    value = store._db.get(QUEUE + b"c\x00" + (1).to_bytes(8, "big"))
    store._db.put(QUEUE + b"c\x00" + (0).to_bytes(8, "big"), value)  # below the floor, 1
    store._db.delete(QUEUE + b"c\x00" + (2).to_bytes(8, "big"))  # the count still holds
    assert survey(store._db).problems == ["'c': entries 0..1 lie outside 1..2"]


def test_body_ids_go_on_after_a_reopen_without_a_scan(tmp_path, loop):
    path = str(tmp_path / "db")
    first = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    shared = Message("t/a", b"shared", 1, now=0.0)
    for client in ("a", "b"):
        first.put_session(SessionRecord(client, None, 0.0))
        first.put_entry(client, 0, delivery(b"", message=shared))
    first.close()
    second = LevelDBStore(path, loop, sync=False)  # type: ignore[arg-type]
    reserved = int.from_bytes(second._db.get(b"B"), "big")
    assert second._next_body == reserved > 1  # read, not found by a seek past the bodies
    list(second.load_sessions())
    again = Message("t/a", b"shared again", 1, now=0.0)
    for client in ("a", "b"):
        second.put_entry(client, 1, delivery(b"", message=again))
    second.commit()
    assert [int.from_bytes(k[2:], "big") for k in keys(second, BODY)] == [1, reserved]
    assert survey(second._db).problems == []
    second.close()
