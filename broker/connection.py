"""Connection: the asyncio shell around one client's engine.

The MQTT of a client is its engine's (broker/client/engine.py), which does no I/O; its
outgoing bytes are its writer's (broker/writer.py), batched per loop turn. What is left
here needs the event loop: the transport (bytes in to the engine; reading paused and
resumed for it; the graceful close), the timers (connect timeout, keepalive, the engine's
calls later), the hook flows run as tasks, and the listener's admission.

Timers: a `loop.call_later` handle for the connect timeout until CONNECT arrives (and for
the linger of a close); then the keepalive, watched by the broker's one KeepaliveWatch
(broker/keepalive.py), which checks the time left when it is due instead of being reset
per packet.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.client.engine import ClientEngine, Listener
from broker.client_state import CLOSING, ClientState
from broker.keepalive import Bucket, KeepaliveWatch
from broker.protocol import ReasonCode
from broker.tls import common_name
from broker.writer import Writer

if TYPE_CHECKING:
    from broker.client.engine import ClientServices
    from broker.config import BrokerSettings, Config
    from broker.metrics import Metrics
    from broker.session import Session
    from broker.writer import WriteSupport

log = logging.getLogger("nautilus.connection")

LINGER = 1.0  # seconds a connection we close keeps reading (and discarding) before it goes


class Listeners(Protocol):
    """What a connection uses of the broker's listeners: their settings, their admission
    and the connections open (the Broker provides it)."""

    loop: asyncio.AbstractEventLoop
    config: Config  # each listener's settings
    listening: list[tuple[str, int]]  # each listener's address
    settings: BrokerSettings  # connect_timeout
    metrics: Metrics
    connections: set[Connection]  # open, past admission
    tasks: set[asyncio.Task]  # hook flows: cancelled at stop

    def admit(self, connection: Connection) -> bool:
        """Whether the connection's listener has room (max_connections)."""
        ...

    def closed(self, connection: Connection) -> None:
        """An admitted connection is gone: its place on the listener is free."""
        ...


@dataclass(frozen=True, slots=True)
class ConnectionPorts:
    """The broker as each part of a connection sees it: the listeners (the connection
    itself), what its engine is served by, what its writer needs. Made once by the
    Broker (which is all three) and shared by every connection, with what would cost an
    idle connection memory if each made its own: the loop's clock (a bound method), the
    keepalive watch (one timer, broker/keepalive.py), and each listener as its clients
    came in through it."""

    listeners: Listeners
    client: ClientServices
    writing: WriteSupport
    clock: Callable[[], float] = field(init=False)
    keepalive: KeepaliveWatch = field(init=False)
    _came_in: dict[int, Listener] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clock", self.listeners.loop.time)
        object.__setattr__(self, "keepalive", KeepaliveWatch(self.listeners.loop))

    def came_in(self, index: int) -> Listener:
        """Listener `index` as its clients see it (one object for all of them)."""
        host = self.listeners
        settings, address = host.config.listeners[index], host.listening[index]
        known = self._came_in.get(index)
        if known is None or known.settings is not settings or known.address != address:
            known = self._came_in[index] = Listener(index, settings, address)  # (restarted)
        return known


