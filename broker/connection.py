"""One client connection: bytes <-> codec <-> session, timers, and write batching.

Theory of operation: `data_received` feeds the decoder and handles every complete packet
synchronously; nothing on this path awaits. Outgoing bytes are appended to a list and
flushed with one `writelines` per event-loop turn, so a burst of deliveries costs one
system call. When the transport's buffer passes its high-water mark, `writable` turns
false and deliveries wait in the session's bounded queue until `resume_writing`.

A connection is both ends of flow control (broker/flow.py): as a subscriber's `Outlet`
it is `writable` while its transport is not paused and its unflushed bytes stay under
OUT_HIGH_WATER (beyond that, deliveries wait in the session's queue); as a publisher's
`Reader` it stops parsing packets at once when held (the rest stay in the decoder's
buffer) and pauses its transport, so a flood slows to the pace of its readers.

Timers are `loop.call_later` handles: a connect timeout until CONNECT arrives, then one
keepalive timer that re-arms itself for the time left instead of being reset per packet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker.client import AUTHENTICATING, CLOSING, ClientState
from broker.enhanced_auth import AuthExchange
from broker.message import Message
from broker.protocol import (
    Auth,
    ConnAck,
    ConnectReturnCode,
    Decoder,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Property,
    Publish,
    ReasonCode,
    RemoteProtocolError,
    UnsupportedProtocolVersion,
    encode,
)
from broker.tls import common_name
from hooks import Chain, ClientContext, PublishContext

if TYPE_CHECKING:
    from broker.config import BrokerSettings, Config
    from broker.flow import FlowControl
    from broker.hook_callers import HookCallers
    from broker.metrics import Metrics
    from broker.peers import Peers
    from broker.registry import Registry
    from broker.routing import Routing
    from broker.session import Session
    from broker.store import MessageStore

log = logging.getLogger("nautilus.connection")

MQTT5 = 5
PINGRESP = encode(PingResp(), 4)  # the same bytes in every version
OUT_HIGH_WATER = 256 * 1024  # unflushed bytes after which deliveries wait in the queue
LINGER = 1.0  # seconds a connection we close keeps reading (and discarding) before it goes
_PROBLEM_INFO = frozenset({Property.REASON_STRING, Property.USER_PROPERTY})
# Why a connection ended, as events report it: Courier's names where it has one.
_DISCONNECT_REASONS: dict[int, str] = {
    ReasonCode.SESSION_TAKEN_OVER: "session_taken_over",
    ReasonCode.KEEP_ALIVE_TIMEOUT: "disconnect_keep_alive",
    ReasonCode.NOT_AUTHORIZED: "not_authorized",
    ReasonCode.PROTOCOL_ERROR: "protocol_error",
    ReasonCode.MALFORMED_PACKET: "protocol_error",
    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED: "receive_max_exceeded",
    ReasonCode.ADMINISTRATIVE_ACTION: "administrative_action",
    ReasonCode.BAD_AUTHENTICATION_METHOD: "bad_authentication_method",
}


@dataclass(frozen=True, slots=True)
class Flows:
    """The packet flows a connection runs (the one set: broker/packet_flows.py), given to
    it by the broker, so that this shell imports none of them: the function that handles
    each packet class, and the one that routes a PUBLISH postponed while it was held."""

    handlers: Mapping[type, Callable[[Connection, Any], None]]
    route_held: Callable[[Connection, Publish, Message, PublishContext | None], None]


class Host(Protocol):
    """What a connection and its packet flows (connect_flow, publish_flow, subscriptions)
    use of the broker: the Broker provides it, and they never import broker/server.py."""

    flows: Flows  # what handles each packet

    config: Config  # its listener's settings
    settings: BrokerSettings
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    chains: HookCallers  # the plugins' hooks
    store: MessageStore  # a QoS 1/2 publish is committed before it is acknowledged
    flow: FlowControl
    registry: Registry  # the client's session
    routing: Routing  # its publishes
    peers: Peers  # its client id registered cluster-wide
    connections: set[Connection]  # open, past admission
    tasks: set[asyncio.Task]  # hook flows: cancelled at stop
    before_ack: list[Callable[[], bool]]  # plugins that keep a message before its ack
    max_packet_size: int
    connack_properties: dict  # what an MQTT 5 client learns in CONNACK
    listening: list[tuple[str, int]]  # each listener's address

    def admit(self, connection: Connection) -> bool:
        """Whether the connection's listener has room (max_connections)."""
        ...

    def closed(self, connection: Connection) -> None:
        """An admitted connection is gone: its place on the listener is free."""
        ...


