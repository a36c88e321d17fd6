"""Fixtures of the cluster tests: a real redis-server (testing/redis_server.py), TCP
proxies to cut links, and the broker-process harness of tests/test_cli.py
(`start_process`, imported so that it is a fixture here too; BrokerProcess, clean_env,
write_config are imported from there).

`redis_url` is the session's server, emptied (FLUSHALL, FUNCTION FLUSH) before the test;
a test that stops, restarts or pauses Redis takes `own_redis` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testing.redis_server import RedisServer
from tests.cluster.proxy import TcpProxy
from tests.test_cli import start_process

__all__ = ["start_process"]  # a fixture, used by name


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests share it through `redis_url`)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server.start()
    finally:
        server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, with no keys and no functions loaded."""
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which it may stop, restart, kill or pause."""
    server = RedisServer(tmp_path / "redis")
    try:
        yield server.start()
    finally:
        server.kill()


@pytest.fixture
def start_proxy() -> Iterator[Callable[[tuple[str, int]], TcpProxy]]:
    """start_proxy(target) -> a started TcpProxy, closed at the end of the test."""
    proxies: list[TcpProxy] = []

    def start(target: tuple[str, int]) -> TcpProxy:
        proxy = TcpProxy(target)
        proxies.append(proxy)
        return proxy.start()

    try:
        yield start
    finally:
        for proxy in proxies:
            with contextlib.suppress(Exception):
                proxy.close()
