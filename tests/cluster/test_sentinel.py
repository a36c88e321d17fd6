"""The Redis store through Redis Sentinel: nodes given only the sentinels find the master
there, and a cluster works through it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.helpers import PahoClient
from tests.cluster.nodes import ClusterNode
from tests.cluster.redis_server import RedisServer, free_port, redis_server_path

ATTEMPTS = 3  # a free port can be taken between free_port() and the sentinel's bind


@pytest.fixture
def sentinel(own_redis: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A real sentinel (redis-server --sentinel) monitoring own_redis as "mymaster"."""
    executable = redis_server_path()
    assert executable is not None  # own_redis skipped the test otherwise
    for attempt in range(1, ATTEMPTS + 1):
        port = free_port()
        config = tmp_path / f"sentinel-{attempt}.conf"
        log = tmp_path / f"sentinel-{attempt}.log"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\nlogfile {log}\n"
            f"sentinel monitor mymaster 127.0.0.1 {own_redis.port} 1\n",
            encoding="utf-8",
        )
        proc = subprocess.Popen(
            [executable, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        try:
            if _answers(proc, port):
                yield port
                return
            said = log.read_text(encoding="utf-8")[-2000:] if log.exists() else "(no log)"
            if proc.poll() is None or "Address already in use" not in said:
                pytest.fail(f"the sentinel did not come up on port {port}; its log:\n{said}")
        finally:
            proc.kill()
            proc.wait()
    pytest.fail(f"the sentinel found no free port in {ATTEMPTS} attempts")


def _answers(proc: subprocess.Popen, port: int) -> bool:
    """Whether the sentinel answers and knows the master within 10 s (False: it exited, or
    the time is up). Polled: there is no event to await."""
    import redis

    client = redis.Redis("127.0.0.1", port, socket_timeout=1)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if client.sentinel_get_master_addr_by_name("mymaster"):
                return True
        except redis.RedisError:
            pass
        time.sleep(0.02)
    return False


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
