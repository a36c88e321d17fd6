"""Server Wide Clocks' replication core, alone: node clocks against sets of dots, and
replicas that write, delete, lose and reorder broadcasts, exchange and collect garbage in
random order (hypothesis), which must converge with no deleted key coming back and no
tombstone left once everyone has seen everything."""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

import msgpack
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from broker.cluster.swc import wire
from broker.cluster.swc.clock import NodeClock
from broker.cluster.swc.dcc import DELETED, Dcc
from broker.cluster.swc.exchange import pull
from broker.cluster.swc.replica import Replica

IDS = ["a", "b", "c"]
dots = st.tuples(st.sampled_from(IDS), st.integers(1, 40))


def clock_of(dot_set: set[tuple[str, int]]) -> NodeClock:
    clock = NodeClock()
    for dot in sorted(dot_set, key=lambda d: d[1] * 7919 % 13):  # any order
        clock.add(dot)
    return clock


@given(st.sets(dots), st.sets(dots))
def test_a_node_clock_is_the_set_of_its_dots(mine, theirs):
    clock = clock_of(mine)
    for dot in itertools.product(IDS, range(1, 45)):
        assert (dot in clock) == (dot in mine)
    assert set(clock.missing_from(clock_of(theirs))) == theirs - mine
    merged = clock_of(mine)
    merged.merge(clock_of(theirs))
    assert merged == clock_of(mine | theirs)
    for replica in IDS:  # normalised: the dot past the base is never there
        _, bitmap = clock.entries.get(replica, (0, 0))
        assert not bitmap & 1


def test_event_never_reuses_a_counter():
    clock = NodeClock()
    assert [clock.event("a") for _ in range(3)] == [("a", 1), ("a", 2), ("a", 3)]
    clock.add(("a", 7))  # a gap in our own dots (a store that lost a write)
    assert clock.event("a") == ("a", 8)


def test_concurrent_writes_are_siblings_and_a_write_after_reading_both_supersedes():
    a, b = Replica("a", ["b"]), Replica("b", ["a"])
    from_a = a.write("k", "left")
    from_b = b.write("k", "right")
    a.receive("k", from_b)
    b.receive("k", from_a)
    assert a.get("k") == b.get("k") == ["left", "right"]
    resolved = a.write("k", "both")  # with the context a read: both siblings go
    b.receive("k", resolved)
    assert a.get("k") == b.get("k") == ["both"]


def test_a_write_reaches_a_peer_by_anti_entropy_alone():
    a, b = Replica("a", ["b"]), Replica("b", ["a"])
    a.write("k", 1)
    exchange(b, a, batch=1)
    assert b.get("k") == [1]


def test_a_delete_leaves_no_tombstone_once_every_peer_has_it():
    replicas = [Replica(i, IDS) for i in IDS]
    a = replicas[0]
    a.write("k", 1)
    converge(replicas)
    a.delete("k")
    assert a.get("k") == [] and a.tombstones() == 1  # b and c may still ask for it
    converge(replicas)
    for replica in replicas:
        assert replica.get("k") == [] and replica.tombstones() == 0
        assert replica.dkm == {} and replica.objects == {}


def test_a_replica_that_missed_a_delete_does_not_bring_the_key_back():
    a, b, c = (Replica(i, IDS) for i in IDS)
    a.write("k", 1)
    converge([a, b, c])
    a.delete("k")
    converge([a, b])  # c is away: a and b keep the delete's dot for it
    assert a.tombstones() == b.tombstones() == 1
    converge([a, b, c])
    assert [r.get("k") for r in (a, b, c)] == [[], [], []]
    assert [r.tombstones() for r in (a, b, c)] == [0, 0, 0]


def exchange(puller: Replica, peer: Replica, batch: int) -> None:
    missing = puller.missing(peer.clock)
    for start in range(0, len(missing), batch):
        puller.repair(peer.fetch(missing[start : start + batch]), peer.clock.copy())
    puller.finish_exchange(peer.id, peer.clock.copy(), peer.watermark)


def converge(replicas: list[Replica], rounds: int = 4) -> None:
    for _ in range(rounds):
        for puller, peer in itertools.permutations(replicas, 2):
            exchange(puller, peer, batch=3)


def state(replica: Replica) -> dict[Any, list]:
    return {key: sorted(replica.read(key).versions.items()) for key in replica.objects}


KEYS = ["k1", "k2", "k3"]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 4), st.sampled_from(KEYS)),
        st.tuples(st.just("delete"), st.integers(0, 4), st.sampled_from(KEYS)),
        st.tuples(st.just("deliver"), st.integers(0, 1000), st.booleans()),
        st.tuples(st.just("exchange"), st.integers(0, 4), st.integers(0, 4)),
        st.tuples(st.just("gc"), st.integers(0, 4), st.just(None)),
    ),
    max_size=60,
)


