"""Replication between nodes: each node's replicas on a real LevelDB, the nodes joined by
an in-process transport that carries every frame as msgpack bytes (the cluster channel's
encoding) and can cut links, on a real asyncio loop."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import plyvel
import pytest

from broker.cluster.frames import SWC_WRITE
from broker.cluster.swc.service import Replication
from broker.config import SwcSettings


def roundtrip(data: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(data), strict_map_key=False)  # as FrameDecoder


class Net:
    """The nodes, and which pairs cannot reach each other."""

    def __init__(self) -> None:
        self.nodes: dict[str, Replication] = {}
        self.cut: set[str] = set()  # nodes cut off from every other

    def reachable(self, a: str, b: str) -> bool:
        return a != b and b in self.nodes and a not in self.cut and b not in self.cut


class LocalTransport:
    def __init__(self, net: Net, node: str) -> None:
        self.net = net
        self.node = node

    def linked(self) -> list[str]:
        return [n for n in self.net.nodes if self.net.reachable(self.node, n)]

    def send(self, node: str, *frame: Any) -> None:
        if self.net.reachable(self.node, node):
            kind, *args = roundtrip(list(frame))
            assert kind == SWC_WRITE
            asyncio.get_running_loop().call_soon(self.net.nodes[node].on_write, *args)

    async def request(self, node: str, kind: int, *args: Any) -> Any:
        if not self.net.reachable(self.node, node):
            raise ConnectionError(f"no link to {node}")
        await asyncio.sleep(0)  # an answer comes in a later turn
        return roundtrip(self.net.nodes[node].answer(kind, list(roundtrip(list(args)))))


class Node:
    def __init__(self, net: Net, name: str, path, settings: SwcSettings) -> None:
        self.db = plyvel.DB(str(path / name), create_if_missing=True)
        self.changes: list[tuple[Any, Any]] = []
        self.changed = asyncio.Event()
        self.replication = Replication(
            settings,
            name,
            self.db,
            LocalTransport(net, name),
            self._on_change,
            asyncio.get_running_loop(),
        )
        net.nodes[name] = self.replication

    def _on_change(self, key: Any, value: Any) -> None:
        self.changes.append((key, value))
        self.changed.set()

    async def wait_for(self, key: Any, value: Any, timeout: float = 5.0) -> None:
        async def seen() -> None:
            while self.replication.get(key) != value:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(seen(), timeout)

    def close(self) -> None:
        self.replication.stop()
        self.db.close()


def cluster(tmp_path, names: str = "abc", **settings: Any) -> tuple[Net, list[Node]]:
    net = Net()
    swc = SwcSettings(groups=3, **settings)
    nodes = [Node(net, name, tmp_path, swc) for name in names]
    members = {n.replication.node: n.replication.replica_id for n in nodes}
    for node in nodes:
        node.replication.set_peers(members)
        node.replication.found()  # they start the cluster together
    return net, nodes


def joining(net: Net, name: str, path, settings: SwcSettings) -> Node:
    """A new, empty node, made a member of every node's groups (as its record would)."""
    node = Node(net, name, path, settings)
    members = {n.node: n.replica_id for n in net.nodes.values()}
    for replication in net.nodes.values():
        replication.set_peers(members)
    return node


async def sync_all(nodes: list[Node], rounds: int = 3) -> None:
    for _ in range(rounds):
        for node in nodes:
            for peer in nodes:
                if peer is not node:
                    for group in range(len(node.replication.groups)):
                        await node.replication.exchange(group, peer.replication.node)
        for node in nodes:
            node.replication.gc()


@pytest.fixture
def run():
    return asyncio.run


def test_a_write_is_broadcast_to_every_linked_node(tmp_path, run):
    async def scenario() -> None:
        _, (a, b, c) = cluster(tmp_path)
        a.replication.put(("sub", "", "c1"), {"t/#": 1}, ts=1)
        await b.wait_for(("sub", "", "c1"), {"t/#": 1})
        await c.wait_for(("sub", "", "c1"), {"t/#": 1})
        assert (("sub", "", "c1"), {"t/#": 1}) in b.changes
        for node in (a, b, c):
            node.close()

    run(scenario())


def test_without_broadcast_anti_entropy_alone_brings_a_write_within_the_interval(tmp_path, run):
    async def scenario() -> None:
        _, nodes = cluster(tmp_path, enable_broadcast=False, sync_interval=0.05)
        a, b, c = nodes
        a.replication.put(("retain", "t"), b"x", ts=1)
        await asyncio.sleep(0)
        assert b.replication.get(("retain", "t")) is None  # not broadcast
        for node in nodes:
            node.replication.start()
        await b.wait_for(("retain", "t"), b"x", timeout=2.0)
        await c.wait_for(("retain", "t"), b"x", timeout=2.0)
        for node in nodes:
            node.close()

    run(scenario())


