"""One config for every node (`metadata = "swc"`): three `python -m broker` processes
started at the same moment, each with the same seed list naming all three (itself
included), by IP and by DNS name, form one cluster: each accepts a client within
READY_WITHIN seconds of the start, a message published on one node reaches a subscriber
on another, and none logs the refusal of a node holding another cluster's metadata
(which still refuses a node that does). One DNS name resolving to the three nodes'
addresses, as a headless service's, needs an address per node: test_partitions.py.

The tests of one kind (IP, DNS) share one set, started once (`together`, a module
fixture): each leaves it running and linked, a node a test adds is that test's to stop,
and the restart test, which kills and starts the set again, comes last.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.helpers import V311, PahoClient
from tests.cluster.nodes import COMPLETE_LINE, ClusterNode
from tests.cluster.test_cluster import (
    HOST,
    TIMEOUT,
    Node,
    eventually,
    retained_seen,
    subscribe_with_probe,
    take,
    wait_routed,
)
from tests.cluster.test_swc_cluster import SwcCluster

NAMES = ("a", "b", "c")
READY_WITHIN = 15.0  # seconds from the start to a node accepting clients
REFUSAL = re.compile(r"holds metadata of another cluster")
ACCEPTED = 0
STARTS = re.compile(r"cluster: starting the cluster")


def port_below_ephemeral() -> int:
    """A free port below the kernel's ephemeral range (ip_local_port_range), chosen before
    the nodes start: the ports they bind to 0 (MQTT, HTTP) never take it meanwhile."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        return port


def by_name(host: str, port: int) -> dict[str, str]:
    """A node's keys for listening on every address and advertising `host`:`port`."""
    return {"cluster_host": "0.0.0.0", "extra": f'advertise = "{host}:{port}"'}


class StartedTogether(SwcCluster):
    """Nodes a, b, c (not started yet, each with the same seed list), started at once."""

    def __init__(self, tmp_path: Path, nodes: dict[str, Node]) -> None:
        super().__init__(tmp_path)
        self.nodes = nodes
        self.started_at = 0.0
        # From the last start together: each node's first client accepted, and when.
        self.accepted: dict[str, tuple[PahoClient, float]] = {}

    @classmethod
    def on_loopback(cls, tmp_path: Path, seed_host: str) -> StartedTogether:
        """Each on a cluster port chosen before any starts, all with the seed list naming
        the three as `seed_host:port`. With a host name, each listens on every address and
        advertises `seed_host:port`: its own seed is not its listener's address, and it
        finds itself among the seeds by the name it answers with."""
        ports = {name: port_below_ephemeral() for name in NAMES}
        seeds = [(seed_host, ports[name]) for name in NAMES]
        nodes = {
            name: Node(
                tmp_path / name,
                name,
                "",
                metadata="swc",
                cluster_port=ports[name],
                seeds=seeds,
                **({} if seed_host == HOST else by_name(seed_host, ports[name])),
            )
            for name in NAMES
        }
        return cls(tmp_path, nodes)

    def start(self) -> None:  # type: ignore[override]
        """Every node at once (each thread launches one process and waits until it
        listens for MQTT; not until it holds the metadata), then a client accepted by
        each (`accepted`)."""
        failures: list[BaseException] = []

        def start(node: ClusterNode) -> None:
            try:
                node.start(complete=False)
            except BaseException as exc:  # shown by the test
                failures.append(exc)

        for node in self.nodes.values():
            node.prepare()  # (its config and API key written before the clock)
        threads = [threading.Thread(target=start, args=(node,)) for node in self.nodes.values()]
        self.started_at = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        self.accepted = {name: self.connect(name) for name in NAMES}

    def connect(self, name: str) -> tuple[PahoClient, float]:
        """A client accepted by node `name` (CONNECTs refused while the node is not ready
        are tried again), and the seconds from the start to its CONNACK."""
        node = self.nodes[name]
        deadline = self.started_at + READY_WITHIN
        while True:
            client = PahoClient(node.host, node.port, V311)
            result = client.connect(expect_code=None)
            if result.reason_code == ACCEPTED:
                self.clients.append(client)
                return client, time.monotonic() - self.started_at
            client.close()
            assert time.monotonic() < deadline, f"node {name} refused CONNECT: {result}"


@pytest.fixture(scope="module", params=[HOST, "localhost"], ids=["ip", "dns"])
def together(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedTogether]:
    """The set started together by IP or by name, shared by the module's tests of that
    kind (see the module's doc)."""
    cluster = StartedTogether.on_loopback(tmp_path_factory.mktemp("together"), request.param)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def test_nodes_started_together_from_one_seed_list_form_one_cluster(
    together: StartedTogether,
) -> None:
    assert_one_cluster(together)


