"""What an operator can ask of a running broker, whatever carries the request (the HTTP
admin API, `nautilus admin`): sessions, one client's subscriptions and queue, disconnects,
retained messages, metrics, plugins, run-time settings and listeners. Plain functions
returning plain data (JSON-ready), so the API stays a thin translation and the
operations are testable.

Each function takes the node through the port of its role, below (`SessionDirectory`,
`CommandRunner`, `ListenerControl`, `RetainedKeeper`, `FigureSource`,
`PluginSwitchboard`): the Broker plays them all, and none of this imports
broker/server.py.

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

from broker import admin_queries, deciders, runtime_settings
from broker.admin_queries import Query
from broker.message import Message
from broker.mountpoints import inside, outside, subscriber_id
from broker.mountpoints import problem as mountpoint_problem
from broker.protocol import ReasonCode
from broker.topics import valid_topic_filter
from hooks import forget_decisions

log = logging.getLogger("nautilus.admin")

if TYPE_CHECKING:
    from broker.config import BrokerSettings, Config
    from broker.connection import Connection
    from broker.metrics import Metrics
    from broker.peers import ClusterOperations, ClusterOverview
    from broker.registry import Registry
    from broker.retain import RetainedMessages
    from broker.session import Session
    from broker.store import MessageStore
    from broker.trace.tracer import Tracer
    from hooks import PluginDoors


class SessionDirectory(Protocol):
    """This node's sessions and the connections attached to them: a client's row, and
    the sessions a query finds, disconnects or unsubscribes."""

    settings: BrokerSettings  # node_name: each row says its node
    registry: Registry
    connections: set[Connection]


class CommandRunner(SessionDirectory, Protocol):
    """A node that runs commands on every node of the cluster (`everywhere`): its part of
    them (HERE: session queries, settings), and the other nodes asked theirs."""

    config: Config  # the run-time settings change it
    plugins: list[tuple[str, Any]]  # (name, plugin): who decides, once auth is on or off

    @property
    def peers(self) -> ClusterOperations: ...


class ListenerControl(Protocol):
    """The node's MQTT listeners: how each is, and starting or stopping one."""

    config: Config  # listeners
    listening: list[tuple[str, int]]  # each listener's address; ("", 0): not started
    listeners_down: dict[int, str]  # listener index -> why it is not started
    listener_connections: list[int]  # connections open, per listener

    async def start_listener(self, index: int) -> None: ...

    def stop_listener(self, index: int, kill_sessions: bool = False) -> None: ...


class RetainedKeeper(Protocol):
    """The retained messages, in memory and in the store."""

    retained: RetainedMessages
    store: MessageStore
    loop: asyncio.AbstractEventLoop  # the clock of their expiry


class FigureSource(Protocol):
    """The node's figures: counters, gauges, uptime, the store's, the cluster's, the
    plugins' (the admin API's metrics, /metrics, /status.json, Graphite)."""

    metrics: Metrics
    started_at: float  # time.time()
    store: MessageStore
    doors: PluginDoors  # the plugins' metrics()

    @property
    def peers(self) -> ClusterOverview: ...

    def gauges(self) -> dict[str, float]: ...


class PluginSwitchboard(Protocol):
    """The loaded plugins: which are enabled, their hooks, and their side doors the
    admin side opens (invalidate, the bridges)."""

    plugins: list[tuple[str, Any]]  # (name, plugin), in the order they are called
    disabled_plugins: set[str]
    doors: PluginDoors  # resolved again when a plugin is enabled or disabled

    def plugin_hooks(self) -> dict[str, list[str]]: ...

    def set_plugin_enabled(self, name: str, enabled: bool) -> None: ...


class NotFound(LookupError):
    """No such client, topic or plugin."""


def _connections_of(directory: SessionDirectory, session: Session) -> list[Connection]:
    """The connections attached to a registered session (several with
    allow_multiple_sessions: each attached to a member, whose owner it is)."""
    connections = directory.connections
    return [c for c in connections if c.session is not None and c.session.owner is session]