def test_a_delete_while_a_node_is_cut_off_stays_deleted_and_leaves_no_tombstone(tmp_path, run):
    async def scenario() -> None:
        net, nodes = cluster(tmp_path)
        a, b, c = nodes
        key = ("sub", "", "gone")
        a.replication.put(key, {"x": 0}, ts=1)
        await c.wait_for(key, {"x": 0})
        net.cut.add("c")
        a.replication.delete(key)
        await b.wait_for(key, None)
        await sync_all([a, b])
        assert a.replication.figures()["swc_tombstones"] > 0  # c may still ask
        net.cut.clear()
        await sync_all(nodes)
        for node in nodes:
            assert node.replication.get(key) is None
            assert node.replication.figures()["swc_tombstones"] == 0
            node.close()

    run(scenario())


def test_concurrent_writes_on_both_sides_of_a_split_heal_to_the_latest(tmp_path, run):
    async def scenario() -> None:
        net, nodes = cluster(tmp_path)
        a, b, c = nodes
        net.cut.add("c")
        a.replication.put("k", "from a", ts=10)
        c.replication.put("k", "from c", ts=20)
        b.replication.put(("sub", "", "b-side"), 1, ts=11)
        c.replication.put(("sub", "", "c-side"), 2, ts=12)
        net.cut.clear()
        await sync_all(nodes)
        for node in nodes:
            assert node.replication.get("k") == "from c"
            assert node.replication.get(("sub", "", "b-side")) == 1
            assert node.replication.get(("sub", "", "c-side")) == 2
        await sync_all(nodes)  # the resolutions written back settle everywhere
        objects = [[r.objects for r in n.replication.groups.replicas] for n in nodes]
        assert objects[0] == objects[1] == objects[2]
        for node in nodes:
            node.close()

    run(scenario())


