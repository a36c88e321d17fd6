"""Real network partitions between leaderless (`metadata = "swc"`) nodes: each of a, b
and c runs in a network namespace of its own, every two joined by a veth pair
(testing/netns.py); the test's clients reach each node on its own link, which no
partition touches. Packets between nodes are dropped silently, as by a dead switch or a
firewall, not reset as test_swc_cluster.py's proxies do: a side learns of the split only
from silence (`dead_after`), and TCP's retransmissions and back-off are in play.

- c cut off from a and b for 30 s, the netsplit switches on so that both sides go on:
  subscriptions made and removed, retained messages set and cleared, and two client ids
  registered on both sides (one offline with a queue on a, one online on a); after the
  heal every node routes every subscription and holds the same retained messages, and
  each client id belongs to one node, the later registration's: a's online one is
  disconnected (0x8E), and the queue a held follows its session.
- one way: a's packets to b dropped, b's to a passing: a and b each find the other
  unreachable (a TCP connection needs both ways), c stays ready, and all converge.
- 20% loss each way between a and b: QoS 1 messages from a to b all arrive, and the
  cluster ends ready with every link up.
- one DNS name for the three, as a headless service's: in each namespace SET_NAME
  resolves to the three nodes' addresses (a hosts file that `ip netns exec` mounts over
  /etc/hosts), every node's seeds are `SET_NAME:SET_PORT`, and the three started at once
  form one cluster within test_cluster_start.py's READY_WITHIN.

The one-way and lossy tests share one trio with the defaults (healed and ready again
after each); the 30 s cut, with the switches on, has its own. They need root and
iproute2 (`ip`, `tc`); without them they are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.netns import Network
from tests.broker.helpers import V5, V311, PahoClient, RawClient, unique_id
from tests.cluster.test_cluster import (
    SESSION_TAKEN_OVER,
    TIMEOUT,
    Node,
    admin,
    disconnect,
    eventually,
    probe_topic,
    retained_seen,
    session_rows,
    subscribe_with_probe,
    take,
    wait_routed,
)
from tests.cluster.test_cluster_start import StartedTogether, assert_one_cluster
from tests.cluster.test_swc_cluster import SwcCluster

NAMES = ("a", "b", "c")
PARTITION = 30.0  # seconds c stays cut off (the scenario: 20 x dead_after)
HEAL_TIMEOUT = 30.0  # a link's reconnection may wait out TCP's SYN back-off
NETSPLIT = r"cluster: not ready: .*cannot be reached \(netsplit\)"
READY_AGAIN = r"cluster: ready again, every member reached"
# Both sides of a split go on (docs/clustering.md, "Netsplits"); the defaults refuse.
SWITCHES_ON = "".join(
    f"allow_{what}_during_netsplit = true\n"
    for what in ("register", "publish", "subscribe", "unsubscribe")
)
CONNECTION_REFUSED_SERVER_UNAVAILABLE = 3  # MQTT 3's CONNACK code for 0x88
SET_NAME = "nautilus-set"  # the three nodes' one name (a headless service's)
# Every node's cluster port, at its own address: a namespace is new, nothing else listens
# in it, and the port is below the ephemeral range its MQTT and HTTP ports come from.
SET_PORT = 18830
NETNS_FILES = Path("/etc/netns")  # `ip netns exec NS` mounts NETNS_FILES/NS/hosts on /etc/hosts


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    """Namespaces a, b and c, every two linked (skipped without root or iproute2): the
    module's, healed after each test by the trio fixtures."""
    net = Network(NAMES)
    try:
        yield net.create()
    finally:
        net.remove()


@pytest.fixture
def named_set(network: Network) -> Iterator[str]:
    """SET_NAME resolving to a's, b's and c's addresses in each of their namespaces (a
    hosts file of /etc/hosts' lines and those, removed after)."""
    lines = "".join(f"{network.address(name)} {SET_NAME}\n" for name in NAMES)
    hosts = Path("/etc/hosts").read_text(encoding="utf-8") + lines
    made = [NETNS_FILES / network.namespace(name) for name in NAMES]
    had_netns_files = NETNS_FILES.exists()
    try:
        for directory in made:
            directory.mkdir(parents=True)
            (directory / "hosts").write_text(hosts, encoding="utf-8")
        yield SET_NAME
    finally:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)
        if not had_netns_files:
            with contextlib.suppress(OSError):  # (another run's files are in it)
                NETNS_FILES.rmdir()


