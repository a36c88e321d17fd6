"""A port start-up cannot have stops the broker with one line naming the key to change,
before anything is served or said to listen, and what it took is released.

Each kind of listener's port is taken by a plain socket (or by another of the broker's
own listeners), and the real `nautilus` command is started on it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.binding import BindError
from broker.config import config_from_dict
from broker.server import Broker
from broker.store import open_store
from tests.test_cli import clean_env, nautilus

MQTT = '[[listeners]]\ntype = "tcp"\naddress = "{address}"\n\n'
BASE = '[broker]\nallow_anonymous = true\n\n[store]\nbackend = "memory"\n\n'


@pytest.fixture
def taken() -> Iterator[str]:
    """A 127.0.0.1 address a plain socket listens on (another program's port)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


def refused_start(tmp_path: Path, config: str, **env: str) -> str:
    """Run the broker on `config`; it must exit with status 1, having said nothing of
    listening and printed no traceback. Its one error line."""
    path = tmp_path / "nautilus.toml"
    path.write_text(BASE + config, encoding="utf-8")
    result = nautilus("--config", str(path), cwd=tmp_path, env=clean_env(**env))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert not [line for line in lines if "listening" in line or "HTTP on" in line], lines
    assert "Traceback" not in result.stderr
    errors = [line for line in lines if line.startswith("nautilus: ")]
    assert errors == lines[-1:], lines  # the last line, and the only one of its kind
    return errors[0]


def test_a_taken_mqtt_port_names_its_listener(tmp_path, taken):
    config = MQTT.format(address="127.0.0.1:0") + MQTT.format(address=taken)
    assert refused_start(tmp_path, config) == (
        f"nautilus: listeners[1].address {taken}: address already in use "
        "(set [[listeners]] address)"
    )


def test_a_taken_http_port_names_http_address(tmp_path, taken):
    config = MQTT.format(address="127.0.0.1:0")
    assert refused_start(tmp_path, config, NAUTILUS_HTTP__ADDRESS=taken) == (
        f"nautilus: http.address {taken}: address already in use "
        "(set [http] address, or enabled = false)"
    )


def test_a_taken_relay_port_names_event_relay_address(tmp_path, taken):
    config = MQTT.format(address="127.0.0.1:0")
    config += f'[event_relay]\nenabled = true\naddress = "{taken}"\n'
    assert refused_start(tmp_path, config) == (
        f"nautilus: event_relay.address {taken}: address already in use "
        "(set [event_relay] address, or enabled = false)"
    )


def test_a_taken_cluster_port_names_cluster_address(tmp_path, taken):
    config = MQTT.format(address="127.0.0.1:0")
    config += f'[cluster]\naddress = "{taken}"\n\n[cluster.swc]\ndirectory = "{tmp_path}/swc"\n'
    assert refused_start(tmp_path, config) == (
        f"nautilus: cluster.address {taken}: address already in use (set [cluster] address)"
    )


def test_two_of_the_brokers_own_listeners_on_one_port(tmp_path):
    """HTTP given the MQTT listener's port: the second to bind is named."""
    free = _free_address()
    config = MQTT.format(address=free)
    assert refused_start(tmp_path, config, NAUTILUS_HTTP__ADDRESS=free) == (
        f"nautilus: http.address {free}: address already in use "
        "(set [http] address, or enabled = false)"
    )


def test_a_host_that_does_not_resolve_is_named_too(tmp_path):
    config = MQTT.format(address="no-such-host.invalid:1883")
    error = refused_start(tmp_path, config)
    assert error.startswith("nautilus: listeners[0].address no-such-host.invalid:1883: ")
    assert error.endswith(" (set [[listeners]] address)")


def test_a_failed_start_releases_its_ports_store_and_tasks(tmp_path, taken, caplog):
    """In process: the relay's port is taken (the last address bound), so the MQTT and
    HTTP ports, the LevelDB store and the plugins were taken by then."""
    config = config_from_dict(
        {
            "listeners": [{"type": "tcp", "address": "127.0.0.1:0"}],
            "http": {"address": "127.0.0.1:0"},
            "store": {"backend": "leveldb", "path": str(tmp_path / "store")},
            "event_relay": {"enabled": True, "address": taken},
        }
    )

    async def start_and_fail() -> list[tuple[str, int]]:
        broker = Broker(config)
        with pytest.raises(BindError, match=r"^event_relay\.address "):
            await broker.start()
        assert broker.http is not None and broker.http.address is not None
        claimed = [broker.listening[0], broker.http.address]
        assert asyncio.all_tasks() == {asyncio.current_task()}
        open_store(config.store, asyncio.get_running_loop()).close()  # its lock is free
        return claimed

    with caplog.at_level(logging.INFO):
        claimed = asyncio.run(start_and_fail())
    for host, port in claimed:
        assert port
        with socket.socket() as again:
            again.bind((host, port))  # free: no SO_REUSEADDR needed, nothing listens there
    assert not [r for r in caplog.records if "listening" in r.getMessage()]


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"
