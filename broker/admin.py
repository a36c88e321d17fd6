"""What an operator can ask of a running broker, whatever carries the request (the HTTP
admin API, `nautilus admin`): sessions, one client's subscriptions and queue, disconnects,
retained messages, metrics and plugins. Plain functions over the broker (as `Managed`) returning
plain data (JSON-ready), so the API stays a thin translation and the operations are testable.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import time
from typing import TYPE_CHECKING, Any, Protocol

from broker.message import Message
from broker.protocol import ReasonCode
from broker.topics import valid_topic_filter
from hooks.side_doors import side_doors

if TYPE_CHECKING:
    from broker.config import BrokerSettings, Config
    from broker.connection import Connection
    from broker.metrics import Metrics
    from broker.peers import Peers
    from broker.registry import Registry
    from broker.retain import RetainedMessages
    from broker.session import Session
    from broker.store import MessageStore
    from broker.trace.tracer import Tracer


class Managed(Protocol):
    """What the admin operations and the HTTP side (broker/http/) read and change of the
    broker: the Broker provides it, and they never import broker/server.py."""

    config: Config
    settings: BrokerSettings
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    registry: Registry
    retained: RetainedMessages
    store: MessageStore
    peers: Peers
    connections: set[Connection]
    tracer: Tracer
    plugins: list[tuple[str, Any]]  # (name, plugin), in the order they are called
    disabled_plugins: set[str]
    started_at: float  # time.time()
    stopping: bool
    listening: list[tuple[str, int]]  # each listener's address; ("", 0): not started
    listeners_down: dict[int, str]  # listener index -> why it is not started

    def gauges(self) -> dict[str, int]: ...

    def plugin_hooks(self) -> dict[str, list[str]]: ...

    def set_plugin_enabled(self, name: str, enabled: bool) -> None: ...


class NotFound(LookupError):
    """No such client, topic or plugin."""


def _connections_by_client(broker: Managed) -> dict[str, Connection]:
    return {c.client.client_id: c for c in broker.connections if c.session is not None}


def sessions(broker: Managed, client_id: str = "", online: bool | None = None) -> list[dict]:
    """Every session (online and offline), optionally those whose client id contains
    `client_id`, or only the online / offline ones; VerneMQ's `session show` columns."""
    connected = _connections_by_client(broker)
    rows = []
    for cid, session in sorted(broker.registry.items()):
        if client_id and client_id not in cid:
            continue
        if online is not None and session.online != online:
            continue
        rows.append(_session_row(session, connected.get(cid)))
    return rows


def _session_row(session: Session, connection: Connection | None) -> dict[str, Any]:
    client = connection.client if connection is not None else None
    return {
        "client_id": session.client_id,
        "is_online": session.online,
        "peer_host": client.peer[0] if client else None,
        "peer_port": client.peer[1] if client else None,
        "user": client.username if client else None,
        "mountpoint": "",
        "protocol": client.protocol_level if client else None,
        "clean_session": session.expiry == 0,
        "session_expiry": session.expiry,
        "queue_size": len(session.queue) + session.on_disk,
        "waiting_acks": len(session.inflight),
        "num_subscriptions": len(session.subscriptions),
    }


def client(broker: Managed, client_id: str) -> dict[str, Any]:
    """One client: its session row, subscriptions (filter and options) and queue."""
    session = broker.registry.get(client_id)
    if session is None:
        raise NotFound(f"no session for client id {client_id!r}")
    row = _session_row(session, _connections_by_client(broker).get(client_id))
    row["subscriptions"] = [
        {
            "topic": topic_filter,
            "qos": options.qos,
            "no_local": options.no_local,
            "retain_as_published": options.retain_as_published,
            "retain_handling": options.retain_handling,
        }
        for topic_filter, options in sorted(session.subscriptions.items())
    ]
    row["queue"] = {
        "online_messages": len(session.queue),
        "offline_messages_on_disk": session.on_disk,
        "in_flight": len(session.inflight),
    }
    return row


def disconnect(broker: Managed, client_id: str, cleanup: bool = False) -> dict[str, bool]:
    """Close the client's connection (MQTT 5 clients get DISCONNECT 0x98, administrative
    action); with `cleanup`, its session is deleted too (subscriptions and queue)."""
    # Every connection of the client id (several with allow_multiple_sessions).
    connections = [
        c for c in broker.connections if c.session is not None and c.client.client_id == client_id
    ]
    had_session = client_id in broker.registry
    if not connections and not (cleanup and had_session):
        raise NotFound(f"client id {client_id!r} is not connected")
    for connection in connections:
        connection.close(ReasonCode.ADMINISTRATIVE_ACTION)
    session = broker.registry.get(client_id)  # closing may have ended it
    if cleanup and session is not None:
        broker.registry.end(session)
    return {"disconnected": bool(connections), "deleted": cleanup and had_session}


