"""A replica's state saved to a real LevelDB and loaded back, as a node restarted after
kill -9 finds it: what was saved, exactly, and not a dot more."""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import plyvel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.cluster.swc import storage
from broker.cluster.swc.replica import Replica

PEERS = ["a", "b"]


@pytest.fixture
def db(tmp_path):
    db = plyvel.DB(str(tmp_path / "swc"), create_if_missing=True)
    yield db
    db.close()


def commit(db: plyvel.DB, replica: Replica, group: int = 0) -> None:
    with db.write_batch() as batch:
        storage.save(replica, batch, group)


def same(loaded: Replica, replica: Replica) -> None:
    assert loaded.id == replica.id
    assert loaded.objects == replica.objects
    assert loaded.clock == replica.clock
    assert loaded.watermark.to_dict() == replica.watermark.to_dict()
    assert loaded.dkm == replica.dkm
    assert loaded.unsettled == replica.unsettled
    assert loaded.synced == replica.synced


def test_a_saved_replica_loads_back_as_it_was(db):
    a, b = Replica("a", PEERS), Replica("b", PEERS)
    a.write(("sub", "", "c1"), {"t/#": 1})
    a.write(("retain", "t"), b"payload")
    a.receive(("sub", "", "c2"), b.write(("sub", "", "c2"), {"x": 0}))
    a.delete(("retain", "t"))
    a.receive(("late",), b.write(("late",), 1))  # b's dot 2: the clock's first gap-free run
    commit(db, a, group=3)
    assert storage.stored_id(db, 3) == "a" and storage.stored_id(db, 4) is None
    same(storage.load(db, 3, "a", PEERS), a)


def test_a_restart_never_makes_a_dot_that_was_saved_again(db):
    a = Replica("a", PEERS)
    saved = [a.write(("k", i), i) for i in range(3)]
    commit(db, a)
    a.write(("k", 9), 9)  # not saved: never acknowledged, never sent (kill -9 here)
    again = storage.load(db, 0, "a", PEERS)
    made = [next(iter(obj.versions)) for obj in saved]
    assert again.write(("k", 3), 3).versions.keys() - set(made) == {("a", 4)}
    assert again.get(("k", 9)) == []


def test_what_gc_forgets_is_forgotten_on_disk_too(db):
    a, b = Replica("a", PEERS), Replica("b", PEERS)
    b.receive("k", a.write("k", 1))
    b.receive("k", a.delete("k"))
    commit(db, a)
    assert storage.load(db, 0, "a", PEERS).tombstones() == 1
    for puller, peer in [(a, b), (b, a), (a, b)]:
        puller.repair(peer.fetch(puller.missing(peer.clock)), peer.clock)
        puller.finish_exchange(peer.id, peer.clock, peer.watermark)
    assert a.tombstones() == 0
    commit(db, a)
    loaded = storage.load(db, 0, "a", PEERS)
    assert loaded.tombstones() == 0 and loaded.dkm == {} and loaded.objects == {}


class Recorded:
    """A LevelDB write batch that also keeps the keys put, to see what a save writes."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.put_keys: list[bytes] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.put_keys.append(key)
        self.batch.put(key, value)

    def delete(self, key: bytes) -> None:
        self.batch.delete(key)


def test_a_save_puts_the_id_synced_flag_and_watermark_only_when_they_changed(db):
    a, b = Replica("a", PEERS), Replica("b", PEERS)
    commit(db, a)
    a.write(("sub", "c1"), 1)  # a CONNECT's write
    with db.write_batch() as written:
        batch = Recorded(written)
        storage.save(a, batch, 0)
    dot, obj = b"g0/d/a\0" + (1).to_bytes(8), b"g0/o/" + msgpack.packb(("sub", "c1"))
    assert sorted(batch.put_keys) == [dot, b"g0/k", obj]  # its dot, the clock, the object
    b.write("x", 1)
    a.repair(b.fetch(a.missing(b.clock)), b.clock)
    a.finish_exchange(b.id, b.clock.copy(), b.watermark)  # the watermark moves
    a.synced = True
    commit(db, a)
    same(storage.load(db, 0, "a", PEERS), a)


ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "delete", "from-b", "gc", "exchange", "synced", "save"]),
        st.sampled_from([("k", 1), ("k", 2), "x"]),
    ),
    max_size=40,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops)
def test_loading_gives_the_state_of_the_last_save_whatever_came_after(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("swc")
    db = plyvel.DB(str(path), create_if_missing=True)
    a, b = Replica("a", PEERS), Replica("b", PEERS)
    values = itertools.count()
    snapshot = Replica("a", PEERS)
    for op, key in ops:
        if op == "write":
            a.write(key, next(values))
        elif op == "delete":
            a.delete(key)
        elif op == "from-b":
            a.receive(key, b.write(key, next(values)))
        elif op == "gc":
            a.gc()
        elif op == "exchange":  # a pulls from b: the watermark learns b's column
            a.repair(b.fetch(a.missing(b.clock)), b.clock)
            a.finish_exchange(b.id, b.clock.copy(), b.watermark)
        elif op == "synced":
            a.synced = not a.synced
        else:
            commit(db, a)
            snapshot = storage.load(db, 0, "a", PEERS)
            same(snapshot, a)
    if storage.stored_id(db, 0) is not None:
        same(storage.load(db, 0, "a", PEERS), snapshot)
    db.close()
