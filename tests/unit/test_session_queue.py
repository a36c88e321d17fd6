"""A session's queue (broker/session_queue.py) on its own: its bound (fifo and lifo drops,
expired messages first), and a durable queue in a real LevelDB store: written as it comes,
read back in chunks in order, stepping over what is in flight."""

from __future__ import annotations

import pytest

from broker.message import Delivery, Message
from broker.metrics import Metrics
from broker.protocol import Property
from broker.session_queue import SessionQueue
from broker.store import MemoryStore
from broker.store.leveldb import LevelDBStore

from .fakes import FakeClock

EXPIRY = Property.MESSAGE_EXPIRY_INTERVAL


def delivery(payload: bytes, expiry: int | None = None, now: float = 1000.0) -> Delivery:
    properties = {EXPIRY: expiry} if expiry is not None else None
    return Delivery(Message("t", payload, 1, properties=properties, now=now), 1, False)


def payloads(deliveries) -> list[bytes]:
    return [d.message.payload for d in deliveries]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dropped() -> list[tuple[bytes, str]]:
    return []


class Dropped:
    """What the queue tells its session of a message it lets go: (payload, why) kept."""

    def __init__(self, kept: list[tuple[bytes, str]]) -> None:
        self.kept = kept

    def message_dropped(self, delivery: Delivery, reason: str) -> None:
        self.kept.append((delivery.message.payload, reason))


@pytest.fixture
def make(clock, dropped):
    def make(store=None, lifo: bool = False) -> SessionQueue:
        return SessionQueue("c", store or MemoryStore(), Metrics(), clock, Dropped(dropped), lifo)

    return make


def test_a_full_fifo_queue_drops_the_new_message(make, dropped):
    queue = make()
    assert queue.put(delivery(b"1"), 2) and queue.put(delivery(b"2"), 2)
    assert not queue.put(delivery(b"3"), 2)
    assert payloads(queue) == [b"1", b"2"]
    assert dropped == [(b"3", "queue_full")]
    assert queue.metrics.queue_message_drop == 1


def test_a_full_lifo_queue_drops_the_oldest(make, dropped):
    queue = make(lifo=True)
    queue.put(delivery(b"1"), 2)
    queue.put(delivery(b"2"), 2)
    assert not queue.put(delivery(b"3"), 2)
    assert payloads(queue) == [b"2", b"3"]
    assert dropped == [(b"1", "queue_full")]


def test_expired_messages_make_room_before_a_live_one_is_dropped(make, clock, dropped):
    queue = make()
    queue.put(delivery(b"short", expiry=5), 2)
    queue.put(delivery(b"long", expiry=60), 2)
    clock.advance(10)
    assert queue.put(delivery(b"new"), 2)
    assert payloads(queue) == [b"long", b"new"]
    assert dropped == [(b"short", "expired")]
    assert queue.metrics.queue_message_expired == 1


class StoreLoop(FakeClock):
    """What the LevelDB store asks of its loop: a commit at the end of the turn, which
    these tests run themselves (`commit()`) before reading."""

    def call_soon(self, callback, *args) -> None:
        pass


@pytest.fixture
def leveldb(tmp_path):
    store = LevelDBStore(str(tmp_path / "db"), StoreLoop(), sync=False)  # type: ignore[arg-type]
    yield store
    store.close()


def test_a_durable_queue_is_read_back_in_chunks_in_order_skipping_what_is_in_flight(make, leveldb):
    queue = make(leveldb)
    queue.durable = True
    kept = [delivery(b"%d" % i) for i in range(5)]
    for d in kept:
        queue.put_stored(d, -1, list)  # offline: in the store only
    leveldb.commit()
    assert (len(queue), queue.on_disk) == (0, 5)
    in_flight = [kept[1].seq]  # the session holds this one in its window
    queue.read_chunk(2, in_flight)
    assert payloads(queue) == [b"0", b"2"]
    queue.clear()
    queue.read_chunk(2, in_flight)
    assert payloads(queue) == [b"3", b"4"]
    queue.clear()
    queue.read_chunk(2, in_flight)
    assert (len(queue), queue.on_disk) == (0, 0)


def test_a_durable_message_done_with_leaves_the_store(make, leveldb):
    queue = make(leveldb)
    queue.durable = True
    queue.put(delivery(b"m"), -1)
    (stored,) = queue
    assert stored.seq >= 0
    queue.forget(stored)
    leveldb.commit()
    queue.clear()
    queue.on_disk = 1  # as if the session had gone offline with it
    assert queue.stored([]) == []
