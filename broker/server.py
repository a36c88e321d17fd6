"""The Broker: makes the node's parts and joins them, and owns the listeners.

The parts: the store, the router and retained messages, routing (broker/routing.py), the
registry of sessions (broker/registry.py), flow control, the plugins' hook chains and side
doors (resolved once: `hooks`, `chains`, `doors`), the other nodes of a cluster if any
(`peers`, broker/peers.py), $SYS, the tracer and the HTTP side. Each part that calls up
gets the Broker as the role it needs (a small protocol of the part's own), never more.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker import admin, deciders, optional
from broker.binding import BindError, claim, reason
from broker.client.engine import ConnectTerms
from broker.client.handlers import HANDLERS
from broker.collector import Collector
from broker.config import Config, ConfigError, ListenerSettings
from broker.connection import Connection, ConnectionPorts
from broker.connection_cap import ConnectionCap
from broker.descriptors import FileDescriptors
from broker.flow import FlowControl
from broker.graphite import GraphiteReporter
from broker.hook_callers import HookCallers
from broker.ingress import Ingress
from broker.message import Message
from broker.metrics import Metrics
from broker.peers import ALONE, Alone
from broker.plugins import Unavailable, call_all, configured_plugins
from broker.protocol import MAX_PACKET_SIZE, Property, ReasonCode
from broker.registry import Registry, session_factory
from broker.retain import RetainedMessages
from broker.routing import Routing
from broker.session import Session
from broker.store import open_store
from broker.subscription_trie import SubscriptionTrie
from broker.systree import SysTree
from broker.tls import TlsListener
from broker.trace.tracer import Tracer
from hooks import HOOKS, Hooks, Lifecycle, forget_decisions, plugin_doors

if TYPE_CHECKING:  # imported when a config needs them (broker/optional.py)
    from broker.cluster.node import Cluster
    from broker.http.app import HttpServer
    from broker.proxy_protocol import ProxyHeaderReader

log = logging.getLogger("nautilus")


class Broker:
    def __init__(
        self,
        config: Config,
        loop: asyncio.AbstractEventLoop | None = None,
        plugins: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self.settings = config.broker
        self.loop = loop or asyncio.get_running_loop()
        self.metrics = Metrics()
        # The cyclic garbage collector, kept from pausing the node (broker/collector.py).
        self.collector = Collector(self.loop, self.metrics, self._held)
        self.flow = FlowControl(self.loop, self.settings.slow_subscriber_timeout, self.metrics)
        self.router = SubscriptionTrie()
        self.store = open_store(config.store, self.loop)
        self.retained = RetainedMessages(on_expired=self.store.delete_retained)
        self.routing = Routing(
            self.settings, self.router, self.retained, self.store, self.metrics, self.loop
        )
        self.plugins = configured_plugins(config) if plugins is None else plugins
        self.disabled_plugins: set[str] = set()  # by the admin API: their hooks are not called
        self.started_plugins: list[Lifecycle] = []  # those stop() stops
        self.tasks: set[asyncio.Task] = set()  # hook flows and async events
        self.hooks = Hooks(self.plugins, self.tasks)
        self.chains = HookCallers(self.hooks)  # every chain the core calls, resolved once
        self.doors = plugin_doors(self.plugins)  # the plugins' side doors, resolved once
        # Every message's way into routing (broker/ingress.py); it asks the plugins that
        # keep something before the broker acknowledges a message (before_ack).
        self.ingress = Ingress(
            self.routing, self.flow, self.chains, self.store, self.metrics, self.doors.before_ack
        )
        new_session = session_factory(
            self.settings,
            self.metrics,
            self.store,
            self.chains,
            self.loop,
            self.flow,
            self.router.group,
        )
        self.registry = Registry(
            new_session, self.routing, self.ingress, self.store, self.chains, self.loop
        )
        self.started_at = time.time()
        self.stopping = False
        self.shutdown_requested = asyncio.Event()  # a signal, or the node left its cluster
        self.graphite = self._graphite() if config.graphite.enabled else None
        self.connections: set[Connection] = set()
        # proxy_protocol listeners' connections before their header (then a Connection).
        self.awaiting_header: set[ProxyHeaderReader] = set()
        self.handlers = HANDLERS  # what handles each packet (broker/client/handlers.py)
        self.connection_ports = ConnectionPorts(self, self, self)  # every connection's view
        self.terms = ConnectTerms(  # what every client is told at CONNECT
            self.settings.max_message_size or MAX_PACKET_SIZE, self._connack_properties()
        )
        # (host, port) bound, per listener; ("", 0) for one not started (`listeners_down`).
        self.listening: list[tuple[str, int]] = []
        self.listeners_down: dict[int, str] = {}  # listener index -> why (a library missing)
        self.listener_connections = [0] * len(config.listeners)  # open, per listener
        self.caps = [  # each listener's max_connections
            ConnectionCap(log, _listener_name(i, c), c.max_connections, self.loop)
            for i, c in enumerate(config.listeners)
        ]
        self.descriptors = FileDescriptors(self.loop, self._connections_open)
        self._servers: dict[int, asyncio.Server] = {}  # the listeners accepting, by index
        # TLS listeners' contexts, by listener index (a file that will not load: ConfigError).
        self.tls = {
            index: TlsListener(listener, f"listeners[{index}]")
            for index, listener in enumerate(config.listeners)
            if listener.type in ("ssl", "wss")
        }
        self.systree = SysTree(self)  # $SYS/<node>/... every systree_interval
        # The other nodes of a cluster ([cluster] address), or none.
        self.peers: Cluster | Alone = self._cluster() if config.cluster.address else ALONE
        self.routing.peers = self.peers
        self.tracer = Tracer(self)  # `nautilus admin trace` (broker/trace/)
        self.http = self._http() if config.http.enabled else None

    def _cluster(self) -> Cluster:
        """This node's part in a cluster, over the metadata backend a plugin provides. A
        library it needs that cannot be imported stops start-up (ConfigError): a node of a
        cluster does not serve alone."""
        try:
            optional.load("broker.cluster.node", "[cluster] cannot start")
        except optional.MissingLibrary as exc:
            raise ConfigError(str(exc)) from None
        from broker.cluster.node import Cluster
        from broker.cluster.ports import NodePorts

        # The Broker plays every role the cluster names (broker/cluster/ports.py).
        ports = NodePorts(
            self.settings,
            self.loop,
            self.metrics,
            sessions=self,
            mirrored=self,
            routing=self,
            exit=self,
            admin=self,
            traced=self,
        )
        wanted = self.config.cluster.metadata
        if wanted == "swc":  # the leaderless metadata: every node holds it, no plugin
            from broker.cluster.swc.backend import SwcBackend

            cluster = self.config.cluster
            return Cluster(ports, cluster, SwcBackend(cluster.swc, joining=bool(cluster.seeds)))
        make_backend = self.doors.metadata_backends.get(wanted)
        if make_backend is not None:
            backend = make_backend(self.config.cluster.dead_after)
            return Cluster(ports, self.config.cluster, backend)
        skipped = [name for name, plugin in self.plugins if isinstance(plugin, Unavailable)]
        also = f" (skipped, a library missing: {', '.join(skipped)})" if skipped else ""
        raise ConfigError(f"cluster.metadata: no enabled plugin provides {wanted!r}{also}")

    def _graphite(self) -> GraphiteReporter:
        from broker.http.prometheus import collect  # the figures of /metrics, all of them

        node = self.settings.node_name
        return GraphiteReporter(self.config.graphite, node, lambda: collect(self))

    def _http(self) -> HttpServer | None:
        """The HTTP side; None when a library it needs cannot be imported (logged once):
        the MQTT side serves without it."""
        try:
            optional.load("broker.http.app", f"[http] on {self.config.http.address} not started")
        except optional.MissingLibrary as exc:
            log.error("%s", exc)
            return None
        from broker.http.app import HttpPorts, HttpServer

        ports = HttpPorts(
            commands=self,
            listeners=self,
            retained=self,
            figures=self,
            plugins=self,
            readiness=self,
            publishing=self,
            peers=self.peers,
            tracer=self.tracer,
        )
        return HttpServer(self.config, self.loop, ports)

    def _connack_properties(self) -> dict:
        """What an MQTT 5 client learns about us in CONNACK [3.2.2.3]."""
        props = {
            Property.RECEIVE_MAXIMUM: self.settings.receive_max_broker,
        }
        if self.settings.topic_alias_max_broker:
            props[Property.TOPIC_ALIAS_MAXIMUM] = self.settings.topic_alias_max_broker
        if self.settings.max_message_size:
            props[Property.MAXIMUM_PACKET_SIZE] = self.settings.max_message_size
        return props

    async def start(self) -> None:
        """Bind every address (the MQTT listeners, HTTP, the cluster's; the event relay's
        in its plugin's start), then start the parts, then serve and say so: a port that
        cannot be had stops start-up (BindError, naming its key) before anything is
        served or said to listen. A failed start releases what it took (`stop`)."""
        for warning in deciders.warnings(self.config, self.plugins):
            log.warning("%s", warning)
        self.collector.start()
        try:
            await self._claim_addresses()
            await self._start_parts()
            self.collector.started()  # what start-up loaded: out of every later pass
            await self._serve()
        except BaseException:
            await self.stop()
            raise

    async def _claim_addresses(self) -> None:
        for index, listener in enumerate(self.config.listeners):
            self.listening.append(("", 0))  # keeps the list indexed by listener
            try:
                self._servers[index] = await self._bind_listener(index, *listener.host_port)
            except optional.MissingLibrary as exc:  # this listener only: the others serve
                log.error("%s", exc)
                self.listeners_down[index] = str(exc)
            except OSError as exc:
                key = f"listeners[{index}].address"
                raise BindError(key, listener.address, exc, "[[listeners]] address") from None
        if self.http is not None:
            await self.http.bind()
        await self.peers.bind()

    async def _start_parts(self) -> None:
        node = self.config.cluster.node_name or self.settings.node_name
        for place in self.doors.placement:  # work that runs on one node of a cluster at a time
            place(node, self.peers.alive)
        for lifecycle in self.doors.lifecycles:
            self.started_plugins.append(lifecycle)  # stopped too should it fail half-way
            await call_all([lifecycle], "start")
        self._restore()
        await self.peers.start()  # before clients: registrations need it
        self.descriptors.start()

    async def _serve(self) -> None:
        for index, server in self._servers.items():
            await self._serve_listener(index, server)
        if self.http is not None:
            await self.http.start()
        if self.graphite is not None:
            self.graphite.start()
        self.systree.start()

    async def _bind_listener(self, index: int, host: str, port: int) -> asyncio.Server:
        """Listener `index`'s server on `host`:`port`, not accepting yet (MissingLibrary:
        a library its layers need is not there; OSError: the address cannot be bound)."""
        factory, tls = self._protocols(index)
        server = await claim(
            self.loop,
            factory,
            host,
            port,
            reuse_address=True,
            backlog=4096,
            ssl=tls,
            # A handshake that does not finish in time is dropped like a silent client.
            ssl_handshake_timeout=self.settings.connect_timeout if tls else None,
        )
        self.listening[index] = server.sockets[0].getsockname()[:2]
        return server

    async def _serve_listener(self, index: int, server: asyncio.Server) -> None:
        await server.start_serving()
        self._servers[index] = server
        listener = self.config.listeners[index]
        tree = f", mountpoint {listener.mountpoint}" if listener.mountpoint else ""
        host, port = self.listening[index]
        log.info("listening for MQTT on %s:%s (%s%s)", host, port, listener.type, tree)

    async def start_listener(self, index: int) -> None:
        """`nautilus admin listener start`: accept connections again, on the address the
        listener had (its port, when the config says 0); ValueError: it cannot."""
        if index in self._servers:
            raise ValueError(f"{_listener_name(index, self.config.listeners[index])} is running")
        host, port = self.listening[index]
        if not port:  # never started
            host, port = self.config.listeners[index].host_port
        try:
            server = await self._bind_listener(index, host, port)
        except optional.MissingLibrary as exc:
            raise ValueError(f"listeners[{index}] cannot start: {exc}") from None
        except OSError as exc:
            raise ValueError(
                f"listeners[{index}] cannot start: {host}:{port}: {reason(exc)}"
            ) from None
        await self._serve_listener(index, server)
        self.listeners_down.pop(index, None)

    def stop_listener(self, index: int, kill_sessions: bool = False) -> None:
        """`nautilus admin listener stop`: accept no new connections (until `start`); the
        connections open stay, unless `kill_sessions` (VerneMQ's flag): those are closed
        (MQTT 5: 0x98), their sessions go offline. /health says so while it lasts."""
        name = _listener_name(index, self.config.listeners[index])
        server = self._servers.pop(index, None)
        if server is None:
            raise ValueError(f"{name} is not running")
        server.close()  # the listening socket only: accepted connections are not its
        self.listeners_down[index] = f"{name} stopped (nautilus admin listener start)"
        closed = [c for c in self.connections if c.listener == index] if kill_sessions else []
        for connection in closed:
            connection.close(ReasonCode.ADMINISTRATIVE_ACTION)
        log.warning("%s stopped by an operator: no new connections, %d closed", name, len(closed))

    def admin_request(self, command: str, arguments: dict[str, Any]) -> Any:
        """(cluster Host) Another node's part of a cluster-wide admin command."""
        return admin.run_here(self, command, arguments)

    def _protocols(
        self, index: int
    ) -> tuple[Callable[[], asyncio.Protocol], ssl.SSLContext | None]:
        """A listener's protocol factory, and the context for asyncio's own TLS, if it is
        the one to use: the layers are PROXY header, TLS, WebSocket, then MQTT, each there
        if the listener has it. Resolved once per listener, at start: the modules of the
        layers it has are imported here (MissingLibrary if a library they need is not
        there), never per connection."""
        listener = self.config.listeners[index]
        down = f"{_listener_name(index, listener)} not started"
        timeout = self.settings.connect_timeout  # for each layer's handshake
        connection = functools.partial(Connection, self.connection_ports, index)
        factory: Callable[[], asyncio.Protocol] = connection
        if listener.type in ("ws", "wss"):
            optional.load("broker.websocket", down)
            from broker.websocket import WebSocketProtocol

            size = self.terms.max_packet_size
            factory = functools.partial(
                WebSocketProtocol, self.loop, timeout, size, connection, listener.path
            )
        context = self.tls[index].server if index in self.tls else None
        if not listener.proxy_protocol:
            return factory, context
        optional.load("broker.proxy_protocol", down)
        from broker.proxy_protocol import ProxyHeaderReader

        if context is not None:  # TLS after the header: ours, over memory BIOs
            from broker.tls_stream import TlsStream

            factory = functools.partial(TlsStream, context, factory, self.loop, timeout)
        reader = functools.partial(
            ProxyHeaderReader, self.awaiting_header, self.loop, timeout, factory
        )
        return reader, None

    def set_plugin_enabled(self, name: str, enabled: bool) -> None:
        """Stop or start calling a plugin's hooks (its own servers, e.g. the relay's, run
        on: only its say in the broker's decisions and events changes). The chains are
        resolved again in place (sessions hold them), the side doors anew (the ingress
        gets the enabled plugins' before_ack)."""
        if enabled:
            self.disabled_plugins.discard(name)
        else:
            self.disabled_plugins.add(name)
        plugins = [(n, p) for n, p in self.plugins if n not in self.disabled_plugins]
        self.hooks = Hooks(plugins, self.tasks)
        self.chains.load(self.hooks)
        forget_decisions()  # kept publish decisions were the old chain's answers
        self.doors = plugin_doors(self.plugins, self.disabled_plugins)
        self.ingress.before_ack = self.doors.before_ack
        log.info("plugin %s %s", name, "enabled" if enabled else "disabled")

    def plugin_hooks(self) -> dict[str, list[str]]:
        """Each loaded plugin's hooks, in the order plugins are called."""
        return {
            name: [hook for hook in HOOKS if getattr(plugin, hook, None) is not None]
            for name, plugin in self.plugins
        }

    def reload_tls(self) -> None:
        """SIGHUP: TLS listeners load their certificate files again, for new connections
        (established ones keep theirs), and so do the cluster's links and plugins' own
        TLS servers (the `reload_tls` side door: the event relay's). Files that fail keep
        the old ones."""
        reloads = [(tls.where, tls.reload) for tls in self.tls.values()]
        if not isinstance(self.peers, Alone) and self.peers.tls is not None:
            reloads.append((self.peers.tls.where, self.peers.tls.reload))  # [cluster]'s
        reloads += [(deciders.table(name), reload) for name, reload in self.doors.reload_tls]
        for where, reload in reloads:
            try:
                reload()
            except ConfigError as exc:
                log.error("TLS reload failed, keeping the previous certificates: %s", exc)
            else:
                log.info("%s: TLS certificates reloaded", where)

    def send_clients_away(self) -> None:
        """The listeners close and every client is disconnected (MQTT 5: 0x8B); their
        sessions go offline (clean ones end)."""
        for server in self._servers.values():
            server.close()
        for reader in list(self.awaiting_header):
            reader.refuse("the broker is shutting down")
        for connection in list(self.connections):
            connection.close(ReasonCode.SERVER_SHUTTING_DOWN)  # its session goes offline
            if connection.transport is not None:
                connection.transport.close()  # no lingering at shutdown

    async def stop(self) -> None:
        self.stopping = True  # /health says 503 from now on, while connections close
        self.systree.stop()
        self.send_clients_away()
        for server in self._servers.values():
            await server.wait_closed()
        self._servers.clear()
        for task in list(self.tasks):
            task.cancel()
        self.tracer.stop_here("the node stops")  # (their streams end before HTTP does)
        await self.peers.stop()
        await call_all(self.started_plugins, "stop")
        self.started_plugins.clear()
        if self.http is not None:
            await self.http.stop()
        if self.graphite is not None:
            await self.graphite.stop()
        self.descriptors.stop()
        self.store.close()
        self.collector.stop()

    def _restore(self) -> None:
        """Load retained messages and persistent sessions a previous run stored."""
        for message in self.store.load_retained():
            self.retained.update(message)
        queued = self.registry.restore()
        if self.registry or len(self.retained):
            log.info(
                "restored %d sessions (%d messages queued, read when their clients "
                "connect) and %d retained messages",
                len(self.registry),
                queued,
                len(self.retained),
            )

    def publish(self, message: Message) -> None:
        """Publish a message of the broker's own (the $SYS tree)."""
        self.ingress.publish_own(message)

    def _held(self) -> int:
        """Sessions, connections and metadata keys: what the node's tracked objects are
        for (the collector compares its frozen set with it)."""
        keys = self.peers.figures().get("swc_objects", 0)
        return len(self.registry) + len(self.connections) + keys

    def gauges(self) -> dict[str, float]:
        """Values read from the broker's state, under VerneMQ's names where it has one
        ($SYS, /metrics and the status page show them beside the counters)."""
        sessions = self.registry
        listeners = self.config.listeners
        connected = websocket = 0
        # Online sessions are found from the connections, not by a pass over every
        # session: $SYS reads this every systree_interval, and a node may hold millions
        # of offline sessions (a pass over 900,000 stalled the loop for seconds).
        online: set[Session] = set()
        for connection in self.connections:
            session = connection.session
            if session is not None:  # past CONNECT
                connected += 1
                websocket += listeners[connection.listener].type in ("ws", "wss")
                owner = session.owner  # (one of several: allow_multiple_sessions)
                if sessions.get(owner.subscriber_id) is owner and owner.online:
                    online.add(owner)
        return {
            "active_mqtt_connections": connected - websocket,  # tcp and ssl listeners
            "active_mqttws_connections": websocket,  # ws and wss listeners
            "total_active_connections": connected,
            "queue_processes": len(sessions),  # sessions, online and offline (one queue each)
            "sessions_offline": len(sessions) - len(online),
            "router_subscriptions": self.router.subscription_count,
            "retain_messages": len(self.retained),
            **self.collector.figures(),
            **self.peers.figures(),
        }

    def admit(self, connection: Connection) -> bool:
        """Whether the connection's listener has room for it (`max_connections`; its
        episodes are logged by the listener's ConnectionCap, broker/connection_cap.py)."""
        index = connection.listener
        if not self.caps[index].admits(self.listener_connections[index]):
            self.metrics.listener_connections_refused += 1
            return False
        self.listener_connections[index] += 1
        return True

    def closed(self, connection: Connection) -> None:
        """An admitted connection is gone: its place on the listener is free."""
        index = connection.listener
        self.listener_connections[index] -= 1
        self.caps[index].closed(self.listener_connections[index])

    def _connections_open(self) -> str:
        mqtt = sum(self.listener_connections) + len(self.awaiting_header)
        http = self.http.open_connections if self.http is not None else 0
        return f"connections open: {mqtt} MQTT, {http} HTTP"


def _listener_name(index: int, listener: ListenerSettings) -> str:
    return f"listeners[{index}] ({listener.type} on {listener.address})"