class Connection(asyncio.Protocol):
    __slots__ = (
        "_keepalive",
        "_reading",
        "_timer",
        "connected_at",
        "engine",
        "last_seen",
        "listener",
        "loop",
        "ports",
        "transport",
        "writer",
    )

    def __init__(self, ports: ConnectionPorts, listener: int = 0) -> None:
        self.ports = ports
        host = ports.listeners
        self.listener = listener  # index into the broker's listeners
        self.loop = host.loop
        self.writer = Writer(ports.writing, ClientState(), self)
        came_in = ports.came_in(listener)
        self.engine = ClientEngine(ports.client, self, self.writer, ports.clock, came_in)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.last_seen = 0.0
        self.connected_at = int(time.time())  # unix seconds: session show's session_started_at
        self._reading = True  # the transport is read (not paused for the engine)
        self._timer: asyncio.TimerHandle | None = None  # connect timeout, linger
        self._keepalive: Bucket | None = None  # where the keepalive watch has it

    @property
    def host(self) -> Listeners:
        return self.ports.listeners

    # What the rest of the broker (admin, $SYS, shutdown) sees of the client.

    @property
    def client(self) -> ClientState:
        return self.engine.client

    @property
    def session(self) -> Session | None:
        return self.engine.session

    def close(self, reason_code: int | None = None) -> None:
        """Close the client's connection (MQTT 5 clients are told `reason_code`)."""
        self.engine.close(reason_code)

    def take_over(self) -> None:
        """Another connection claimed this client id (the writer is asked: the registry
        sees the session's outlet)."""
        self.engine.take_over()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.writer.transport = transport  # type: ignore[assignment]
        client = self.engine.client
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and isinstance(peer[0], str):
            peer = (sys.intern(peer[0]), peer[1])  # one string per address, not per connection
        client.peer = peer or ("?", 0)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:
            self.writer.tls = True
            client.certificate = tls.getpeercert(binary_form=True)  # if it showed one
            if self.host.config.listeners[self.listener].use_identity_as_username:
                client.identity = common_name(tls.getpeercert() or {})
        self.host.metrics.socket_open += 1
        if not self.host.admit(self):
            client.advance(CLOSING)  # over the listener's max_connections: not read
            transport.close()
            return
        self.host.connections.add(self)
        self._timer = self.loop.call_later(self.host.settings.connect_timeout, self._no_connect)

    def use_peer(self, peer: tuple[str, int]) -> None:
        """The client's address as a PROXY header gave it (broker/proxy_protocol.py)."""
        self.engine.client.peer = peer

    def data_received(self, data: bytes) -> None:
        self.last_seen = self.loop.time()
        self.engine.receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self not in self.host.connections:
            return  # refused at connection_made
        if self._timer is not None:
            self._timer.cancel()
        self._unwatch()
        self.host.connections.discard(self)
        self.host.closed(self)
        self.host.metrics.socket_close += 1
        self.writer.shut = True
        self.writer.discard()
        self.engine.lost()

    def pause_writing(self) -> None:
        self.writer.pause()
        self.engine.writing(False)

    def resume_writing(self) -> None:
        self.writer.resume()
        self.engine.writing(True)

    # -- Shell: what the engine asks of the I/O ----------------------------------------

    def read(self, wanted: bool) -> None:
        if wanted != self._reading:
            self._reading = wanted
            if wanted:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def spawn(self, flow: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(flow)
        self.host.tasks.add(task)
        task.add_done_callback(self._flow_done)
        return task

    def _flow_done(self, task: asyncio.Task[None]) -> None:
        self.host.tasks.discard(task)
        if task.cancelled():
            self.engine.flow_done(None, cancelled=True)
        else:
            self.engine.flow_done(task.exception())

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self.loop.call_at(when, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def watch_keepalive(self, seconds: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if seconds:
            self.last_seen = self.loop.time()
            self._keepalive = self.ports.keepalive.watch(self, self.last_seen + seconds * 1.5)

    def _unwatch(self) -> None:
        if self._keepalive is not None:
            self.ports.keepalive.forget(self, self._keepalive)
            self._keepalive = None

    def close_transport(self) -> None:
        """Close gracefully: write what is written, then stop writing (FIN), but keep
        reading and discarding for up to LINGER seconds. Closing a socket with unread
        bytes makes the kernel answer with a reset, and a client still in the middle of an
        exchange would then fail on a broken pipe instead of reading our last packet (a
        DISCONNECT with its reason, a refusing CONNACK). The client's own close (EOF) ends
        the wait early."""
        self.writer.flush()
        self.writer.shut = True
        transport = self.transport
        if self._timer is not None:
            self._timer.cancel()
        self._unwatch()
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already
            transport.close()
            return
        if not self._reading:
            transport.resume_reading()
        self._timer = self.loop.call_later(LINGER, transport.close)

    # -- timers ------------------------------------------------------------------------

    def _no_connect(self) -> None:
        log.info(
            "%s: no CONNECT within %ss",
            self.engine.client.name(),
            self.host.settings.connect_timeout,
        )
        self.engine.close()

    def keepalive_due(self) -> None:
        # The client must send something every keepalive seconds; we allow 1.5x [MQTT-3.1.2-22].
        keepalive = self.engine.client.keepalive
        if not self._reading:  # we stopped reading it: its silence is ours
            self.last_seen = self.loop.time()
        deadline = self.last_seen + keepalive * 1.5
        if deadline > self.loop.time():
            self._keepalive = self.ports.keepalive.watch(self, deadline)
            return
        self._keepalive = None
        self.host.metrics.client_keepalive_expired += 1
        log.info("%s: keepalive expired", self.engine.client.name())
        self.engine.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
