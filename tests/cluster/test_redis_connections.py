"""Two node processes whose connections to Redis die under them while Redis stays up:
killed by Redis (`CLIENT KILL TYPE normal` from an admin connection) or reset on the way
(tests/cluster/proxy.py between the nodes and Redis). The next CONNECT is accepted, its
subscription routed from the other node, and neither node logs a failed Redis call.

A hostile probe saw a CONNECT refused ("cannot register in the cluster: ...: Error
UNKNOWN while writing to socket. Connection lost.") long after Redis was back: a pooled
connection found dead only when the registration used it. Every Redis call is now sent
again once on a dead connection (plugins/redis_subs/store.py, RETRY); test_redis_store.py
checks each kind of call on its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from testing.redis_server import RedisServer
from tests.broker.helpers import PahoClient, unique_id
from tests.cluster.nodes import ClusterNode
from tests.cluster.proxy import TcpProxy

HOST = "127.0.0.1"
TIMEOUT = 10.0
# What a node logs when a Redis call failed or a CONNECT was refused.
FAILURES = ("cannot register", "connection refused", "metadata unavailable", "connects refused")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[[str], tuple[ClusterNode, ClusterNode]]]:
    started: list[ClusterNode] = []

    def start(redis_url: str) -> tuple[ClusterNode, ClusterNode]:
        for name in ("a", "b"):
            started.append(ClusterNode(tmp_path / name, name, redis_url).start())
        a, b = started
        a.wait_for_log(r"cluster link to b \(\S+\) up")
        b.wait_for_log(r"cluster link to a \(\S+\) up")
        return a, b

    try:
        yield start
    finally:
        for node in started:
            node.kill()


def routed(subscriber: PahoClient, publisher: PahoClient, topic: str) -> None:
    """Publish to `topic` until the subscriber (on another node) gets it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        payload = unique_id("probe").encode()
        publisher.publish(topic, payload, qos=1)
        with contextlib.suppress(AssertionError):
            while True:
                if subscriber.expect_message(timeout=0.2).payload == payload:
                    return
        assert time.monotonic() < deadline, f"{topic} not routed within {TIMEOUT} s"


def connected(node: ClusterNode) -> PahoClient:
    client = PahoClient(HOST, node.port)
    client.connect()  # CONNACK 0: registered in Redis first
    return client


@pytest.mark.parametrize("how", ["client kill", "reset"])
def test_connect_accepted_and_routed_after_the_redis_connections_die(
    redis_server: RedisServer,
    redis_url: str,
    start_proxy: Callable[[tuple[str, int]], TcpProxy],
    nodes: Callable[[str], tuple[ClusterNode, ClusterNode]],
    how: str,
) -> None:
    proxy = start_proxy((HOST, redis_server.port))
    a, b = nodes(redis_url if how == "client kill" else f"redis://{HOST}:{proxy.port}/0")
    clients: list[PahoClient] = []
    try:
        old_sub, publisher_b = connected(a), connected(b)
        clients += (old_sub, publisher_b)
        assert old_sub.subscribe("before/#", 1) == [1]
        routed(old_sub, publisher_b, "before/x")

        for _ in range(3):  # each time every connection of both nodes dies
            if how == "client kill":
                with redis.Redis.from_url(redis_url) as admin:
                    assert admin.client_kill_filter(_type="normal", skipme=True) >= 4
            else:
                proxy.reset()
                proxy.pass_through()
            sub = connected(b)  # the first Redis call after it: the registration
            publisher_a = connected(a)
            clients += (sub, publisher_a)
            topic = unique_id("after")
            assert sub.subscribe(topic, 1) == [1]
            routed(sub, publisher_a, topic)  # b wrote the subscription, a follows again
            routed(old_sub, publisher_b, "before/y")  # and what was there still routes
    finally:
        for client in clients:
            client.close()
    for node in (a, b):
        node.stop()
        assert node.process is not None
        failures = [line for line in node.process.drain() if any(f in line for f in FAILURES)]
        assert failures == [], f"node {node.name}"
