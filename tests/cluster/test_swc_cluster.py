"""The leaderless metadata (`metadata = "swc"`) end to end: three `python -m broker` node
processes on loopback and no Redis at all. Node a starts alone; b and c join through it
(`seeds`), learn of each other from the replicated member records, and link to every
member. Then subscriptions and retained messages replicate: a subscription on one node
routes publishes from the others (exact, wildcard, `$share`), an unsubscribe removes the
route everywhere, a retained message set and cleared on one node is seen so on another.
(A node that holds another cluster's metadata is refused at join:
test_cluster_start.py.) Members come and go by command (`nautilus cluster join`,
`leave`, `show`); a partition heals to one state; a node killed with -9 comes back with
what it let out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from testing.lifecycle import free_port
from tests.broker.helpers import (
    PUBLISH,
    UNSUBACK,
    V5,
    V311,
    PahoClient,
    RawClient,
    publish_packet,
    unique_id,
    unsubscribe_packet,
)
from tests.cluster.nodes import API_KEY, ClusterNode
from tests.cluster.test_cluster import (
    HOST,
    TIMEOUT,
    Node,
    closed_since,
    disconnect,
    eventually,
    retained_seen,
    session_rows,
    subscribe_with_probe,
    take,
    wait_routed,
)
from tests.test_cli import clean_env

SERVER_SHUTTING_DOWN = 0x8B


class SwcCluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: dict[str, Node] = {}
        self.clients: list[PahoClient] = []

    def start(self, name: str, seeds: list[str] = ()) -> Node:  # type: ignore[assignment]
        """Node `name` joining through `seeds` (none: a cluster of its own)."""
        node = Node(
            self.tmp_path / name,
            name,
            "",
            metadata="swc",
            seeds=[(self.nodes[seed].host, self.nodes[seed].cluster_port) for seed in seeds],
            **self.node_keys(name),
        )
        self.nodes[name] = node
        node.start()
        return node

    def restart(self, name: str, seed: str) -> Node:
        """Node `name` started again on its own store and cluster port (after a stop or a
        kill), joining through `seed`."""
        old = self.nodes[name]
        node = Node(
            old.directory,
            name,
            "",
            metadata="swc",
            cluster_port=old.cluster_port,
            seeds=[(HOST, self.nodes[seed].cluster_port)],
        )
        self.nodes[name] = node
        node.start()
        return node

    def offline_subscriber(self, node: str, prefix: str, topic: str, routed_from: str) -> str:
        """A persistent client of `node` subscribed to `topic` (QoS 1), routed there from
        `routed_from`, then disconnected; its client id."""
        client_id = unique_id(prefix)
        sub = PahoClient(HOST, self.nodes[node].port, V311, client_id)
        self.clients.append(sub)
        sub.connect(clean=False)
        subscribe_with_probe(sub, (topic, 1))
        wait_routed(self.client(routed_from), sub)
        sub.close()
        return client_id

    def node_keys(self, name: str) -> dict[str, Any]:
        """More of Node's keys for node `name` (a subclass's: where it runs, say)."""
        return {}

    def start_all(self) -> None:
        """a alone, then b and c joining through a at once; every link up."""
        self.start("a")
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda name: self.start(name, ["a"]), ("b", "c")))
        for name, node in self.nodes.items():
            node.wait_links([peer for peer in self.nodes if peer != name])

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
    """A trio of this test's own (start_all), which it may stop, kill or add to."""
    cluster = SwcCluster(tmp_path)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def running_trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwcCluster]:
    """One trio for the module's tests that leave its members as they found them."""
    cluster = SwcCluster(tmp_path_factory.mktemp("trio"))
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def shared_trio(running_trio: SwcCluster) -> Iterator[SwcCluster]:
    """The module's trio; the clients the test connected are closed after it (closed_since)."""
    before = len(running_trio.clients)
    try:
        yield running_trio
    finally:
        closed_since(running_trio.clients, before, running_trio.nodes.values())


