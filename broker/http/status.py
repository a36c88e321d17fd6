"""/health's verdict, /status.json's figures (VerneMQ's field names, one entry per node)
and /status, the page that shows them live (status.html: it polls /status.json and
computes rates)."""

from __future__ import annotations

import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from broker import __version__
from broker.plugins import Unavailable

if TYPE_CHECKING:
    from broker.admin import Managed


def problems(broker: Managed) -> list[str]:
    """Why the broker should not get traffic now (empty: ready)."""
    found = []
    if len(broker.listening) < len(broker.config.listeners):
        found.append("listeners are not all open")
    # What a missing library left out (broker/optional.py): each its start-up ERROR line.
    found += broker.listeners_down.values()
    found += [plugin.problem for _, plugin in broker.plugins if isinstance(plugin, Unavailable)]
    if broker.store.failed:
        found.append("the store cannot write (QoS 1/2 publishes are refused)")
    if broker.stopping:
        found.append("shutting down")
    peers = broker.peers.problem()  # the cluster's metadata away, say
    if peers is not None:
        found.append(peers)
    return found


def nodes(broker: Managed) -> list[dict[str, Any]]:
    """[{node name: figures}], as VerneMQ's /status.json (one node until clustering)."""
    counters = broker.metrics.snapshot()
    state = broker.gauges()
    node = broker.settings.node_name
    figures = {
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
        "uptime_seconds": int(time.time() - broker.started_at),
        "ready": not problems(broker),
        "mystatus": [_readiness(broker)],
        "listeners": [
            {
                "type": listener.type,
                "status": "running"
                if index < len(broker.listening) and index not in broker.listeners_down
                else "stopped",
                "ip": broker.listening[index][0] if index < len(broker.listening) else "",
                "port": broker.listening[index][1] if index < len(broker.listening) else 0,
                "mountpoint": listener.mountpoint,
                "max_conns": listener.max_connections,
            }
            for index, listener in enumerate(broker.config.listeners)
        ],
        "plugins": [
            {"name": name, "enabled": name not in broker.disabled_plugins}
            for name, _ in broker.plugins
        ],
    }
    return [{node: figures}]


def _readiness(broker: Managed) -> dict[str, bool]:
    """This node's view of every node: VerneMQ's `mystatus`."""
    node = broker.settings.node_name
    status = broker.peers.status()
    if status is None:
        return {node: True}
    return {row["node"]: row["alive"] for row in status["nodes"]}


# The page: static HTML whose script polls status.json every 2 s and computes rates.
PAGE = (resources.files("broker.http") / "status.html").read_text(encoding="utf-8")