class NamespacedTrio(SwcCluster):
    """SwcCluster's a, b and c, each in its namespace of `network` and bound to its
    address there; clients connect from this namespace."""

    def __init__(self, tmp_path: Path, network: Network, cluster_keys: str = "") -> None:
        super().__init__(tmp_path)
        self.network = network
        self.cluster_keys = cluster_keys  # lines of [cluster], every node's

    def node_keys(self, name: str) -> dict[str, Any]:
        return {
            "host": self.network.address(name),
            "prefix": self.network.prefix(name),
            "extra": self.cluster_keys,
        }

    def client(
        self, node: str, version: int = V311, client_id: str | None = None, clean: bool = True
    ) -> PahoClient:
        """A client connected to `node` (MQTT 5 and clean=False: a session of 300 s)."""
        at = self.nodes[node]
        client = PahoClient(at.host, at.port, version, client_id)
        self.clients.append(client)
        client.connect(clean=clean, session_expiry=None if clean or version != V5 else 300)
        return client

    def log_positions(self) -> dict[str, int]:
        """How many lines each node has logged, to wait for what comes after."""
        return {name: len(node.drain_log()) for name, node in self.nodes.items()}

    def wait_healed(self, since: dict[str, int], split: str) -> None:
        """The nodes named in `split` ready again (every member reached) after `since`,
        and every node ready."""
        for name in split:
            self.nodes[name].wait_line(READY_AGAIN, since[name], HEAL_TIMEOUT)
        self.wait_ready()

    def wait_ready(self) -> None:
        """Every node ready (no member unreachable)."""
        for name in NAMES:
            eventually(
                lambda n=name: self.nodes[n].cluster_status()["metadata"] == "ready",
                HEAL_TIMEOUT,
                what=f"{name} ready",
            )


@pytest.fixture
def trio(
    tmp_path: Path, network: Network, request: pytest.FixtureRequest
) -> Iterator[NamespacedTrio]:
    """The three nodes started, this test's own (parametrized indirectly: their [cluster]
    keys)."""
    cluster = NamespacedTrio(tmp_path, network, request.param)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()
        network.heal()


@pytest.fixture(scope="module")
def running_trio(
    tmp_path_factory: pytest.TempPathFactory, network: Network
) -> Iterator[NamespacedTrio]:
    """The three nodes with the default [cluster] keys, for the module's tests that leave
    them as they found them (shared_trio)."""
    cluster = NamespacedTrio(tmp_path_factory.mktemp("trio"), network)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def shared_trio(running_trio: NamespacedTrio, network: Network) -> Iterator[NamespacedTrio]:
    """The module's trio; after the test, the network healed, the clients it connected
    closed, and every node ready again."""
    before = len(running_trio.clients)
    try:
        yield running_trio
    finally:
        network.heal()
        for client in running_trio.clients[before:]:
            client.close()
        del running_trio.clients[before:]
        running_trio.wait_ready()


def routed(publisher: PahoClient, subscriber: PahoClient, topic: str) -> bool:
    """Whether a message on `topic` published through `publisher` reaches `subscriber`:
    it would come before a marker on the subscriber's probe topic published after it."""
    publisher.publish(topic, b"routed?", 1)
    marker = unique_id("marker").encode()
    publisher.publish(probe_topic(subscriber), marker, 1)
    return any(m.topic == topic for m in subscriber.collect_until(marker))


def arrived(client: PahoClient, payloads: set[bytes], timeout: float) -> set[bytes]:
    """Which of `payloads` reach `client` within `timeout`."""
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout
    while not payloads <= got and (left := deadline - time.monotonic()) > 0:
        try:
            got.add(client.messages.get(timeout=left).payload)
        except queue.Empty:
            break
    return got & payloads