def remote_subscribers(node: Node) -> int:
    status: dict[str, Any] = node.cluster_status()
    return int(status["remote_subscribers"])


def test_nodes_join_through_a_seed_and_route_to_each_other(shared_trio: SwcCluster) -> None:
    sub_a = shared_trio.client("a", V5)
    sub_c = shared_trio.client("c", V311)
    subscribe_with_probe(sub_a, ("swc/exact", 1), ("swc/+/x", 1))
    subscribe_with_probe(sub_c, ("swc/#", 0))
    pub_b = shared_trio.client("b", V5)
    wait_routed(pub_b, sub_a)
    wait_routed(pub_b, sub_c)
    pub_b.publish("swc/exact", b"one", 1)
    pub_b.publish("swc/y/x", b"two", 1)
    assert [m.payload for m in (sub_a.expect_message(), sub_a.expect_message())] == [
        b"one",
        b"two",
    ]
    assert [sub_c.expect_message().payload for _ in range(2)] == [b"one", b"two"]
    metrics = shared_trio.nodes["b"].metrics()  # the totals, and per group (labels dropped)
    assert metrics["swc_objects"] >= 5  # 3 members, 2 subscribers
    assert metrics["swc_exchanges"] > 0 and "swc_group_sync_age_seconds" in metrics
    c = shared_trio.nodes["c"]  # a joiner: each group synced by its first exchange
    status = eventually(
        lambda: (s := c.cluster_status())["swc"]["groups_synced"] == 10 and s,
        what="every group of c synced",
    )
    assert status["metadata"] == "ready" and status["swc"]["groups"] == 10
    assert status["swc"]["unreachable"] == []


def test_a_shared_group_across_nodes_gets_each_message_once(shared_trio: SwcCluster) -> None:
    group = unique_id("g")
    members = [shared_trio.client(name) for name in ("a", "c")]
    for member in members:
        assert member.subscribe(f"$share/{group}/swc/shared", 1) == [1]
        subscribe_with_probe(member)
    pub = shared_trio.client("b")
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


def test_an_unsubscribe_removes_the_route_on_every_node(shared_trio: SwcCluster) -> None:
    sub = shared_trio.client("a")
    subscribe_with_probe(sub, ("swc/gone", 1))
    for name in ("b", "c"):
        eventually(lambda n=name: remote_subscribers(shared_trio.nodes[n]) >= 1, what=name)
    sub.unsubscribe("swc/gone")
    sub.unsubscribe(f"probe/{sub.client_id}")
    sub.disconnect()
    for name in ("b", "c"):
        eventually(lambda n=name: remote_subscribers(shared_trio.nodes[n]) == 0, what=name)


def test_retained_set_on_one_node_and_cleared_on_another(shared_trio: SwcCluster) -> None:
    topic = unique_id("swc/retained")
    setter = shared_trio.client("a")
    setter.publish(topic, b"kept", 1, retain=True)
    reader = shared_trio.client("c")
    seen = eventually(lambda: retained_seen(reader, topic), what="the retained message on c")
    assert seen.payload == b"kept"
    shared_trio.client("b").publish(topic, b"", 1, retain=True)  # cleared on b
    eventually(lambda: retained_seen(reader, topic) is None, what="cleared on c")


