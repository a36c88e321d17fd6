"""The leaderless metadata (`metadata = "swc"`) end to end: three `python -m broker` node
processes on loopback and no Redis at all. Node a starts alone; b and c join through it
(`seeds`), learn of each other from the replicated member records, and link to every
member. Then subscriptions and retained messages replicate: a subscription on one node
routes publishes from the others (exact, wildcard, `$share`), an unsubscribe removes the
route everywhere, a retained message set and cleared on one node is seen so on another.
A node that holds another cluster's metadata is refused at join, in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.helpers import V5, V311, PahoClient, unique_id
from tests.cluster.test_cluster import (
    HOST,
    TIMEOUT,
    Node,
    eventually,
    retained_seen,
    subscribe_with_probe,
    wait_routed,
)


class SwcCluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: dict[str, Node] = {}
        self.clients: list[PahoClient] = []

    def start(self, name: str, seeds: list[str] = ()) -> Node:  # type: ignore[assignment]
        node = Node(
            self.tmp_path / name,
            name,
            "",
            metadata="swc",
            seeds=[(HOST, self.nodes[seed].cluster_port) for seed in seeds],
        )
        self.nodes[name] = node
        node.start()
        return node

    def client(self, node: str, version: int = V311) -> PahoClient:
        client = PahoClient(HOST, self.nodes[node].port, version, None)
        self.clients.append(client)
        client.connect()
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for node in self.nodes.values():
            node.kill()
        for node in self.nodes.values():  # shown when the test failed
            if node.process is not None:
                print(f"--- node {node.name} (port {node.port})")
                print("\n".join(node.drain_log()))


@pytest.fixture
def swc_trio(tmp_path: Path) -> Iterator[SwcCluster]:
    """a alone, then b and c joining through a; every link up."""
    cluster = SwcCluster(tmp_path)
    try:
        cluster.start("a")
        cluster.start("b", ["a"])
        cluster.start("c", ["a"])
        for name, node in cluster.nodes.items():
            node.wait_links([peer for peer in cluster.nodes if peer != name])
        yield cluster
    finally:
        cluster.close()


def remote_subscribers(node: Node) -> int:
    status: dict[str, Any] = node.cluster_status()
    return int(status["remote_subscribers"])


def test_nodes_join_through_a_seed_and_route_to_each_other(swc_trio: SwcCluster) -> None:
    sub_a = swc_trio.client("a", V5)
    sub_c = swc_trio.client("c", V311)
    subscribe_with_probe(sub_a, ("swc/exact", 1), ("swc/+/x", 1))
    subscribe_with_probe(sub_c, ("swc/#", 0))
    pub_b = swc_trio.client("b", V5)
    wait_routed(pub_b, sub_a)
    wait_routed(pub_b, sub_c)
    pub_b.publish("swc/exact", b"one", 1)
    pub_b.publish("swc/y/x", b"two", 1)
    assert [m.payload for m in (sub_a.expect_message(), sub_a.expect_message())] == [
        b"one",
        b"two",
    ]
    assert [sub_c.expect_message().payload for _ in range(2)] == [b"one", b"two"]


def test_a_shared_group_across_nodes_gets_each_message_once(swc_trio: SwcCluster) -> None:
    group = unique_id("g")
    members = [swc_trio.client(name) for name in ("a", "c")]
    for member in members:
        assert member.subscribe(f"$share/{group}/swc/shared", 1) == [1]
        subscribe_with_probe(member)
    pub = swc_trio.client("b")
    for member in members:
        wait_routed(pub, member)
    for i in range(20):
        pub.publish("swc/shared", b"%d" % i, 1)
    got: list[bytes] = []

    def all_arrived() -> bool:
        for member in members:
            while not member.messages.empty():
                got.append(member.messages.get_nowait().payload)
        return len(got) >= 20

    eventually(all_arrived, what="20 shared messages")
    assert sorted(got) == sorted(b"%d" % i for i in range(20))


def test_an_unsubscribe_removes_the_route_on_every_node(swc_trio: SwcCluster) -> None:
    sub = swc_trio.client("a")
    subscribe_with_probe(sub, ("swc/gone", 1))
    for name in ("b", "c"):
        eventually(lambda n=name: remote_subscribers(swc_trio.nodes[n]) >= 1, what=name)
    sub.unsubscribe("swc/gone")
    sub.unsubscribe(f"probe/{sub.client_id}")
    sub.disconnect()
    for name in ("b", "c"):
        eventually(lambda n=name: remote_subscribers(swc_trio.nodes[n]) == 0, what=name)


def test_retained_set_on_one_node_and_cleared_on_another(swc_trio: SwcCluster) -> None:
    topic = unique_id("swc/retained")
    setter = swc_trio.client("a")
    setter.publish(topic, b"kept", 1, retain=True)
    reader = swc_trio.client("c")
    seen = eventually(lambda: retained_seen(reader, topic), what="the retained message on c")
    assert seen.payload == b"kept"
    swc_trio.client("b").publish(topic, b"", 1, retain=True)  # cleared on b
    eventually(lambda: retained_seen(reader, topic) is None, what="cleared on c")


def test_a_node_with_another_clusters_metadata_is_refused(tmp_path: Path) -> None:
    cluster = SwcCluster(tmp_path)
    try:
        cluster.start("a")
        lone = cluster.start("z")  # a cluster of its own, holding a retained message
        cluster.client("z").publish("z/topic", b"z's", 1, retain=True)
        lone.stop()  # its metadata is written before it exits
        again = Node(
            tmp_path / "z", "z", "", metadata="swc", seeds=[(HOST, cluster.nodes["a"].cluster_port)]
        )
        cluster.nodes["z"] = again
        again.start()
        again.wait_for_log(
            r"not joining through seed .* holds metadata of another cluster", TIMEOUT
        )
    finally:
        cluster.close()