@pytest.mark.parametrize("trio", [SWITCHES_ON], indirect=True)
def test_a_node_cut_off_for_30_s_converges_with_what_both_sides_changed(
    trio: NamespacedTrio, network: Network
) -> None:
    """c alone for 30 s; both sides change subscriptions, retained messages and
    sessions (one client id offline with a queue on a, one online on a, each registered
    again on c later); after the heal every node has every change, the later one where
    both sides changed a key."""
    a, b, c = (trio.nodes[name] for name in NAMES)
    retained, cleared = unique_id("part/retained"), unique_id("part/cleared")
    twin, roamer = unique_id("twin"), unique_id("roamer")  # registered on both sides
    leaving = trio.client("c")  # unsubscribes on c's side
    subscribe_with_probe(leaving, ("part/gone", 1))
    wait_routed(trio.client("a"), leaving)
    trio.client("a").publish(cleared, b"set before", 1, retain=True)
    reader = trio.client("c")
    eventually(lambda: retained_seen(reader, cleared), what="the retained message on c")

    split_at = trio.log_positions()
    cut_at = time.monotonic()
    network.cut("a", "c")
    network.cut("b", "c")
    for node in (a, b, c):
        node.wait_line(NETSPLIT, split_at[node.name])
    assert sorted(c.cluster_status()["swc"]["unreachable"]) == ["a", "b"]
    assert a.cluster_status()["swc"]["unreachable"] == ["c"]

    # a and b's side
    sub_b = trio.client("b")
    subscribe_with_probe(sub_b, ("part/b", 1))
    trio.client("a").publish(retained, b"from a", 1, retain=True)
    trio.client("b").publish(cleared, b"", 1, retain=True)
    twin_on_a = trio.client("a", client_id=twin, clean=False)
    subscribe_with_probe(twin_on_a, ("part/twin", 1))
    disconnect(twin_on_a, a)
    publisher_a = trio.client("a")
    for n in range(3):
        publisher_a.publish("part/twin", b"queued on a %d" % n, 1)
    eventually(lambda: session_rows(a, twin)[0]["queue_size"] == 3, what="3 queued on a")
    roamer_on_a = trio.client("a", V5, roamer, clean=False)  # stays online
    # c's side, later
    sub_c = trio.client("c")
    subscribe_with_probe(sub_c, ("part/c", 1))
    leaving.unsubscribe("part/gone")  # its UNSUBACK came (MQTT 3: no codes)
    trio.client("c").publish(retained, b"from c, later", 1, retain=True)
    on_side_a = retained_seen(trio.client("a"), retained)  # the sides differ meanwhile
    assert on_side_a is not None and on_side_a.payload == b"from a"
    twin_on_c = trio.client("c", client_id=twin, clean=False)
    subscribe_with_probe(twin_on_c, ("part/twin", 1))
    disconnect(twin_on_c, c)
    roamer_on_c = trio.client("c", V5, roamer, clean=False)
    time.sleep(max(0.0, PARTITION - (time.monotonic() - cut_at)))  # the split's length

    healed_at = trio.log_positions()
    network.heal()
    trio.wait_healed(healed_at, "abc")
    wait_routed(trio.client("a"), sub_c)  # c's side's subscription, on a
    wait_routed(trio.client("c"), sub_b)  # and a and b's on c
    eventually(lambda: not routed(publisher_a, leaving, "part/gone"), what="c's unsubscribe on a")
    for name in NAMES:
        reader = trio.client(name)
        eventually(
            lambda r=reader: (m := retained_seen(r, retained)) and m.payload == b"from c, later",
            what=f"c's later retained message on {name}",
        )
        eventually(lambda r=reader: retained_seen(r, cleared) is None, what=f"cleared on {name}")
    # Each client id held by one node, the later registration's (c's).
    assert roamer_on_a.expect_disconnected(HEAL_TIMEOUT) == SESSION_TAKEN_OVER
    for client_id in (twin, roamer):
        owners = eventually(
            lambda i=client_id: (
                (rows := admin(b, "session/show", client_id=i)) and len(rows) == 1 and rows
            ),
            HEAL_TIMEOUT,
            what=f"{client_id} held by one node",
        )
        assert owners[0]["node"] == "c", owners
    assert roamer_on_c.client is not None and roamer_on_c.disconnects.empty()
    back = trio.client("b", client_id=twin, clean=False)  # a's queue followed the session
    assert sorted(m.payload for m in take(back, 3)) == [b"queued on a %d" % n for n in range(3)]


