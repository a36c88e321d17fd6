"""What an operator can ask of a running broker, whatever carries the request (the HTTP
admin API, `nautilus admin`): sessions, one client's subscriptions and queue, disconnects,
retained messages, metrics, plugins, run-time settings and listeners. Plain functions over
the broker (as `Managed`) returning plain data (JSON-ready), so the API stays a thin
translation and the operations are testable.

Session queries, disconnects and unsubscribes by query, and settings run on every node of
a cluster (`everywhere`): this node runs its part (`HERE`), the others theirs, asked in an
ADMIN frame (broker/peers.py's `ask_others`), and the rows come back tagged with `node`;
a node that does not answer is an error beside the rows, not a hung command.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker import deciders, runtime_settings, session_query
from broker.message import Message
from broker.mountpoints import inside, outside, subscriber_id
from broker.mountpoints import problem as mountpoint_problem
from broker.protocol import ReasonCode
from broker.session_query import Query
from broker.topics import valid_topic_filter
from hooks.side_doors import side_doors

log = logging.getLogger("nautilus.admin")

if TYPE_CHECKING:
    from broker.config import BrokerSettings, Config
    from broker.connection import Connection
    from broker.metrics import Metrics
    from broker.peers import ClusterOperations
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
    connections: set[Connection]
    tracer: Tracer
    plugins: list[tuple[str, Any]]  # (name, plugin), in the order they are called
    disabled_plugins: set[str]
    started_at: float  # time.time()
    stopping: bool
    listening: list[tuple[str, int]]  # each listener's address; ("", 0): not started
    listeners_down: dict[int, str]  # listener index -> why it is not started
    listener_connections: list[int]  # connections open, per listener

    @property
    def peers(self) -> ClusterOperations: ...

    def gauges(self) -> dict[str, int]: ...

    def plugin_hooks(self) -> dict[str, list[str]]: ...

    def set_plugin_enabled(self, name: str, enabled: bool) -> None: ...

    async def start_listener(self, index: int) -> None: ...

    def stop_listener(self, index: int, kill_sessions: bool = False) -> None: ...


class NotFound(LookupError):
    """No such client, topic or plugin."""


def _connections_of(broker: Managed, session: Session) -> list[Connection]:
    """The connections attached to a registered session (several with
    allow_multiple_sessions: each attached to a member, whose owner it is)."""
    return [c for c in broker.connections if c.session is not None and c.session.owner is session]


def client(broker: Managed, client_id: str, mountpoint: str = "") -> dict[str, Any]:
    """One client: its session row, subscriptions (filter and options) and queue."""
    key = subscriber_id(mountpoint, client_id)
    session = broker.registry.get(key)
    if session is None:
        raise NotFound(f"no session for client id {client_id!r}{_on(mountpoint)}")
    node = broker.settings.node_name
    row = session_query.session_row(node, session, _connections_of(broker, session))
    row["subscriptions"] = [
        {
            "topic": outside(topic_filter),
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


# -- on every node of the cluster -------------------------------------------------------


@dataclass(slots=True)
class Gathered:
    """A command's rows from every node that answered, and those that did not."""

    rows: list[dict[str, Any]]
    errors: list[dict[str, str]] = field(default_factory=list)  # {"node", "error"}
    truncated: bool = False  # more rows matched than the limit let through


async def everywhere(
    broker: Managed, command: str, arguments: dict[str, Any], nodes: set[str] | None = None
) -> Gathered:
    """Run `command` (one of HERE) on this node and on every other one alive (those of
    `nodes` only, if given); each row says its node."""
    here = broker.settings.node_name
    rows = run_here(broker, command, arguments) if nodes is None or here in nodes else []
    gathered = Gathered(list(rows))
    for answer in await broker.peers.ask_others(command, arguments, nodes):
        if answer.error is not None:
            gathered.errors.append({"node": answer.node, "error": answer.error})
        else:
            gathered.rows += answer.result
    return gathered


