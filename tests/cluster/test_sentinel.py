"""The Redis store through Redis Sentinel: nodes given only the sentinels find the master
there, and a cluster works through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.redis_server import RedisServer, SentinelServer
from tests.broker.helpers import PahoClient
from tests.cluster.nodes import ClusterNode


@pytest.fixture
def sentinel(own_redis: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A real sentinel's port, monitoring own_redis as "mymaster"."""
    server = SentinelServer(tmp_path / "sentinel", own_redis.port, "mymaster")
    try:
        yield server.start().port
    finally:
        server.kill()


def test_nodes_reach_redis_through_sentinel(tmp_path, sentinel):
    keys = f'sentinel_endpoints = ["127.0.0.1:{sentinel}"]\nsentinel_master = "mymaster"'
    a = ClusterNode(tmp_path / "a", "a", "", redis_keys=keys)
    b = ClusterNode(tmp_path / "b", "b", "", redis_keys=keys)
    try:
        a.start()
        b.start()
        b.wait_for_log(r"cluster link to a \(.*\) up")
        sub = PahoClient("127.0.0.1", b.port)
        sub.connect()
        sub.subscribe("sentinel/#", 1)
        pub = PahoClient("127.0.0.1", a.port)
        pub.connect()
        # Until a routes to b (the subscription reached it through Redis).
        for attempt in range(200):
            pub.publish("sentinel/t", b"%d" % attempt, qos=1)
            try:
                received = sub.expect_message(timeout=0.05)
                break
            except AssertionError:
                continue
        else:
            pytest.fail("the subscription on b never became routable from a")
        assert received.topic == "sentinel/t"
        assert a.cluster_status()["metadata"] == "available"
    finally:
        a.kill()
        b.kill()