def assert_one_cluster(together: StartedTogether) -> None:
    """Each node accepted a client within READY_WITHIN of the start, a message crosses,
    each is ready and linked to the two others; one node started the cluster, and no
    node refused another (or itself) or a link."""
    clients = together.accepted
    for name, (_, after) in clients.items():
        assert after <= READY_WITHIN, f"{name} accepted its first client {after:.1f}s in"
    subscriber, publisher = clients["c"][0], clients["a"][0]
    subscribe_with_probe(subscriber, ("start/topic", 1))
    wait_routed(publisher, subscriber)
    publisher.publish("start/topic", b"from a", 1)
    assert take(subscriber, 1)[0].payload == b"from a"
    for name, node in together.nodes.items():
        status = eventually(
            lambda node=node: (s := node.cluster_status())["metadata"] == "ready" and s,
            what=f"{name} ready",
        )
        linked = {n["node"] for n in status["nodes"] if n["link"]}
        assert linked == set(NAMES) - {name}, status["nodes"]
    lines = [line for node in together.nodes.values() for line in node.drain_log()]
    assert [line for line in lines if STARTS.search(line)], "no node started the cluster"
    assert not [line for line in lines if REFUSAL.search(line)]
    assert not [line for line in lines if "refused a link" in line]  # (not even itself)


def test_a_node_holding_another_clusters_metadata_is_refused_by_the_set(
    together: StartedTogether, tmp_path: Path
) -> None:
    for name in NAMES:
        together.nodes[name].wait_for_log(COMPLETE_LINE, READY_WITHIN)
    outside = SwcCluster(tmp_path)  # z, not one of the shared set: stopped with the test
    try:
        lone = outside.start("z")  # a cluster of its own
        client = outside.client("z")
        client.publish("z/topic", b"z's", 1, retain=True)
        client.close()
        lone.stop()  # its metadata is written before it exits
        again = Node(  # its seeds: the set's three, and itself
            tmp_path / "z",
            "z",
            "",
            metadata="swc",
            cluster_port=lone.cluster_port,
            seeds=[(HOST, node.cluster_port) for node in [*together.nodes.values(), lone]],
        )
        outside.nodes["z"] = again
        again.start()
        again.wait_for_log(
            r"not joining through seed .* holds metadata of another cluster", TIMEOUT
        )
    finally:
        outside.close()
    for name in NAMES:
        assert not [line for line in together.nodes[name].drain_log() if REFUSAL.search(line)]


def test_a_node_started_first_says_what_it_waits_for_and_the_others_come_in_any_order(
    tmp_path: Path,
) -> None:
    cluster = StartedTogether.on_loopback(tmp_path, HOST)
    try:
        b = cluster.nodes["b"].start(complete=False)
        cluster.started_at = time.monotonic()
        others = ", ".join(f"{HOST}:{cluster.nodes[name].cluster_port}" for name in ("a", "c"))
        waiting = f"not ready: waiting for seeds {others} (none answered yet)"
        eventually(lambda: health(b) == (503, {"status": "not ready", "reasons": [waiting]}))
        b.wait_for_log(f"WARNING nautilus.cluster: cluster: {re.escape(waiting)}", 2 * TIMEOUT)
        for name in ("c", "a"):
            cluster.nodes[name].start(complete=False)
        cluster.started_at = time.monotonic()
        clients = {name: cluster.connect(name)[0] for name in NAMES}
        subscribe_with_probe(clients["a"], ("any/order", 1))
        wait_routed(clients["b"], clients["a"])
        assert health(b) == (200, {"status": "ok"})
    finally:
        cluster.close()


def health(node: ClusterNode) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{node.http_port}/health") as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_set_restarted_together_keeps_its_cluster_and_what_it_held(
    together: StartedTogether,
) -> None:
    """Killed together and started together again, each node holds history: none starts
    a cluster anew, they join each other, and a retained message set before is there."""
    together.connect("b")[0].publish("kept/topic", b"kept", 1, retain=True)
    for name, node in together.nodes.items():
        eventually(lambda node=node, name=name: node.status()[0][name]["num_retained"] == 1)
    for client in together.clients:
        client.close()
    together.clients.clear()
    for node in together.nodes.values():
        node.kill()
    together.start()
    seen = retained_seen(together.accepted["c"][0], "kept/topic")
    assert seen is not None and seen.payload == b"kept"
    lines = [line for node in together.nodes.values() for line in node.drain_log()]
    assert not [line for line in lines if STARTS.search(line) or REFUSAL.search(line)]