def client(directory: SessionDirectory, client_id: str, mountpoint: str = "") -> dict[str, Any]:
    """One client: its session row, subscriptions (filter and options) and queue."""
    key = subscriber_id(mountpoint, client_id)
    session = directory.registry.get(key)
    if session is None:
        raise NotFound(f"no session for client id {client_id!r}{_on(mountpoint)}")
    node = directory.settings.node_name
    row = admin_queries.session_row(node, session, _connections_of(directory, session))
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
    node: CommandRunner, command: str, arguments: dict[str, Any], nodes: set[str] | None = None
) -> Gathered:
    """Run `command` (one of HERE) on this node and on every other one alive (those of
    `nodes` only, if given); each row says its node."""
    here = node.settings.node_name
    rows = run_here(node, command, arguments) if nodes is None or here in nodes else []
    gathered = Gathered(list(rows))
    for answer in await node.peers.ask_others(command, arguments, nodes):
        if answer.error is not None:
            gathered.errors.append({"node": answer.node, "error": answer.error})
        else:
            gathered.rows += answer.result
    return gathered


def run_here(node: CommandRunner, command: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """One node's part of a cluster-wide command (also what another node's ADMIN frame
    asks of this one): ValueError for arguments it cannot take."""
    operation = HERE.get(command)
    if operation is None:
        raise LookupError(f"no admin command {command!r} on this node")
    return operation(node, arguments)


async def session_show(node: CommandRunner, query: Query) -> Gathered:
    """`session show`: the rows of every node, at most `limit` (one more asked of each
    node, so that a cut is known)."""
    arguments = query.wire(limit=query.limit + 1)
    gathered = await everywhere(node, "session/show", arguments, query.nodes())
    gathered.truncated = len(gathered.rows) > query.limit
    del gathered.rows[query.limit :]
    return gathered


async def session_disconnect(node: CommandRunner, query: Query, cleanup: bool) -> Gathered:
    """Close the connections of the sessions the query matches (MQTT 5: DISCONNECT 0x98,
    administrative action); with `cleanup`, delete those sessions too."""
    _filtered(query, "disconnect")
    arguments = {"query": query.wire(), "cleanup": cleanup}
    gathered = await everywhere(node, "session/disconnect", arguments, query.nodes())
    if not gathered.rows and not gathered.errors:
        raise NotFound("no session matches" if cleanup else "no connected session matches")
    return gathered


async def session_unsubscribe(node: CommandRunner, query: Query) -> Gathered:
    """Remove the subscriptions the query matches (--topic=F: that filter; no topic
    condition: all of the matched sessions')."""
    _filtered(query, "unsubscribe")
    gathered = await everywhere(node, "session/unsubscribe", query.wire(), query.nodes())
    if not gathered.rows and not gathered.errors:
        raise NotFound("no subscription matches")
    return gathered


def _filtered(query: Query, command: str) -> None:
    if not query.filtered:
        raise ValueError(
            f"session {command}: give a condition (--client_id=ID, --user=~^test-, ...); "
            "without one it would act on every session"
        )


async def set_settings(node: CommandRunner, pairs: list[tuple[str, str]]) -> Gathered:
    """`set KEY=VALUE ...` on every node; checked here first, so that a bad key or value
    changes nothing anywhere (ValueError)."""
    return await everywhere(node, "settings/set", runtime_settings.parse(pairs))


async def show_settings(node: CommandRunner) -> Gathered:
    return await everywhere(node, "settings/show", {})


def _show_here(directory: SessionDirectory, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    query = Query.from_wire(arguments)
    node = directory.settings.node_name
    return admin_queries.select(query, node, directory.registry.values(), directory.connections)


def _disconnect_here(
    directory: SessionDirectory, arguments: dict[str, Any]
) -> list[dict[str, Any]]:
    query, cleanup = Query.from_wire(arguments["query"]), bool(arguments["cleanup"])
    node, registry = directory.settings.node_name, directory.registry
    found = admin_queries.matching(query, node, registry.values(), directory.connections)
    rows = []
    for session in dict.fromkeys(session for session, _ in found):  # once each, in order
        connections = _connections_of(directory, session)
        if not connections and not cleanup:
            continue
        for connection in connections:
            connection.close(ReasonCode.ADMINISTRATIVE_ACTION)
        if cleanup and registry.get(session.subscriber_id) is session:  # (closing may
            registry.end(session)  # have ended it)
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


def _unsubscribe_here(
    directory: SessionDirectory, arguments: dict[str, Any]
) -> list[dict[str, Any]]:
    query = Query.from_wire(arguments)
    node, registry = directory.settings.node_name, directory.registry
    sessions, connections = registry.values(), directory.connections
    rows = []
    for session, row in list(admin_queries.matching(query, node, sessions, connections, True)):
        registry.unsubscribe(session, inside(session.mountpoint, row["topic"]))
        rows.append({key: row[key] for key in ("node", "mountpoint", "client_id", "topic")})
    return rows


def _set_here(node: CommandRunner, values: dict[str, Any]) -> list[dict[str, Any]]:
    rows = runtime_settings.apply(node.config, values, node.settings.node_name)
    if any(row["setting"] == "broker.allow_anonymous" for row in rows):  # auth on or off
        for warning in deciders.warnings(node.config, node.plugins):
            log.warning("%s", warning)
    return rows


HERE: dict[str, Callable[[CommandRunner, dict[str, Any]], list[dict[str, Any]]]] = {
    "session/show": _show_here,
    "session/disconnect": _disconnect_here,
    "session/unsubscribe": _unsubscribe_here,
    "settings/set": _set_here,
    "settings/show": lambda node, _: runtime_settings.show(node.config, node.settings.node_name),
}


# -- listeners (this node's) ------------------------------------------------------------


def listeners(control: ListenerControl) -> list[dict[str, Any]]:
    """Each MQTT listener: kind, address (the one bound, once it was), whether it
    accepts connections, and how many it holds."""
    rows = []
    for index, settings in enumerate(control.config.listeners):
        bound = control.listening[index] if index < len(control.listening) else ("", 0)
        rows.append(
            {
                "listener": index,
                "type": settings.type,
                "address": _address(*bound) if bound[1] else settings.address,
                "mountpoint": settings.mountpoint,
                "state": "stopped" if index in control.listeners_down else "running",
                "connections": control.listener_connections[index],
                "max_connections": settings.max_connections,
            }
        )
    return rows


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listener(control: ListenerControl, which: str) -> int:
    """The index of the listener `which` names: its index, or its address (as bound, or
    as configured)."""
    for row in listeners(control):
        index = row["listener"]
        if which in (str(index), row["address"], control.config.listeners[index].address):
            return index
    known = ", ".join(row["address"] for row in listeners(control))
    raise NotFound(f"no listener {which!r} (listeners: {known})")


async def start_listener(control: ListenerControl, which: str) -> list[dict[str, Any]]:
    """Accept connections again (on the address it had; ValueError: it cannot)."""
    await control.start_listener(_listener(control, which))
    return listeners(control)


def stop_listener(
    control: ListenerControl, which: str, kill_sessions: bool
) -> list[dict[str, Any]]:
    """Accept no new connections; those open stay, or are closed (`kill_sessions`)."""
    control.stop_listener(_listener(control, which), kill_sessions)
    return listeners(control)


def retained(
    keeper: RetainedKeeper, topic_filter: str = "#", limit: int = 1000, mountpoint: str = ""
) -> list[dict]:
    """Retained messages of `mountpoint`'s tree whose topic matches `topic_filter`, at
    most `limit`, by topic (as for a subscription, "#" leaves out `$` topics: ask for
    `$SYS/#` to see those)."""
    if not valid_topic_filter(topic_filter):
        raise ValueError(f"topic: {topic_filter!r} is not a topic filter")
    _check_mountpoint(mountpoint)
    found = keeper.retained.matching(inside(mountpoint, topic_filter), keeper.loop.time())
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


def delete_retained(keeper: RetainedKeeper, topic: str, mountpoint: str = "") -> dict[str, str]:
    """Clear the retained message of `topic` (a topic name, no wildcards) in
    `mountpoint`'s tree."""
    if "+" in topic or "#" in topic:
        raise ValueError("topic: a topic name, without wildcards")
    _check_mountpoint(mountpoint)
    key = inside(mountpoint, topic)
    if not keeper.retained.matching(key, keeper.loop.time()):
        raise NotFound(f"no retained message on {topic!r}{_on(mountpoint)}")
    keeper.retained.update(Message(key, b"", 0, retain=True))
    keeper.store.delete_retained(key)
    return {"deleted": topic}


def _check_mountpoint(mountpoint: str) -> None:
    why = mountpoint_problem(mountpoint)
    if why is not None:
        raise ValueError(f"mountpoint: {why}")


def _on(mountpoint: str) -> str:
    """ " on mountpoint 'm'" for an error message; "" for the default tree."""
    return f" on mountpoint {mountpoint!r}" if mountpoint else ""


def delete_expired_retained(keeper: RetainedKeeper) -> dict[str, int]:
    """Sweep the retained messages whose MQTT 5 expiry has passed (they go when matched
    anyway; this frees them now)."""
    return {"deleted": keeper.retained.delete_expired(keeper.loop.time())}


def metrics(figures: FigureSource) -> dict[str, float]:
    values: dict[str, float] = {**figures.metrics.snapshot()}
    values.update(figures.gauges())
    values["uptime_seconds"] = int(time.time() - figures.started_at)
    return values


def reset_metrics(figures: FigureSource) -> dict[str, float]:
    """Counters back to 0 (gauges read the broker's state and stay what they are)."""
    figures.metrics.reset()
    return metrics(figures)


def cluster_nodes(peers: ClusterOperations) -> list[dict[str, Any]]:
    """Every node this one knows: alive, its link, what went over it (vmq-admin cluster
    show, with the link figures)."""
    return cluster_status(peers)["nodes"]


def cluster_join(peers: ClusterOperations, address: str) -> dict[str, Any]:
    return {"result": peers.join(address)}


async def cluster_leave(peers: ClusterOperations, node: str) -> dict[str, Any]:
    """`node` (empty: this node) leaves the cluster."""
    return {"result": await peers.leave(node)}


def cluster_status(peers: ClusterOperations) -> dict[str, Any]:
    """The metadata's state, the nodes, and the routing score."""
    status = peers.status()
    if status is None:
        raise NotFound("this node is not in a cluster ([cluster] address is empty)")
    return status


def plugins(switchboard: PluginSwitchboard) -> list[dict[str, Any]]:
    return [
        {"name": name, "enabled": name not in switchboard.disabled_plugins, "hooks": hooks}
        for name, hooks in switchboard.plugin_hooks().items()
    ]


def set_plugin_enabled(
    switchboard: PluginSwitchboard, name: str, enabled: bool
) -> list[dict[str, Any]]:
    loaded = dict(switchboard.plugins)
    if name not in loaded:
        raise NotFound(f"no plugin {name!r} (loaded: {', '.join(loaded)})")
    switchboard.set_plugin_enabled(name, enabled)
    return plugins(switchboard)


async def invalidate_auth(
    switchboard: PluginSwitchboard,
    directory: SessionDirectory,
    client_id: str | None,
    username: str | None,
) -> list[dict[str, Any]]:
    """The publish decisions this node's connections keep (hooks/decisions.py) are
    forgotten, all of them (the first row: how many connections kept some), and each
    enabled plugin that keeps auth decisions re-reads them for these connected clients
    (both None: all of them, on this node): a row per plugin, with how many."""
    keeping = sum(1 for c in directory.connections if c.client.decisions)
    forget_decisions()
    done: list[dict[str, Any]] = [{"plugin": "broker", "clients": keeping}]
    for name, invalidate in switchboard.doors.invalidate:  # the enabled plugins'
        try:
            count = invalidate(client_id, username)
            if inspect.isawaitable(count):
                count = await count
        except Exception as exc:  # the plugin could not (its database is down): said
            done.append({"plugin": name, "clients": 0, "error": str(exc) or type(exc).__name__})
            continue
        done.append({"plugin": name, "clients": count})
    return done


def bridges(switchboard: PluginSwitchboard) -> list[dict[str, Any]]:
    """Every bridge, a row each (`[[bridges]]`: docs/bridge.md)."""
    return [row for control in switchboard.doors.bridges for row in control.rows()]


async def run_bridge(
    switchboard: PluginSwitchboard, name: str, running: bool
) -> list[dict[str, Any]]:
    """Start or stop the bridge `name`; the bridges after."""
    for control in switchboard.doors.bridges:
        if any(row["name"] == name for row in control.rows()):
            done = control.run(name, running)
            if inspect.isawaitable(done):
                await done
            return bridges(switchboard)
    known = ", ".join(row["name"] for row in bridges(switchboard)) or "none"
    raise NotFound(f"no bridge {name!r} (configured: {known})")


def stop_traces(tracer: Tracer) -> dict[str, int]:
    """`trace stop-all`: every trace ends, on this node and the others (how many here)."""
    return {"stopped": tracer.stop_all()}