def test_a_one_way_partition_is_noticed_on_both_ends_and_heals(
    shared_trio: NamespacedTrio, network: Network
) -> None:
    """a's packets to b are dropped, b's to a pass: neither link works (TCP needs both
    ways), so a and b each miss the other and refuse CONNECTs (the defaults); c reaches
    both. Once healed, every node is ready and routes the others' subscriptions."""
    a, b, c = (shared_trio.nodes[name] for name in NAMES)
    split_at = shared_trio.log_positions()
    network.cut_one_way("a", "b")
    a.wait_line(r"cluster: not ready: b cannot be reached \(netsplit\)", split_at["a"])
    b.wait_line(r"cluster: not ready: a cannot be reached \(netsplit\)", split_at["b"])
    assert a.cluster_status()["swc"]["unreachable"] == ["b"]
    assert b.cluster_status()["swc"]["unreachable"] == ["a"]
    assert c.cluster_status()["metadata"] == "ready"
    for node in (a, b):
        refused = RawClient(node.host, node.port)
        connack = refused.connect(unique_id("split"), expect_code=None)
        assert connack.reason_code == CONNECTION_REFUSED_SERVER_UNAVAILABLE
        refused.close()
    sub_c = shared_trio.client("c")  # c serves on: CONNECT and SUBSCRIBE accepted
    subscribe_with_probe(sub_c, ("oneway/c", 1))

    healed_at = shared_trio.log_positions()
    network.heal()
    shared_trio.wait_healed(healed_at, "ab")
    sub_a, sub_b = shared_trio.client("a"), shared_trio.client("b")
    subscribe_with_probe(sub_a, ("oneway/a", 1))
    subscribe_with_probe(sub_b, ("oneway/b", 1))
    wait_routed(shared_trio.client("b"), sub_a)
    wait_routed(shared_trio.client("a"), sub_b)
    wait_routed(shared_trio.client("a"), sub_c)
    wait_routed(shared_trio.client("b"), sub_c)


LOSS_PERCENT = 25
LOSSY_SECONDS = 15.0  # 10 x dead_after


def crossed(publisher: PahoClient, subscriber: PahoClient, payload: bytes) -> bool:
    """Publish `payload` at QoS 1 and wait for it at `subscriber`."""
    publisher.publish("lossy/t", payload, 1)
    return bool(arrived(subscriber, {payload}, TIMEOUT))


def test_qos_1_messages_cross_a_lossy_link(shared_trio: NamespacedTrio, network: Network) -> None:
    """25% of the packets between a and b lost each way, while QoS 1 messages go one
    by one for 15 s from a publisher on a to a subscriber on b (each crosses the lossy
    link before the next is sent): every message arrives, and the cluster is ready on
    every node with the loss still on (a link may drop and come back meanwhile; no split
    stays)."""
    a = shared_trio.nodes["a"]
    sub = shared_trio.client("b")
    subscribe_with_probe(sub, ("lossy/t", 1))
    pub = shared_trio.client("a")
    wait_routed(pub, sub)
    lossy_at = shared_trio.log_positions()
    network.lose("a", "b", LOSS_PERCENT)
    end = time.monotonic() + LOSSY_SECONDS
    sent = lost = 0
    while time.monotonic() < end:
        lost += not crossed(pub, sub, b"%d" % sent)
        sent += 1
    flaps = [line for line in a.drain_log()[lossy_at["a"] :] if "cluster link to b" in line]
    assert not lost, f"{lost} of {sent} lost; a's link to b: {flaps}"
    assert network.dropped("a", "b") > 0 and network.dropped("b", "a") > 0
    shared_trio.wait_ready()  # the loss still on


def test_three_nodes_started_together_find_each_other_by_one_dns_name(
    tmp_path: Path, network: Network, named_set: str
) -> None:
    """Every node's seeds: one name, resolving to the three addresses (itself among
    them); started at the same moment, they form one cluster."""
    nodes = {
        name: Node(
            tmp_path / name,
            name,
            "",
            metadata="swc",
            cluster_port=SET_PORT,
            seeds=[(named_set, SET_PORT)],
            host=network.address(name),
            prefix=network.prefix(name),
        )
        for name in NAMES
    }
    for name in NAMES:  # the name resolves, in each namespace, to the three
        resolved = subprocess.run(
            [*network.prefix(name), "getent", "ahostsv4", named_set],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert {line.split()[0] for line in resolved.splitlines()} == {
            network.address(node) for node in NAMES
        }
    together = StartedTogether(tmp_path, nodes)
    try:
        together.start()
        assert_one_cluster(together)
    finally:
        together.close()