class Connection(asyncio.Protocol):
    __slots__ = (
        "_acked",
        "_out",
        "_out_bytes",
        "_postponed",
        "_rate_count",
        "_rate_window_end",
        "_timer",
        "_tls",
        "_transport_paused",
        "_write_paused",
        "auth_exchange",
        "awaiting_hooks",
        "broker",
        "client",
        "decoder",
        "last_seen",
        "listener",
        "loop",
        "reading_paused",
        "session",
        "throttled",
        "transport",
        "writable",
    )

    def __init__(self, broker: Host, listener: int = 0) -> None:
        self.broker = broker
        self.listener = listener  # index into the broker's listeners
        self.loop = broker.loop
        self.client = ClientState(max_message_rate=broker.settings.max_message_rate)
        self.decoder = Decoder("server", max_packet_size=broker.max_packet_size)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.session: Session | None = None
        self.last_seen = 0.0
        self.writable = True  # Outlet: room for deliveries (see OUT_HIGH_WATER)
        self._write_paused = False  # the transport's buffer is above its high-water mark
        self.reading_paused = False  # held by flow control: a subscriber we feed is full
        self.awaiting_hooks = 0  # hook decisions (e.g. a webhook's) holding further packets
        self._transport_paused = False
        self.throttled = False  # max_message_rate reached for this second
        self._rate_count = 0
        self._rate_window_end = 0.0
        self.auth_exchange: AuthExchange | None = None  # MQTT 5 enhanced authentication
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._acked = False  # PUBACK / PUBREC written since the last flush (store promises)
        # A PUBLISH held back by flow control, routed first when released (postpone()).
        self._postponed: tuple[Publish, Message, PublishContext | None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tls = False  # the transport encrypts (see _flush)

    @property
    def closing(self) -> bool:
        return self.client.phase == CLOSING

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client.peer = transport.get_extra_info("peername") or ("?", 0)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:
            self._tls = True
            self._tls_client(tls)
        self.broker.metrics.socket_open += 1
        if not self.broker.admit(self):
            self.client.advance(CLOSING)  # over the listener's max_connections: not read
            transport.close()
            return
        self.broker.connections.add(self)
        self._timer = self.loop.call_later(self.broker.settings.connect_timeout, self._no_connect)

    def _tls_client(self, tls: Any) -> None:
        """The client certificate, if it showed one (the handshake verified it)."""
        self.client.certificate = tls.getpeercert(binary_form=True)
        if self.broker.config.listeners[self.listener].use_identity_as_username:
            self.client.identity = common_name(tls.getpeercert() or {})

    def use_peer(self, peer: tuple[str, int]) -> None:
        """The client's address as a PROXY header gave it (broker/proxy_protocol.py)."""
        self.client.peer = peer

    def data_received(self, data: bytes) -> None:
        if self.client.phase == CLOSING:
            return  # lingering: read and discard (see close)
        self.last_seen = self.loop.time()
        self.broker.metrics.bytes_received += len(data)
        self.decoder.receive_data(data)
        self._process()

    def _process(self) -> None:
        """Handle every complete packet buffered, unless closed or paused meanwhile."""
        decoder = self.decoder
        client = self.client
        handlers = self.broker.flows.handlers
        try:
            postponed = self._postponed
            if postponed is not None and not (self.reading_paused or client.phase == CLOSING):
                self._postponed = None  # routed first: this client's messages keep order
                self.broker.flows.route_held(self, *postponed)
            while not (
                client.phase == CLOSING
                or self.reading_paused
                or self.awaiting_hooks
                or self.throttled
            ):
                packet = decoder.next_packet()
                if packet is None:
                    return
                if client.phase == AUTHENTICATING and type(packet) not in (Auth, Disconnect):
                    # Only AUTH or DISCONNECT until CONNACK [MQTT-4.12.0-4].
                    raise RemoteProtocolError("packet during authentication", 0x82)
                handlers[type(packet)](self, packet)
        except UnsupportedProtocolVersion as exc:
            log.info("%s: %s", self.client.name(), exc)
            # Answer in the 3.1.1 layout, which every client version can read.
            code = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
            self.transport.write(encode(ConnAck(code), 4))
            self.broker.metrics.connack_sent(code)
            self.close()
        except RemoteProtocolError as exc:  # the client's; a LocalProtocolError is ours
            self.broker.metrics.mqtt_protocol_error += 1
            if exc.reason_code == ReasonCode.PACKET_TOO_LARGE:
                self.broker.metrics.mqtt_invalid_msg_size_error += 1
            log.info("%s: protocol error: %s", self.client.name(), exc)
            self.close(exc.reason_code, str(exc))
        except Exception:
            # A bug of ours: this connection ends, the broker and everyone else go on.
            log.exception("%s: internal error; closing the connection", self.client.name())
            self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        if self not in self.broker.connections:
            return  # refused at connection_made
        if self.client.phase != CLOSING:
            self.client.advance(CLOSING)
        if not self.client.disconnect_reason:
            self.client.disconnect_reason = "tcp_closed"  # gone without a word
        if self._timer is not None:
            self._timer.cancel()
        self.broker.connections.discard(self)
        self.broker.closed(self)
        self.broker.metrics.socket_close += 1
        self._out.clear()
        self._leave()

    def _leave(self) -> None:
        """This client is done: it waits for no subscriber, and its session goes back to
        the registry (idempotent: called at close and again when the socket is gone)."""
        self.broker.flow.forget_publisher(self)
        self.leave_session()

    def leave_session(self) -> None:
        """Hand the session back to the registry (offline, or ended), with our will."""
        session = self.session
        if session is None:
            return
        self.session = None
        will, self.client.will = self.client.will, None
        self.broker.registry.disconnected(
            session, will, self.client.will_delay, self.client_context()
        )

    def take_over(self) -> None:
        """Another connection claimed this client id [MQTT-3.1.4-3]: close, and leave the
        session at once so that the new connection can attach to it."""
        self.close(ReasonCode.SESSION_TAKEN_OVER)
        self.leave_session()

    def pause_writing(self) -> None:
        self._write_paused = True
        self.writable = False

    def resume_writing(self) -> None:
        self._write_paused = False
        self.writable = self._out_bytes < OUT_HIGH_WATER
        if self.session is not None:
            self.session.drain()

    # -- flow control: this connection as a publisher ---------------------------------

    def postpone(self, packet: Publish, message: Message, context: PublishContext | None) -> None:
        """Keep a message whose subscriber is full, unacknowledged, until released (the
        connection is held right after). If the connection ends first, the client sends
        it again: it was never acknowledged."""
        self._postponed = (packet, message, context)

    def hold(self) -> None:
        """Stop reading: a subscriber this client feeds has a full queue."""
        self.broker.metrics.flow_publisher_held += 1
        self.reading_paused = True
        self._update_reading()

    def release(self) -> None:
        """Read again: the subscribers it waited for have drained."""
        if self.reading_paused and not self.closing:
            self.reading_paused = False
            self._update_reading()
            self.loop.call_soon(self._process)  # packets that arrived before the hold

    # -- writing -----------------------------------------------------------------------

    def acknowledge(self, data: bytes) -> None:
        """Write a PUBACK / PUBREC: a promise that the message is stored (see _flush)."""
        self._acked = True
        self.write(data)

    def write(self, data: bytes) -> None:
        out = self._out
        if not out:
            self.loop.call_soon(self._flush)
        out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= OUT_HIGH_WATER:
            self.writable = False  # what comes next waits in the session's queue

    def send(self, packet: Packet) -> None:
        data = encode(packet, self.client.protocol_level)
        limit = self.client.max_packet_out
        if limit and len(data) > limit:
            data = self._without_problem_info(packet, data)
        self.write(data)

    def _without_problem_info(self, packet: Packet, data: bytes) -> bytes:
        """A packet over the client's Maximum Packet Size loses its Reason String and User
        Properties, the parts the standard lets us leave out [MQTT-3.2.2-19/20, 3.4.2-2/3,
        3.14.2-3/4 and alike]. (PUBLISHes over the limit are dropped by the session.)"""
        props = getattr(packet, "properties", None)
        if not props or not (props.keys() & _PROBLEM_INFO):
            return data
        kept = {key: value for key, value in props.items() if key not in _PROBLEM_INFO}
        slimmer = dataclasses.replace(packet, properties=kept)  # type: ignore[arg-type]
        return encode(slimmer, self.client.protocol_level)

    def _flush(self) -> None:
        out = self._out
        if out and not self.closing:
            store = self.broker.store
            store.commit()  # a PUBACK goes out only after what it acknowledges is stored
            if self._acked and (store.failed or not self._plugins_kept()):
                # Not written (a full disk): acknowledge nothing; the client resends what
                # it has not seen acknowledged.
                self._out = []
                self._out_bytes = 0
                self.transport.abort()
                return
            if self._tls:
                # One TLS record for the turn's packets: the TLS transport would make a
                # record (and an encryption call) of each item of a list.
                self.transport.write(b"".join(out))
            else:
                self.transport.writelines(out)  # one writev
            self.broker.metrics.bytes_sent += self._out_bytes
        self._out = []
        self._out_bytes = 0
        self._acked = False
        self.writable = not self._write_paused
        session = self.session
        if session is not None and self.writable:
            queue = session.queue
            if queue.memory or session.held or queue.on_disk:
                session.drain()  # the next step of a long queue, one step per loop turn

    def _plugins_kept(self) -> bool:
        """Plugins that must keep something before an acknowledgement (the event relay
        with acknowledged durability) have kept it."""
        for before_ack in self.broker.before_ack:
            if not before_ack():
                self.broker.metrics.store_publish_refused += 1
                return False
        return True

    def close(self, reason_code: int | None = None, reason: str | None = None) -> None:
        """Close this connection; MQTT 5 clients past CONNECT are told why first (with
        `reason` as the Reason String, which DISCONNECT may always carry [MQTT-3.1.2-29])."""
        if self.closing:
            return
        if not self.client.disconnect_reason:
            self.client.disconnect_reason = _disconnect_reason(reason_code)
        if (
            reason_code is not None
            and self.session is not None
            and self.client.protocol_level == MQTT5
        ):
            self.broker.metrics.mqtt_disconnect_sent += 1
            self.send(Disconnect(reason_code, {Property.REASON_STRING: reason} if reason else {}))
        self._flush()
        self.client.advance(CLOSING)
        self._leave()
        self._linger()

    def _linger(self) -> None:
        """Close gracefully: stop writing (FIN after what we sent), but keep reading and
        discarding for up to LINGER seconds. Closing a socket with unread bytes makes the
        kernel answer with a reset, and a client still in the middle of an exchange would
        then fail on a broken pipe instead of reading our last packet (a DISCONNECT with
        its reason, a refusing CONNACK). The client's own close (EOF) ends the wait early."""
        transport = self.transport
        if self._timer is not None:
            self._timer.cancel()
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already
            transport.close()
            return
        if self._transport_paused:
            transport.resume_reading()
        self._timer = self.loop.call_later(LINGER, transport.close)

    # -- timers ------------------------------------------------------------------------

    def _no_connect(self) -> None:
        log.info(
            "%s: no CONNECT within %ss", self.client.name(), self.broker.settings.connect_timeout
        )
        self.close()

    def connected(self) -> None:
        """CONNACK is on its way: the connect timeout ends, the keepalive watch begins."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.client.keepalive:
            self.last_seen = self.loop.time()
            self._timer = self.loop.call_later(self.client.keepalive * 1.5, self._check_keepalive)

    def client_context(self) -> ClientContext:
        """This client as the client event hooks see it."""
        client = self.client
        return ClientContext(
            client_id=client.client_id,
            username=client.username,
            attributes=client.attributes,
            session_id=client.session_id,
            reason=client.disconnect_reason,
        )

    def _check_keepalive(self) -> None:
        # The client must send something every keepalive seconds; we allow 1.5x [MQTT-3.1.2-22].
        if self._transport_paused:  # we stopped reading it: its silence is ours
            self.last_seen = self.loop.time()
        deadline = self.last_seen + self.client.keepalive * 1.5
        remaining = deadline - self.loop.time()
        if remaining > 0:
            self._timer = self.loop.call_later(remaining, self._check_keepalive)
            return
        self.broker.metrics.client_keepalive_expired += 1
        log.info("%s: keepalive expired", self.client.name())
        self.close(ReasonCode.KEEP_ALIVE_TIMEOUT)

    # -- hook flows that await ---------------------------------------------------------

    def decide(self, chain: Chain, context: Any, then: Callable[..., None], *args: Any) -> None:
        """Run a deciding (all_till_ok) chain and call `then(*args, verdict)`: inline when
        every implementation is a plain method (no task, no coroutine: the hot path),
        otherwise as a hook flow holding this client's further packets until it is done."""
        if chain.synchronous:
            then(*args, chain.run_sync(context))
        else:
            self.spawn(self._decide_later(chain, context, then, args))

    async def _decide_later(
        self, chain: Chain, context: Any, then: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        verdict = await chain.run(context)
        if not self.closing:
            then(*args, verdict)

    def spawn(self, flow: Coroutine[Any, Any, None]) -> None:
        """Run an awaiting hook flow; no further packet is handled until it is done, so
        this client's packets keep their order. (A flow may start the next one.)"""
        self.awaiting_hooks += 1
        self._update_reading()
        task = asyncio.ensure_future(flow)
        self.broker.tasks.add(task)
        task.add_done_callback(self._flow_done)

    def _flow_done(self, task: asyncio.Task[None]) -> None:
        self.broker.tasks.discard(task)
        self.awaiting_hooks -= 1
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error(
                "%s: internal error in a hook flow", self.client.name(), exc_info=task.exception()
            )
            return self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
        if not self.closing:
            self._update_reading()
            self._process()

    def _update_reading(self) -> None:
        """Pause the transport while back-pressure or a hook flow holds this client."""
        if self.closing:
            return
        paused = self.reading_paused or self.awaiting_hooks > 0 or self.throttled
        if paused != self._transport_paused:
            self._transport_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # -- max_message_rate ---------------------------------------------------------------

    def count_rate(self) -> None:
        """max_message_rate: after N PUBLISHes in a second, stop reading from this client
        until the second is over (VerneMQ throttles the socket the same way)."""
        now = self.loop.time()
        if now >= self._rate_window_end:
            self._rate_window_end = now + 1.0
            self._rate_count = 0
        self._rate_count += 1
        if self._rate_count >= self.client.max_message_rate:
            self.broker.metrics.client_publish_throttled += 1
            self.throttled = True
            self._update_reading()
            self.loop.call_at(self._rate_window_end, self._end_throttle)

    def _end_throttle(self) -> None:
        if self.throttled and not self.closing:
            self.throttled = False
            self._update_reading()
            self._process()

    def on_pingreq(self, packet: PingReq) -> None:
        self.broker.metrics.mqtt_pingreq_received += 1
        self.broker.metrics.mqtt_pingresp_sent += 1
        self.write(PINGRESP)


def _disconnect_reason(reason_code: int | None) -> str:
    """The disconnect reason of a connection the broker closes (with this MQTT 5 code)."""
    if reason_code is None:
        return "normal"
    known = _DISCONNECT_REASONS.get(reason_code)
    if known is not None:
        return known
    try:
        return ReasonCode(reason_code).name.lower()
    except ValueError:
        return f"reason_code_{reason_code:#04x}"
