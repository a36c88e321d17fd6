"""/health's verdict, /status.json's figures (VerneMQ's field names, one entry per node)
and /status, the page that shows them live (status.html: it polls /status.json and
computes rates)."""

from __future__ import annotations

import time
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from broker import __version__
from broker.plugins import Unavailable

if TYPE_CHECKING:
    from broker.admin import FigureSource, PluginSwitchboard
    from broker.config import BrokerSettings, Config
    from broker.peers import ClusterOverview
    from broker.store import MessageStore


class Readiness(Protocol):
    """What says whether the node should get traffic (/health) and how its listeners and
    the cluster are (/status.json)."""

    settings: BrokerSettings  # node_name
    config: Config  # listeners
    listening: list[tuple[str, int]]  # each listener's address; ("", 0): not started
    listeners_down: dict[int, str]  # listener index -> why it is not started
    plugins: list[tuple[str, Any]]  # an Unavailable one: a library missing
    store: MessageStore  # failed: it cannot write
    stopping: bool

    @property
    def peers(self) -> ClusterOverview:
        """The cluster's view: problem(), status()."""
        ...


def problems(node: Readiness) -> list[str]:
    """Why the broker should not get traffic now (empty: ready)."""
    found = []
    if len(node.listening) < len(node.config.listeners):
        found.append("listeners are not all open")
    # What a missing library left out (broker/optional.py): each its start-up ERROR line.
    found += node.listeners_down.values()
    found += [plugin.problem for _, plugin in node.plugins if isinstance(plugin, Unavailable)]
    if node.store.failed:
        found.append("the store cannot write (QoS 1/2 publishes are refused)")
    if node.stopping:
        found.append("shutting down")
    peers = node.peers.problem()  # the cluster's metadata away, say
    if peers is not None:
        found.append(peers)
    return found


def nodes(
    node: Readiness, figures: FigureSource, switchboard: PluginSwitchboard
) -> list[dict[str, Any]]:
    """[{node name: figures}], as VerneMQ's /status.json (one node until clustering)."""
    counters = figures.metrics.snapshot()
    state = figures.gauges()
    listening, down = node.listening, node.listeners_down
    values = {
        "num_online": state["queue_processes"] - state["sessions_offline"],
        "num_offline": state["sessions_offline"],
        "connections": state["total_active_connections"],
        "msg_in": counters["mqtt_publish_received"],
        "msg_out": counters["mqtt_publish_sent"],
        "bytes_in": counters["bytes_received"],
        "bytes_out": counters["bytes_sent"],
        "queue_in": counters["queue_message_in"],
        "queue_out": counters["queue_message_out"],
        "queue_drop": counters["queue_message_drop"],
        "queue_unhandled": counters["queue_message_unhandled"],
        "num_subscriptions": state["router_subscriptions"],
        "num_retained": state["retain_messages"],
        "version": __version__,
        "uptime_seconds": int(time.time() - figures.started_at),
        "ready": not problems(node),
        "mystatus": [_readiness(node)],
        "listeners": [
            {
                "type": listener.type,
                "status": "running" if index < len(listening) and index not in down else "stopped",
                "ip": listening[index][0] if index < len(listening) else "",
                "port": listening[index][1] if index < len(listening) else 0,
                "mountpoint": listener.mountpoint,
                "max_conns": listener.max_connections,
            }
            for index, listener in enumerate(node.config.listeners)
        ],
        "plugins": [
            {"name": name, "enabled": name not in switchboard.disabled_plugins}
            for name, _ in switchboard.plugins
        ],
    }
    return [{node.settings.node_name: values}]


def _readiness(node: Readiness) -> dict[str, bool]:
    """This node's view of every node: VerneMQ's `mystatus`."""
    status = node.peers.status()
    if status is None:
        return {node.settings.node_name: True}
    return {row["node"]: row["alive"] for row in status["nodes"]}


# The page: static HTML whose script polls status.json every 2 s and computes rates.
PAGE = (resources.files("broker.http") / "status.html").read_text(encoding="utf-8")