def retained(broker: Managed, topic_filter: str = "#", limit: int = 1000) -> list[dict]:
    """Retained messages whose topic matches `topic_filter`, at most `limit`, by topic
    (as for a subscription, "#" leaves out `$` topics: ask for `$SYS/#` to see those)."""
    if not valid_topic_filter(topic_filter):
        raise ValueError(f"topic: {topic_filter!r} is not a topic filter")
    found = broker.retained.matching(topic_filter, broker.loop.time())
    return [_message_row(m) for m in sorted(found, key=lambda m: m.topic)[:limit]]


def _message_row(message: Message) -> dict[str, Any]:
    try:
        payload: str = message.payload.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    return {
        "topic": message.topic,
        "qos": message.qos,
        "payload": payload,
        "payload_encoding": encoding,
        "payload_size": len(message.payload),
    }


def delete_retained(broker: Managed, topic: str) -> dict[str, str]:
    """Clear the retained message of `topic` (a topic name, no wildcards)."""
    if "+" in topic or "#" in topic:
        raise ValueError("topic: a topic name, without wildcards")
    if not broker.retained.matching(topic, broker.loop.time()):
        raise NotFound(f"no retained message on {topic!r}")
    broker.retained.update(Message(topic, b"", 0, retain=True))
    broker.store.delete_retained(topic)
    return {"deleted": topic}


def delete_expired_retained(broker: Managed) -> dict[str, int]:
    """Sweep the retained messages whose MQTT 5 expiry has passed (they go when matched
    anyway; this frees them now)."""
    return {"deleted": broker.retained.delete_expired(broker.loop.time())}


def metrics(broker: Managed) -> dict[str, int]:
    values = broker.metrics.snapshot()
    values.update(broker.gauges())
    values["uptime_seconds"] = int(time.time() - broker.started_at)
    return values


def reset_metrics(broker: Managed) -> dict[str, int]:
    """Counters back to 0 (gauges read the broker's state and stay what they are)."""
    broker.metrics.reset()
    return metrics(broker)


def cluster_nodes(broker: Managed) -> list[dict[str, Any]]:
    """Every node this one knows: alive, its link, what went over it (vmq-admin cluster
    show, with the link figures)."""
    return cluster_status(broker)["nodes"]


def cluster_join(broker: Managed, address: str) -> dict[str, Any]:
    return {"result": broker.peers.join(address)}


async def cluster_leave(broker: Managed, node: str) -> dict[str, Any]:
    """`node` (empty: this node) leaves the cluster."""
    return {"result": await broker.peers.leave(node)}


def cluster_status(broker: Managed) -> dict[str, Any]:
    """The metadata's state, the nodes, and the routing score."""
    status = broker.peers.status()
    if status is None:
        raise NotFound("this node is not in a cluster ([cluster] address is empty)")
    return status


def plugins(broker: Managed) -> list[dict[str, Any]]:
    return [
        {"name": name, "enabled": name not in broker.disabled_plugins, "hooks": hooks}
        for name, hooks in broker.plugin_hooks().items()
    ]


def set_plugin_enabled(broker: Managed, name: str, enabled: bool) -> list[dict[str, Any]]:
    if name not in dict(broker.plugins):
        raise NotFound(f"no plugin {name!r} (loaded: {', '.join(dict(broker.plugins))})")
    broker.set_plugin_enabled(name, enabled)
    return plugins(broker)


async def invalidate_auth(
    broker: Managed, client_id: str | None, username: str | None
) -> list[dict[str, Any]]:
    """Each enabled plugin that keeps auth decisions re-reads them for these connected
    clients (both None: all of them, on this node): a row per plugin, with how many."""
    done = []
    for name, plugin in broker.plugins:
        door = side_doors(plugin).invalidate
        if door is None or name in broker.disabled_plugins:
            continue
        try:
            count = door(client_id, username)
            if inspect.isawaitable(count):
                count = await count
        except Exception as exc:  # the plugin could not (its database is down): said
            done.append({"plugin": name, "clients": 0, "error": str(exc) or type(exc).__name__})
            continue
        done.append({"plugin": name, "clients": count})
    if not done:
        raise NotFound("no enabled plugin keeps auth decisions to invalidate (auth_db does)")
    return done


def bridges(broker: Managed) -> list[dict[str, Any]]:
    """Every bridge, a row each (`[[bridges]]`: docs/bridge.md)."""
    rows: list[dict[str, Any]] = []
    for _, plugin in broker.plugins:
        door = side_doors(plugin).bridges
        if door is not None:
            rows += door()
    return rows


async def run_bridge(broker: Managed, name: str, running: bool) -> list[dict[str, Any]]:
    """Start or stop the bridge `name`; the bridges after."""
    for _, plugin in broker.plugins:
        doors = side_doors(plugin)
        if doors.run_bridge is None or doors.bridges is None:
            continue
        if any(row["name"] == name for row in doors.bridges()):
            done = doors.run_bridge(name, running)
            if inspect.isawaitable(done):
                await done
            return bridges(broker)
    known = ", ".join(row["name"] for row in bridges(broker)) or "none"
    raise NotFound(f"no bridge {name!r} (configured: {known})")


def stop_traces(broker: Managed) -> dict[str, int]:
    """`trace stop-all`: every trace ends, on this node and the others (how many here)."""
    return {"stopped": broker.tracer.stop_all()}
