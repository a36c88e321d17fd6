"""The bridges as one plugin: built from the `[[bridges]]` tables (its `table_section`
adds this broker's first TCP listener of each mountpoint, which the bridges connect to as
clients), started and stopped with the broker, reporting VerneMQ's metrics, and driven by
`nautilus admin bridge` through its `bridges` port (hooks.BridgeControl)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.config import Config as BrokerConfig
from broker.config import ConfigError
from hooks import Metric
from plugins.bridge.bridge import Bridge
from plugins.bridge.client import Endpoint
from plugins.bridge.config import BridgeSettings, parse_bridges

log = logging.getLogger("nautilus.bridge")
PLACEMENT_INTERVAL = 1.0  # seconds between looks at the cluster's members
PLACEMENT_SETTLE = 2.0  # seconds a starting node waits before running any bridge


@dataclass(slots=True)
class BridgesConfig:
    tables: list[dict[str, Any]] = field(default_factory=list)
    # host:port of a TCP listener of this broker, per mountpoint: each bridge connects
    # to this broker through its mountpoint's
    local_addresses: dict[str, str] = field(default_factory=dict)
    data_dir: str = "./data"  # [store] path: persistent queues go under bridges/<name>
    node_name: str = "nautilus"


class BridgePlugin:
    Config = BridgesConfig

    @classmethod
    def table_section(cls, config: BrokerConfig) -> dict[str, Any]:
        """The [[bridges]] tables as this plugin's section (broker/plugins.py), with the
        first tcp listener of each mountpoint: a bridge acts on its tree through it."""
        tcp: dict[str, str] = {}
        for listener in config.listeners:
            if listener.type == "tcp":
                tcp.setdefault(listener.mountpoint, listener.address)
        return {
            "tables": config.bridges,
            "local_addresses": tcp,
            "node_name": config.broker.node_name,
            "data_dir": config.store.path,
        }

    def __init__(self, config: BridgesConfig) -> None:
        settings = parse_bridges(config.tables)
        self.node = config.node_name
        self.alive: Callable[[], list[str] | None] = lambda: None  # placement() sets it
        self.held: set[str] = set()  # stopped at run time: not started again by placement
        self._placing: asyncio.Task[None] | None = None
        self.by_name = {
            s.name: Bridge(
                s,
                _local_endpoint(s, i, config.local_addresses),
                config.node_name,
                _queue_dir(s, config.data_dir),
            )
            for i, s in enumerate(settings)
        }
        self.bridges = Control(self.by_name, self.held)  # `nautilus admin bridge`

    def placement(self, node: str, alive: Callable[[], list[str] | None]) -> None:
        self.node, self.alive = node, alive

    def start(self) -> None:
        if self.alive() is None:  # not in a cluster: every bridge here
            for bridge in self.by_name.values():
                bridge.start()
            return
        self._placing = asyncio.get_running_loop().create_task(self._place_forever())

    async def stop(self) -> None:
        if self._placing is not None:
            self._placing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._placing
        for bridge in self.by_name.values():
            await bridge.stop()
            bridge.buffer.close()

    async def _place_forever(self) -> None:
        """In a cluster each bridge runs on one node at a time: the alive member its name
        hashes to. Every node works it out from the same sorted list, each second; a
        bridge moves when its node leaves or dies (and back when it returns). A node that
        just started waits PLACEMENT_SETTLE first, to hear from the others."""
        await asyncio.sleep(PLACEMENT_SETTLE)
        while True:
            alive = self.alive() or [self.node]
            for name, bridge in self.by_name.items():
                owner = alive[zlib.crc32(name.encode()) % len(alive)]
                running = bridge.state != "stopped"
                if owner == self.node and not running and name not in self.held:
                    log.info("bridge %s runs on this node (%s)", name, self.node)
                    bridge.start()
                elif owner != self.node and running:
                    log.info("bridge %s moves to node %s", name, owner)
                    await bridge.stop()
            await asyncio.sleep(PLACEMENT_INTERVAL)

    def metrics(self) -> list[Metric]:
        figures = []
        for name, bridge in self.by_name.items():
            label = (("name", name),)
            for direction in ("out", "in"):
                for qos in (0, 1, 2):
                    key = f"publish_{direction}_{qos}"
                    figures.append(
                        Metric(
                            f"vmq_bridge_{key}",
                            bridge.counts[key],
                            labels=label,
                            help=f"QoS {qos} messages bridged {direction}",
                        )
                    )
            figures += [
                Metric(
                    "vmq_bridge_queue_size",
                    len(bridge.buffer),
                    "gauge",
                    label,
                    "messages waiting to go out",
                ),
                Metric(
                    "vmq_bridge_queue_max",
                    bridge.settings.max_outgoing_buffered_messages,
                    "gauge",
                    label,
                    "the most that may wait",
                ),
                Metric(
                    "vmq_bridge_dropped",
                    bridge.counts["dropped"],
                    labels=label,
                    help="messages dropped, the buffer full",
                ),
                Metric(
                    "vmq_bridge_connected",
                    bridge.state == "connected",
                    "gauge",
                    label,
                    "1 while connected to the remote",
                ),
            ]
        return figures


class Control:
    """The bridges as `nautilus admin bridge show|start|stop` drives them: the plugin's
    `bridges` side door (hooks.BridgeControl)."""

    def __init__(self, by_name: dict[str, Bridge], held: set[str]) -> None:
        self.by_name = by_name
        self.held = held  # the plugin's: stopped by an operator, left so by placement

    def rows(self) -> list[dict[str, Any]]:
        return [bridge.status() for bridge in self.by_name.values()]

    async def run(self, name: str, running: bool) -> None:
        bridge = self.by_name.get(name)
        if bridge is None:
            raise LookupError(name)
        if running:
            self.held.discard(name)
            bridge.start()
        else:
            self.held.add(name)
            await bridge.stop()


def _local_endpoint(settings: BridgeSettings, index: int, addresses: dict[str, str]) -> Endpoint:
    """Where the bridge connects to this broker: the tcp listener of its mountpoint."""
    address = addresses.get(settings.mountpoint, "")
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        tree = f'mountpoint "{settings.mountpoint}"' if settings.mountpoint else "no mountpoint"
        raise ConfigError(
            f"bridges[{index}]: needs a tcp listener with {tree} and a fixed port (the "
            f"bridge connects to this broker through it), got {address or 'none'}"
        )
    return Endpoint(host if host not in ("", "0.0.0.0") else "127.0.0.1", int(port))


def _queue_dir(settings: BridgeSettings, data_dir: str) -> str:
    """Where a persistent queue lives (made if missing); "" without one."""
    if not settings.persistent_queue:
        return ""
    path = settings.queue_dir or os.path.join(data_dir, "bridges", settings.name)
    os.makedirs(path, exist_ok=True)
    return path
