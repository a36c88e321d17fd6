"""A real `redis-server`, and a Redis Sentinel watching one, on 127.0.0.1.

No config file and no persistence for the server (`--save ""`, `--appendonly no`): a
restart starts empty. Each logs to its directory (`redis.log`, `sentinel.log`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from testing.lifecycle import HOST, Missing, ServerProcess


def _redis_server() -> str:
    executable = shutil.which("redis-server")
    if executable is None:
        raise Missing("redis-server is not installed (apt-get install redis-server)")
    return executable


def _probe(port: int) -> redis.Redis:
    """A client that gives up at once: start() asks again itself."""
    return redis.Redis(
        HOST, port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )


class RedisServer(ServerProcess):
    """One `redis-server`; the data is gone after a restart (nothing persisted)."""

    NAME = "redis"

    def _find_binaries(self) -> None:
        self.executable = _redis_server()

    def _command(self, port: int) -> list[str]:
        return [
            *(self.executable, "--port", str(port), "--bind", HOST),
            *("--save", "", "--appendonly", "no"),  # nothing persisted
            *("--dir", str(self.directory), "--protected-mode", "no"),
        ]

    def _answers(self, port: int) -> bool:
        # Another server on this port would answer too: check it is ours.
        assert self.proc is not None
        with _probe(port) as client:
            try:
                return int(client.info("server")["process_id"]) == self.proc.pid
            except redis.RedisError:
                return False

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous client; kwargs go to redis.Redis (e.g. socket_timeout)."""
        return redis.Redis(HOST, self.port, **kwargs)

    def flush(self) -> None:
        """FLUSHALL and FUNCTION FLUSH: no keys, no loaded functions."""
        with self.client(socket_timeout=5) as client:
            client.flushall()
            client.function_flush()


class SentinelServer(ServerProcess):
    """A Redis Sentinel (`redis-server --sentinel`) monitoring the Redis on
    `master_port` as `master`; it answers once it knows the master."""

    NAME = "sentinel"

    def __init__(self, directory: Path, master_port: int, master: str = "mymaster") -> None:
        super().__init__(directory)
        self.master_port = master_port
        self.master = master

    def _find_binaries(self) -> None:
        self.executable = _redis_server()

    def _command(self, port: int) -> list[str]:
        config = self.directory / "sentinel.conf"  # a sentinel rewrites its config file
        config.write_text(
            f"port {port}\nbind {HOST}\n"
            f"sentinel monitor {self.master} {HOST} {self.master_port} 1\n",
            encoding="utf-8",
        )
        return [self.executable, str(config), "--sentinel"]

    def _answers(self, port: int) -> bool:
        with _probe(port) as client:
            try:
                return bool(client.sentinel_get_master_addr_by_name(self.master))
            except redis.RedisError:
                return False