def cluster_command(node: ClusterNode, *args: str) -> subprocess.CompletedProcess[str]:
    """`nautilus cluster ARGS...` against `node`'s admin API."""
    url = f"http://{HOST}:{node.http_port}"
    return subprocess.run(
        [sys.executable, "-m", "broker", "cluster", *args, "--url", url, "--key", API_KEY],
        cwd=node.directory,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def members(node: Node) -> list[str]:
    return sorted(
        row["node"] for row in json.loads(cluster_command(node, "show", "--json").stdout)["table"]
    )


def test_a_dead_member_removed_by_leave_has_its_sessions_taken_over(swc_trio: SwcCluster) -> None:
    a, b, c = (swc_trio.nodes[name] for name in "abc")
    client_id = swc_trio.offline_subscriber("c", "kept", "left/t", routed_from="b")
    c.kill()  # a crash: its members still list it, its link retries
    result = cluster_command(a, "leave", "c")
    assert result.returncode == 0, result.stderr
    assert "c removed (it cannot be reached)" in result.stdout
    eventually(lambda: members(b) == ["a", "b"], what="c gone from b's members")
    # a, the live member with the lowest name, takes c's persistent session.
    a.wait_for_log(r"node c forgotten \(its sessions reaped\)", TIMEOUT)
    swc_trio.client("a").publish("left/t", b"while away", 1)  # a holds it now
    back = PahoClient(HOST, a.port, V311, client_id)
    swc_trio.clients.append(back)
    assert back.connect(clean=False).session_present
    assert back.expect_message().payload == b"while away"


def test_a_live_member_leaves_with_its_sessions_and_their_queues(swc_trio: SwcCluster) -> None:
    """`nautilus cluster leave c` run on a while c is alive: c sends its clients away
    (MQTT 5: 0x8B), hands every session it holds to a or b with its queue, is removed
    from the members, and stops; its subscribers find everything queued for them on
    whichever node they reconnect to, and c's directory does not start again."""
    a, b, c = (swc_trio.nodes[name] for name in "abc")
    pub = swc_trio.client("a")
    queued_id, online_id = unique_id("queued"), unique_id("online")
    queued = PahoClient(HOST, c.port, V311, queued_id)
    online = PahoClient(HOST, c.port, V5, online_id)
    swc_trio.clients += [queued, online]
    queued.connect(clean=False)
    subscribe_with_probe(queued, ("bye/t", 1))
    wait_routed(pub, queued)
    disconnect(queued, c)
    for n in range(100):
        pub.publish("bye/t", b"%d" % n, 1)
    eventually(lambda: session_rows(c, queued_id)[0]["queue_size"] == 100, what="100 queued on c")
    online.connect(clean=False, session_expiry=300)
    online.subscribe("bye/online", 1)
    eventually(lambda: session_rows(c, online_id), what=f"{online_id} on c")

    unknown = cluster_command(a, "leave", "x")
    assert unknown.returncode == 1 and "x is not a member" in unknown.stderr
    result = cluster_command(a, "leave", "c")  # a asks c, which leaves by itself
    assert result.returncode == 0, result.stderr
    assert "c is leaving" in result.stdout
    assert online.expect_disconnected() == SERVER_SHUTTING_DOWN
    assert c.process is not None and c.process.proc.wait(TIMEOUT) == 0
    c.wait_for_log(r"c left the cluster \(2 sessions handed over\)")
    eventually(lambda: members(a) == members(b) == ["a", "b"], what="c gone from the members")

    back = PahoClient(HOST, b.port, V311, queued_id)
    swc_trio.clients.append(back)
    assert back.connect(clean=False).session_present
    assert [m.payload for m in take(back, 100)] == [b"%d" % n for n in range(100)]
    again = PahoClient(HOST, a.port, V5, online_id)
    swc_trio.clients.append(again)
    assert again.connect(clean=False, session_expiry=300).session_present
    pub.publish("bye/online", b"still subscribed", 1)
    assert again.expect_message().payload == b"still subscribed"

    restarted = subprocess.run(
        [sys.executable, "-m", "broker", "--config", str(c.config_path)],
        cwd=c.directory,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert restarted.returncode == 2
    assert "node c left its cluster at" in restarted.stderr
    assert "wipe" in restarted.stderr


def test_a_node_started_alone_joins_by_command_and_copies_the_cluster(
    swc_trio: SwcCluster,
) -> None:
    sub = swc_trio.client("a")
    subscribe_with_probe(sub, ("joined/t", 1))
    d = swc_trio.start("d")  # no seeds: a cluster of its own
    alone = cluster_command(d, "leave")  # (this node) has nobody to hand its sessions to
    assert alone.returncode == 1 and "no live member to hand its sessions to" in alone.stderr
    result = cluster_command(d, "join", f"{HOST}:{swc_trio.nodes['a'].cluster_port}")
    assert result.returncode == 0, result.stderr
    d.wait_links(["a", "b", "c"])
    pub = swc_trio.client("d")
    wait_routed(pub, sub)  # a's subscription, copied to d
    assert members(d) == ["a", "b", "c", "d"]
    refused = cluster_command(d, "join", "nowhere")
    assert refused.returncode == 1 and "host:port" in refused.stderr


class ProxiedTrio(SwcCluster):
    """a, b and c, where every link between c and the others goes through a proxy
    (`cut()` resets them all, `heal()` lets them pass), so c can be split off."""

    def __init__(self, tmp_path: Path, start_proxy: Any, **c_keys: str) -> None:
        super().__init__(tmp_path)
        self.ports = {name: free_port() for name in "abc"}
        to_c = {name: start_proxy((HOST, self.ports["c"])) for name in "ab"}  # a, b -> c
        from_c = {name: start_proxy((HOST, self.ports[name])) for name in "ab"}  # c -> a, b
        self.proxies = [*to_c.values(), *from_c.values()]
        self._peers = {"a": {"c": to_c["a"].address}, "b": {"c": to_c["b"].address}}
        self._peers["c"] = {n: from_c[n].address for n in "ab"}
        self._c_keys = c_keys

    def node_keys(self, name: str) -> dict[str, Any]:
        """Its fixed cluster port, its peers' addresses (proxies where c is one end),
        and for c the [cluster] keys given. (start_all() inside the test's try: close()
        stops whatever started.)"""
        keys = self._c_keys if name == "c" else {}
        return {
            "cluster_port": self.ports[name],
            "peer_addresses": self._peers[name],
            "extra": "".join(f"{key} = {value}\n" for key, value in keys.items()),
        }

    def cut(self) -> dict[str, int]:
        """Split c off; each node's log position before it (to wait for what follows)."""
        before = {name: len(node.drain_log()) for name, node in self.nodes.items()}
        for proxy in self.proxies:
            proxy.reset()
        return before

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.pass_through()


def test_a_partition_heals_to_one_state_with_every_change_of_both_sides(
    tmp_path: Path, start_proxy: Any
) -> None:
    """{a, b} | {c}: each side keeps serving; after the heal every node holds both
    sides' subscriptions, and a retained message set on both sides is the later one."""
    cluster = ProxiedTrio(tmp_path, start_proxy)
    try:
        cluster.start_all()
        c = cluster.nodes["c"]
        topic = unique_id("split/retained")
        split_at = cluster.cut()
        c.wait_line(r"cluster link to a \(\S+\) down", split_at["c"])
        c.wait_line(r"cluster link to b \(\S+\) down", split_at["c"])
        cluster.client("a").publish(topic, b"from a", 1, retain=True)
        sub_b = cluster.client("b")
        subscribe_with_probe(sub_b, ("split/b", 1))
        sub_c = cluster.client("c")
        subscribe_with_probe(sub_c, ("split/c", 1))
        cluster.client("c").publish(topic, b"from c, later", 1, retain=True)
        cluster.heal()
        c.wait_links(["a", "b"], since=split_at["c"])
        for name in "ab":
            cluster.nodes[name].wait_links(["c"], since=split_at[name])
        wait_routed(cluster.client("a"), sub_c)  # c's side's subscription, on a
        wait_routed(cluster.client("c"), sub_b)  # and the other way
        for name in "abc":
            reader = cluster.client(name)
            seen = eventually(
                lambda r=reader: (m := retained_seen(r, topic)) and m.payload == b"from c, later",
                what=f"the later retained message on {name}",
            )
            assert seen
    finally:
        cluster.close()


def test_a_member_removed_while_cut_off_leaves_with_its_queues_once_it_is_back(
    tmp_path: Path, start_proxy: Any
) -> None:
    """c, cut off, is removed by `leave c` on a (it cannot be asked); a takes c's
    persistent session, without its queue. When the links are back c learns that it is
    no longer a member: it hands what it holds to the others (the queue goes to a, the
    session's owner now) and stops, instead of serving on outside the cluster."""
    cluster = ProxiedTrio(tmp_path, start_proxy)
    try:
        cluster.start_all()
        a, c = cluster.nodes["a"], cluster.nodes["c"]
        client_id = unique_id("cutoff")
        sub = PahoClient(HOST, c.port, V311, client_id)
        cluster.clients.append(sub)
        sub.connect(clean=False)
        subscribe_with_probe(sub, ("cut/t", 1))
        pub = cluster.client("a")
        wait_routed(pub, sub)
        disconnect(sub, c)
        for n in range(10):
            pub.publish("cut/t", b"%d" % n, 1)
        eventually(lambda: session_rows(c, client_id)[0]["queue_size"] == 10, what="queued")
        split_at = cluster.cut()
        a.wait_line(r"cluster link to c \(\S+\) down", split_at["a"])
        result = cluster_command(a, "leave", "c")
        assert result.returncode == 0, result.stderr
        assert "c removed (it cannot be reached)" in result.stdout
        a.wait_line(r"node c forgotten \(its sessions reaped\)", split_at["a"])
        cluster.heal()
        c.wait_line(r"this node was removed from the cluster by another member", split_at["c"])
        assert c.process is not None and c.process.proc.wait(TIMEOUT) == 0
        c.wait_line(rf"{client_id} moved to node a with 10 queued messages", split_at["c"])
        back = PahoClient(HOST, a.port, V311, client_id)
        cluster.clients.append(back)
        assert back.connect(clean=False).session_present
        assert [m.payload for m in take(back, 10)] == [b"%d" % n for n in range(10)]
    finally:
        cluster.close()


def test_a_node_killed_and_restarted_keeps_what_it_sent_and_never_reuses_a_write(
    swc_trio: SwcCluster,
) -> None:
    """b writes a stream of subscription changes, a sees them, b is killed (-9) and
    restarted: what a saw from b is still b's (b's next writes are news to a, so b made
    no write identity twice), and b's persistent subscriber is routed from a again."""
    a, b = swc_trio.nodes["a"], swc_trio.nodes["b"]
    client_id = unique_id("durable")
    sub = PahoClient(HOST, b.port, V311, client_id)
    swc_trio.clients.append(sub)
    sub.connect(clean=False)
    for i in range(30):
        assert sub.subscribe(f"kill/{i}", 1) == [1]
    subscribe_with_probe(sub)
    wait_routed(swc_trio.client("a"), sub)  # a has every one of b's writes so far
    sub.close()
    b.kill()
    restarted = swc_trio.restart("b", "a")
    restarted.wait_links(["a", "c"])
    # a took b for a netsplit while it was down: it accepts clients once its link is back.
    eventually(lambda: a.cluster_status()["metadata"] == "ready", what="a reaches b again")
    fresh = swc_trio.client("b")
    subscribe_with_probe(fresh, ("after/restart", 1))
    wait_routed(swc_trio.client("a"), fresh)  # a new write of b's reaches a: no reuse
    back = PahoClient(HOST, restarted.port, V311, client_id)
    swc_trio.clients.append(back)
    assert back.connect(clean=False).session_present
    pub = swc_trio.client("a")
    pub.publish("kill/29", b"after the crash", 1)
    # A probe the client had not acknowledged before it closed comes again first.
    while (message := back.expect_message()).payload != b"after the crash":
        assert message.topic == f"probe/{client_id}", message


def test_a_session_that_moved_and_ended_while_its_node_was_down_stays_ended(
    swc_trio: SwcCluster,
) -> None:
    """A persistent session of b's moves to a while b is stopped, and ends there (its
    client comes back clean). b, restarted, restores its own copy from its store, then
    learns of the end: it drops the copy instead of writing it back (it used to: the
    session came back to life on b, with its subscriptions routed there)."""
    a, b = swc_trio.nodes["a"], swc_trio.nodes["b"]
    client_id = swc_trio.offline_subscriber("b", "moved", "moved/t", routed_from="a")
    assert b.stop() == 0
    moved = PahoClient(HOST, a.port, V311, client_id)
    swc_trio.clients.append(moved)
    assert moved.connect(clean=False).session_present  # b's session, taken over by a
    moved.close()
    ended = PahoClient(HOST, a.port, V311, client_id)
    swc_trio.clients.append(ended)
    ended.connect(clean=True)  # ends the session [MQTT-3.1.2-6]
    ended.close()
    eventually(lambda: not session_rows(a, client_id), what="the session ended on a")
    restarted = swc_trio.restart("b", "a")
    # Restored from b's store at its start, then dropped once b learns of the end.
    eventually(lambda: not session_rows(restarted, client_id), what="b dropped its copy")
    back = PahoClient(HOST, restarted.port, V311, client_id)
    swc_trio.clients.append(back)
    assert not back.connect(clean=False).session_present


def test_a_node_cut_off_refuses_what_the_netsplit_switches_say(
    tmp_path: Path, start_proxy: Any
) -> None:
    """c cut off from a and b: every node misses a member. With the switches off
    (VerneMQ's defaults) a CONNECT is refused (3 / 0x88), a QoS 1 PUBLISH gets no PUBACK,
    a SUBSCRIBE a SUBACK of 0x80, an MQTT 5 UNSUBSCRIBE an UNSUBACK of 0x80 and an MQTT 3
    one closes its connection; once the links are back, c serves again. With
    allow_publish_during_netsplit on (c's), c's own subscribers get c's publishes."""
    cluster = ProxiedTrio(tmp_path, start_proxy, allow_publish_during_netsplit="true")
    try:
        cluster.start_all()
        c = cluster.nodes["c"]
        v5, v3 = RawClient(HOST, c.port, V5), RawClient(HOST, c.port, V311)
        listener = RawClient(HOST, c.port, V311)
        on_a = RawClient(HOST, cluster.nodes["a"].port, V5)  # a keeps the switches off
        for raw in (v5, v3, listener, on_a):
            raw.connect(unique_id("split"))
        assert listener.subscribe(("split/allowed", 0)) == [0]
        split_at = cluster.cut()
        c.wait_line(r"cluster: not ready: .*cannot be reached \(netsplit\)", split_at["c"])
        status = c.cluster_status()
        assert status["metadata"] == "not ready (netsplit)"
        assert status["swc"]["unreachable"] == ["a", "b"]

        late = RawClient(HOST, c.port, V311)
        assert late.connect(unique_id("late"), expect_code=None).reason_code == 3
        late.close()
        cluster.nodes["a"].wait_line(r"cluster: not ready", split_at["a"])
        on_a.send(publish_packet("split/t", b"x", qos=1, packet_id=7, version=V5))
        assert on_a.subscribe(("split/t", 1)) == [0x80]  # a PUBACK would have come first
        assert v5.subscribe(("split/t", 1)) == [0x80]
        v5.send(unsubscribe_packet(9, ["split/t"], version=V5))
        assert v5.expect(UNSUBACK).reason_codes == [0x80]
        v3.send(unsubscribe_packet(3, ["split/t"]))
        v3.expect_closed()
        v5.publish("split/allowed", b"kept on c")  # QoS 0: allowed on c by its switch
        # ... which is why it reaches c's own subscriber:
        assert listener.expect(PUBLISH).payload == b"kept on c"

        cluster.heal()
        c.wait_line(r"cluster: ready again, every member reached", split_at["c"])
        again = RawClient(HOST, c.port, V311)
        assert again.connect(unique_id("again")).reason_code == 0
        assert again.subscribe(("split/t", 1)) == [1]
        again.close()
        for raw in (v5, listener, on_a):
            raw.close()
    finally:
        cluster.close()