class CountingDb:
    """A node's real LevelDB, counting the write batches (commits) made on it."""

    def __init__(self, db: plyvel.DB) -> None:
        self.db = db
        self.batches = 0

    def write_batch(self, **options: Any) -> Any:
        self.batches += 1
        return self.db.write_batch(**options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_writes_soon_after_a_commit_share_the_next_one(tmp_path, run):
    """A connect storm's registrations, each in a loop turn of its own, share commits
    (a LevelDB write costs more than a CONNECT's own work), and each waiter goes on once
    its write is on disk and on its way."""

    async def scenario() -> None:
        _, (a, b) = cluster(tmp_path, names="ab")
        a.replication.put("k0", 0, ts=1)
        await a.replication.durable()
        counted = a.replication.db = CountingDb(a.db)
        for i in range(1, 11):  # each in a turn of its own, as CONNECTs arrive
            a.replication.put(f"k{i}", i, ts=1)
            await asyncio.sleep(0)
        await a.replication.durable()
        assert counted.batches < 10  # one per write without the window
        assert all(a.replication.get(f"k{i}") == i for i in range(11))
        await b.wait_for("k10", 10)
        a.close()
        b.close()

    run(scenario())


def test_a_restarted_node_keeps_its_replica_id_and_never_makes_a_dot_twice(tmp_path, run):
    async def scenario() -> None:
        net, (a, b) = cluster(tmp_path, names="ab")
        a.replication.put("k", 1, ts=1)
        await b.wait_for("k", 1)
        replica_id = a.replication.replica_id
        a.db.close()  # as after kill -9: only what was committed is there
        del net.nodes["a"]
        again = Node(net, "a", tmp_path, SwcSettings(groups=3))
        assert again.replication.replica_id == replica_id
        again.replication.set_peers({"a": replica_id, "b": b.replication.replica_id})
        assert again.replication.get("k") == 1
        again.replication.put("k", 2, ts=2)
        await b.wait_for("k", 2)  # a new dot: b takes it as news, not as a repeat
        again.close()
        b.close()

    run(scenario())


def test_a_node_joining_after_gc_copies_the_whole_group_first(tmp_path, run):
    async def scenario() -> None:
        net, (a, b) = cluster(tmp_path, names="ab")
        for i in range(40):
            a.replication.put(("sub", "", f"c{i}"), i, ts=i + 1)
        await b.wait_for(("sub", "", "c39"), 39)
        await sync_all([a, b])  # every dot known to both: a and b forget them
        assert all(not r.dkm for r in a.replication.groups.replicas)
        late = joining(net, "c", tmp_path, SwcSettings(groups=3, exchange_batch_size=1))
        # Its first exchange of each group copies the group (pages of 10 keys, 40 keys
        # over 3 groups): asked by dot, the forgotten ones would be skipped, and c would
        # never hold them.
        for group in range(3):
            assert await late.replication.exchange(group, "b")
        for i in range(40):
            assert late.replication.get(("sub", "", f"c{i}")) == i
        assert all(r.synced for r in late.replication.groups.replicas)
        for node in (a, b, late):
            node.close()

    run(scenario())


def test_a_full_copy_cut_off_goes_on_from_its_last_page(tmp_path, run):
    """A joining node's copy of a big group outlasts a link drop: the next round asks
    the same member for the next page, not for the whole group again."""

    async def scenario() -> None:
        net, (a,) = cluster(tmp_path, names="a")
        for i in range(90):
            a.replication.put(("sub", "", f"c{i}"), i, ts=i + 1)
        late = joining(net, "b", tmp_path, SwcSettings(groups=3, exchange_batch_size=1))
        answer_keys = a.replication.answer_keys
        asked: list[int] = []

        def flaky(group: int, start: int, limit: int, token: str | None) -> list[Any]:
            asked.append(start)
            if len(asked) == 3:  # the third page: the link goes down
                raise ConnectionError("the link to a went down")
            return answer_keys(group, start, limit, token)

        a.replication.answer_keys = flaky  # type: ignore[method-assign]
        group, _ = late.replication.groups.replica(("sub", "", "c0"))
        assert not await late.replication.exchange(group, "a")
        assert await late.replication.exchange(group, "a")
        assert asked[:4] == [0, 10, 20, 20]  # (pages of 10 keys) on from the third
        held = {key for key, _ in late.replication.items() if key[0] == "sub"}
        wanted = {key for key, _ in a.replication.items() if key[0] == "sub"}
        assert {k for k in wanted if a.replication.groups.replica(k)[0] == group} <= held
        assert late.replication.groups.replicas[group].synced
        for node in (a, late):
            node.close()

    run(scenario())


def test_a_registration_on_a_joining_node_waits_for_its_groups_copy(tmp_path, run):
    """A read of a key before its group is copied would miss the cluster's record (a
    client's subscriptions, lost at its registration): `copied` holds it until then."""

    async def scenario() -> None:
        net, (a,) = cluster(tmp_path, names="a")
        key = ("sub", "", "kept")
        a.replication.put(key, "record", ts=1)
        late = joining(net, "b", tmp_path, SwcSettings(groups=3))
        waiting = asyncio.ensure_future(late.replication.copied(key))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing copied yet
        group, _ = late.replication.groups.replica(key)
        for other in {0, 1, 2} - {group}:
            assert await late.replication.exchange(other, "a")
        assert not waiting.done()  # another group's copy is not its
        assert await late.replication.exchange(group, "a")
        await asyncio.wait_for(waiting, 1.0)
        assert late.replication.get(key) == "record"
        await asyncio.wait_for(a.replication.copied(key), 0.1)  # a founded it: at once
        for node in (a, late):
            node.close()

    run(scenario())


def test_a_removed_members_subscribers_are_reaped_in_batches(tmp_path, run):
    from broker.cluster.metadata import pack_subscriptions
    from broker.cluster.swc.backend import SwcBackend

    async def scenario() -> None:
        net = Net()
        backend = SwcBackend(SwcSettings(groups=3, directory=str(tmp_path / "b")), joining=False)
        backend.attach(LocalTransport(net, "here"), asyncio.get_running_loop())
        await backend.open("here", "boot", "127.0.0.1:1")
        packed = pack_subscriptions({})
        for i in range(250):  # what the removed node "gone" owned; every 5th clean
            record = ["gone", i % 5 == 0, packed, i + 1]
            backend.replicas.put(("sub", f"c{i}"), record, i + 1)
        backend.replicas.put(("sub", "mine"), ["here", False, packed, 1], 1)
        moved: list[str] = []
        while (batch := await backend.reap("gone", 100)) is not None:
            assert len(batch) <= 100
            moved += [client_id for client_id, record in batch if record.node == "here"]
        assert sorted(moved) == sorted(f"c{i}" for i in range(250) if i % 5)
        subscribers = await backend.subscribers()
        assert set(subscribers) == {*moved, "mine"}  # the clean ones are gone
        assert {record.node for record in subscribers.values()} == {"here"}
        await backend.close()

    run(scenario())