def played(size: int, ops: list[tuple[str, Any, Any]]) -> tuple[list[Replica], dict[str, bool]]:
    """`size` replicas after `ops` (writes, deletes, broadcasts delivered or lost in any
    order, exchanges, GC), and per key whether its last op was a delete that saw every
    write of it."""
    ids = [f"r{i}" for i in range(size)]
    replicas = [Replica(i, ids) for i in ids]
    in_flight: list[tuple[int, str, Dcc]] = []  # broadcasts: (to, key, object)
    writes: dict[str, list[tuple[str, int]]] = {key: [] for key in KEYS}
    final_delete: dict[str, bool] = {}  # key -> its last op was a delete that saw all writes
    values = itertools.count()
    for op, x, y in ops:
        if op in ("write", "delete"):
            replica = replicas[x % size]
            if op == "write":
                shipped = replica.write(y, next(values))
                writes[y].append((replica.id, replica.clock.base(replica.id)))
                final_delete[y] = False
            else:
                saw_all = all(dot in replica.clock for dot in writes[y])
                shipped = replica.delete(y)
                final_delete[y] = saw_all
            in_flight += [(i, y, shipped.copy()) for i in range(size) if i != x % size]
        elif op == "deliver" and in_flight:
            to, key, obj = in_flight.pop(x % len(in_flight))
            if y:  # delivered; otherwise lost
                replicas[to].receive(key, obj)
        elif op == "exchange" and x % size != y % size:
            exchange(replicas[x % size], replicas[y % size], batch=2)
        elif op == "gc":
            replicas[x % size].gc()
    return replicas, final_delete


@settings(max_examples=300, deadline=None)
@given(st.integers(3, 5), operations)
def test_replicas_converge_whatever_the_order_and_deletes_stay_deleted(size, ops):
    replicas, final_delete = played(size, ops)
    converge(replicas)
    first = state(replicas[0])
    for replica in replicas:
        assert state(replica) == first
        assert replica.tombstones() == 0
        assert replica.dkm == {}
        assert not replica.unsettled  # no key keeps any context: the clock implies it
        assert replica.objects == replicas[0].objects
    for key, deleted in final_delete.items():
        if deleted:
            assert all(replica.get(key) == [] for replica in replicas), key


def whole(replica: Replica) -> dict[str, Any]:
    """Everything a replica holds, to compare two."""
    return {name: getattr(replica, name) for name in Replica.__slots__ if name != "watermark"} | {
        "watermark": replica.watermark.rows
    }


@settings(max_examples=300, deadline=None)
@given(st.integers(3, 5), operations, st.integers(0, 4), st.sampled_from(KEYS), st.booleans())
def test_a_write_superseding_a_settled_key_is_what_the_general_write_makes(
    size, ops, writer, key, delete
):
    replicas, _ = played(size, ops)
    replica = replicas[writer % size]
    stored = replica.objects.get(key)
    assume(stored is None or not stored.context)  # where the fast path applies
    fast, general = copy.deepcopy(replica), copy.deepcopy(replica)
    value = DELETED if delete else "new"
    assert fast._supersede(key, value) == general._write(key, value, None)
    assert whole(fast) == whole(general)


def test_a_write_takes_the_fast_path_only_for_a_settled_key():
    a, b = Replica("a", ["b"]), Replica("b", ["a"])
    a.write("k", 1)  # its broadcast lost
    b.receive("k", a.write("k", 2))  # b lacks a's first write: the key keeps a context
    assert b.objects["k"].context == {"a": 2}
    assert b.write("k", 3).context == {"a": 2, "b": 1}  # the general path: it goes along
    assert b.get("k") == [3] and b.objects["k"].context == {"a": 2}
    assert a.write("k", 4).context == {"a": 3}  # settled: the fast path, the clock's bases
    assert a.objects["k"] == Dcc({("a", 3): 4})


def test_concurrent_puts_resolve_to_the_latest_on_every_node_and_settle():
    from broker.cluster.swc.groups import Groups, group_of

    a = Groups([Replica("a", IDS) for _ in range(4)], "node-a")
    b = Groups([Replica("b", IDS) for _ in range(4)], "node-b")
    key = ("sub", "", "c1")
    group = group_of(key, 4)
    assert group == group_of(("sub", "", "c1"), 4)  # stable: the bytes, not hash()
    early, late = a.put(key, "early", ts=1), b.put(key, "late", ts=2)
    a.replicas[group].receive(key, late.obj)
    b.replicas[group].receive(key, early.obj)
    assert len(b.replicas[group].read(key).values()) == 2  # siblings until a read
    shipped: list = []
    assert a.get(key, shipped) == "late"
    (resolution,) = shipped  # the siblings' resolution, written back with their context
    b.replicas[group].receive(key, resolution.obj)
    assert a.replicas[group].read(key).values() == b.replicas[group].read(key).values()
    assert len(b.replicas[group].read(key).values()) == 1
    assert b.get(key) == "late"
    assert dict(a.items()) == {key: "late"}
    a.delete(key)
    assert a.get(key) is None and dict(a.items()) == {}


class WirePeer:
    """A replica in this process, reached as over the cluster channel: every answer
    packed to msgpack bytes and unpacked again."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.fetches = 0

    async def clock(self):
        return wire.unpack_clock(roundtrip(wire.pack_clock(self.replica.clock)))

    async def fetch(self, dots):
        self.fetches += 1
        return wire.unpack_fetched(roundtrip(wire.pack_fetched(self.replica.fetch(dots))))

    async def watermark(self):
        return wire.unpack_watermark(roundtrip(wire.pack_watermark(self.replica.watermark)))


def roundtrip(data: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(data), strict_map_key=False)  # as FrameDecoder


def test_a_pull_over_the_wire_brings_every_key_in_batches():
    a, b = Replica("a", ["b"]), Replica("b", ["a"])
    for i in range(25):
        a.write(("sub", "", f"c{i}"), {"t/#": 1})
    a.delete(("sub", "", "c3"))
    peer = WirePeer(a)
    changed = asyncio.run(pull(b, "a", peer, batch_size=10))
    assert peer.fetches == 3  # 26 dots: 10 + 10 + 6
    assert sorted(changed) == sorted(("sub", "", f"c{i}") for i in range(25) if i != 3)
    assert b.objects == a.objects
    assert b.missing(a.clock) == []
