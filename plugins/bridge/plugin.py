"""The bridges as one plugin: built from the `[[bridges]]` tables (broker/plugins.py hands
them over with this broker's first TCP listener, which the bridges connect to as
clients), started and stopped with the broker, and reporting VerneMQ's metrics."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from broker.config import ConfigError
from hooks import Metric
from plugins.bridge.bridge import Bridge
from plugins.bridge.client import Endpoint
from plugins.bridge.config import BridgeSettings, parse_bridges


@dataclass(slots=True)
class BridgesConfig:
    tables: list[dict[str, Any]] = field(default_factory=list)
    local_address: str = ""  # host:port of a TCP listener of this broker
    data_dir: str = "./data"  # [store] path: persistent queues go under bridges/<name>
    node_name: str = "nautilus"


class BridgePlugin:
    Config = BridgesConfig

    def __init__(self, config: BridgesConfig) -> None:
        settings = parse_bridges(config.tables)
        host, _, port = config.local_address.rpartition(":")
        if not port.isdigit() or int(port) == 0:
            raise ConfigError(
                "bridges: need a tcp listener with a fixed port (the bridges connect to this "
                f"broker through it), got {config.local_address or 'none'}"
            )
        local = Endpoint(host if host not in ("", "0.0.0.0") else "127.0.0.1", int(port))
        self.by_name = {
            s.name: Bridge(s, local, config.node_name, _queue_dir(s, config.data_dir))
            for s in settings
        }

    def start(self) -> None:
        for bridge in self.by_name.values():
            bridge.start()

    async def stop(self) -> None:
        for bridge in self.by_name.values():
            await bridge.stop()
            bridge.buffer.close()

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

    # -- side doors of `nautilus admin bridge` --------------------------------------------

    def bridges(self) -> list[dict[str, Any]]:
        return [bridge.status() for bridge in self.by_name.values()]

    async def run_bridge(self, name: str, running: bool) -> None:
        bridge = self.by_name.get(name)
        if bridge is None:
            raise LookupError(name)
        if running:
            bridge.start()
        else:
            await bridge.stop()


def _queue_dir(settings: BridgeSettings, data_dir: str) -> str:
    """Where a persistent queue lives (made if missing); "" without one."""
    if not settings.persistent_queue:
        return ""
    path = settings.queue_dir or os.path.join(data_dir, "bridges", settings.name)
    os.makedirs(path, exist_ok=True)
    return path
