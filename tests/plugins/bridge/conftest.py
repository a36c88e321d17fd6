"""Fixtures of the bridge tests: a real Mosquitto as the remote (`mosquitto`, or
`start_mosquitto(users=...)`; testing/mosquitto.py), and a Nautilus with bridges on a
listener of a fixed port (the bridge connects to it as a client)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.lifecycle import free_port
from testing.mosquitto import Mosquitto
from tests.cluster.conftest import redis_server, redis_url

__all__ = ["redis_server", "redis_url"]  # fixtures, used by name (the cluster test)


@pytest.fixture
def start_mosquitto(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    started: list[Mosquitto] = []

    def start(
        users: dict[str, str] | None = None, tls: tuple[Path, Path] | None = None
    ) -> Mosquitto:
        server = Mosquitto(tmp_path / f"mosquitto{len(started)}", users, tls)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.close()


@pytest.fixture
def mosquitto(start_mosquitto) -> Mosquitto:
    return start_mosquitto()


@pytest.fixture
def bridged(start_broker) -> Callable[..., Any]:
    """bridged(remote_port, topics, **bridge settings) -> a Nautilus with one bridge."""

    def start(remote_port: int, topics: list[dict[str, Any]], **settings: Any) -> Any:
        bridge = {
            "name": "b1",
            "address": f"127.0.0.1:{remote_port}",
            "restart_timeout": 1,
            **settings,
            "topics": topics,
        }
        listener = {"type": "tcp", "address": f"127.0.0.1:{free_port()}"}
        return start_broker(listeners=[listener], bridges=[bridge])

    return start