def run_here(broker: Managed, command: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """One node's part of a cluster-wide command (also what another node's ADMIN frame
    asks of this one): ValueError for arguments it cannot take."""
    operation = HERE.get(command)
    if operation is None:
        raise LookupError(f"no admin command {command!r} on this node")
    return operation(broker, arguments)


async def session_show(broker: Managed, query: Query) -> Gathered:
    """`session show`: the rows of every node, at most `limit` (one more asked of each
    node, so that a cut is known)."""
    arguments = query.wire(limit=query.limit + 1)
    gathered = await everywhere(broker, "session/show", arguments, query.nodes())
    gathered.truncated = len(gathered.rows) > query.limit
    del gathered.rows[query.limit :]
    return gathered


async def session_disconnect(broker: Managed, query: Query, cleanup: bool) -> Gathered:
    """Close the connections of the sessions the query matches (MQTT 5: DISCONNECT 0x98,
    administrative action); with `cleanup`, delete those sessions too."""
    _filtered(query, "disconnect")
    arguments = {"query": query.wire(), "cleanup": cleanup}
    gathered = await everywhere(broker, "session/disconnect", arguments, query.nodes())
    if not gathered.rows and not gathered.errors:
        raise NotFound("no session matches" if cleanup else "no connected session matches")
    return gathered


async def session_unsubscribe(broker: Managed, query: Query) -> Gathered:
    """Remove the subscriptions the query matches (--topic=F: that filter; no topic
    condition: all of the matched sessions')."""
    _filtered(query, "unsubscribe")
    gathered = await everywhere(broker, "session/unsubscribe", query.wire(), query.nodes())
    if not gathered.rows and not gathered.errors:
        raise NotFound("no subscription matches")
    return gathered


def _filtered(query: Query, command: str) -> None:
    if not query.filtered:
        raise ValueError(
            f"session {command}: give a condition (--client_id=ID, --user=~^test-, ...); "
            "without one it would act on every session"
        )


async def set_settings(broker: Managed, pairs: list[tuple[str, str]]) -> Gathered:
    """`set KEY=VALUE ...` on every node; checked here first, so that a bad key or value
    changes nothing anywhere (ValueError)."""
    return await everywhere(broker, "settings/set", runtime_settings.parse(pairs))


async def show_settings(broker: Managed) -> Gathered:
    return await everywhere(broker, "settings/show", {})


def _show_here(broker: Managed, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    query = Query.from_wire(arguments)
    node = broker.settings.node_name
    return session_query.select(query, node, broker.registry.values(), broker.connections)


def _disconnect_here(broker: Managed, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    query, cleanup = Query.from_wire(arguments["query"]), bool(arguments["cleanup"])
    node = broker.settings.node_name
    found = session_query.matching(query, node, broker.registry.values(), broker.connections)
    rows = []
    for session in dict.fromkeys(session for session, _ in found):  # once each, in order
        connections = _connections_of(broker, session)
        if not connections and not cleanup:
            continue
        for connection in connections:
            connection.close(ReasonCode.ADMINISTRATIVE_ACTION)
        if cleanup and broker.registry.get(session.subscriber_id) is session:  # (closing may
            broker.registry.end(session)  # have ended it)
        rows.append(
            {
                "node": node,
                "mountpoint": session.mountpoint,
                "client_id": session.client_id,
                "disconnected": bool(connections),
                "deleted": cleanup,
            }
        )
    return rows


def _unsubscribe_here(broker: Managed, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    query = Query.from_wire(arguments)
    node = broker.settings.node_name
    sessions, connections = broker.registry.values(), broker.connections
    rows = []
    for session, row in list(session_query.matching(query, node, sessions, connections, True)):
        broker.registry.unsubscribe(session, inside(session.mountpoint, row["topic"]))
        rows.append({key: row[key] for key in ("node", "mountpoint", "client_id", "topic")})
    return rows


def _set_here(broker: Managed, values: dict[str, Any]) -> list[dict[str, Any]]:
    rows = runtime_settings.apply(broker.config, values, broker.settings.node_name)
    if any(row["setting"] == "broker.allow_anonymous" for row in rows):  # auth on or off
        for warning in deciders.warnings(broker.config, broker.plugins):
            log.warning("%s", warning)
    return rows


HERE: dict[str, Callable[[Managed, dict[str, Any]], list[dict[str, Any]]]] = {
    "session/show": _show_here,
    "session/disconnect": _disconnect_here,
    "session/unsubscribe": _unsubscribe_here,
    "settings/set": lambda broker, values: _set_here(broker, values),
    "settings/show": lambda broker, _: runtime_settings.show(
        broker.config, broker.settings.node_name
    ),
}


# -- listeners (this node's) ------------------------------------------------------------


def listeners(broker: Managed) -> list[dict[str, Any]]:
    """Each MQTT listener: kind, address (the one bound, once it was), whether it
    accepts connections, and how many it holds."""
    rows = []
    for index, settings in enumerate(broker.config.listeners):
        bound = broker.listening[index] if index < len(broker.listening) else ("", 0)
        rows.append(
            {
                "listener": index,
                "type": settings.type,
                "address": _address(*bound) if bound[1] else settings.address,
                "mountpoint": settings.mountpoint,
                "state": "stopped" if index in broker.listeners_down else "running",
                "connections": broker.listener_connections[index],
                "max_connections": settings.max_connections,
            }
        )
    return rows


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listener(broker: Managed, which: str) -> int:
    """The index of the listener `which` names: its index, or its address (as bound, or
    as configured)."""
    for row in listeners(broker):
        index = row["listener"]
        if which in (str(index), row["address"], broker.config.listeners[index].address):
            return index
    known = ", ".join(row["address"] for row in listeners(broker))
    raise NotFound(f"no listener {which!r} (listeners: {known})")


async def start_listener(broker: Managed, which: str) -> list[dict[str, Any]]:
    """Accept connections again (on the address it had; ValueError: it cannot)."""
    await broker.start_listener(_listener(broker, which))
    return listeners(broker)


def stop_listener(broker: Managed, which: str, kill_sessions: bool) -> list[dict[str, Any]]:
    """Accept no new connections; those open stay, or are closed (`kill_sessions`)."""
    broker.stop_listener(_listener(broker, which), kill_sessions)
    return listeners(broker)


def retained(
    broker: Managed, topic_filter: str = "#", limit: int = 1000, mountpoint: str = ""
) -> list[dict]:
    """Retained messages of `mountpoint`'s tree whose topic matches `topic_filter`, at
    most `limit`, by topic (as for a subscription, "#" leaves out `$` topics: ask for
    `$SYS/#` to see those)."""
    if not valid_topic_filter(topic_filter):
        raise ValueError(f"topic: {topic_filter!r} is not a topic filter")
    _check_mountpoint(mountpoint)
    found = broker.retained.matching(inside(mountpoint, topic_filter), broker.loop.time())
    return [_message_row(m) for m in sorted(found, key=lambda m: m.topic)[:limit]]


def _message_row(message: Message) -> dict[str, Any]:
    try:
        payload: str = message.payload.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    return {
        "topic": outside(message.topic),
        "qos": message.qos,
        "payload": payload,
        "payload_encoding": encoding,
        "payload_size": len(message.payload),
    }


def delete_retained(broker: Managed, topic: str, mountpoint: str = "") -> dict[str, str]:
    """Clear the retained message of `topic` (a topic name, no wildcards) in
    `mountpoint`'s tree."""
    if "+" in topic or "#" in topic:
        raise ValueError("topic: a topic name, without wildcards")
    _check_mountpoint(mountpoint)
    key = inside(mountpoint, topic)
    if not broker.retained.matching(key, broker.loop.time()):
        raise NotFound(f"no retained message on {topic!r}{_on(mountpoint)}")
    broker.retained.update(Message(key, b"", 0, retain=True))
    broker.store.delete_retained(key)
    return {"deleted": topic}


def _check_mountpoint(mountpoint: str) -> None:
    why = mountpoint_problem(mountpoint)
    if why is not None:
        raise ValueError(f"mountpoint: {why}")


def _on(mountpoint: str) -> str:
    """ " on mountpoint 'm'" for an error message; "" for the default tree."""
    return f" on mountpoint {mountpoint!r}" if mountpoint else ""


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
