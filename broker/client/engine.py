"""ClientEngine: one client's MQTT, without I/O.

Bytes in (`receive`), packets handled by the flows the host names (broker/client/handlers.py:
connect, publish, subscribe), answers out through the client's outlet. The engine owns
what one client is to the broker apart from its socket: the decoder, the ClientState, the
session, the hook flows that hold its packets, and its place in flow control (a publisher
is a `Reader`: `hold` stops handling its packets, `release` resumes them).

It touches no transport, no timer and no event loop: what it needs of them it asks of its
`Shell` (broker/connection.py is the asyncio one: reading paused or not, a hook flow run
as a task, a callback later, the keepalive watch, the close), so a unit test drives it
with bytes and a fake shell alone (tests/unit/test_client_engine.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker.client_state import AUTHENTICATING, CLOSING
from broker.outlet import Outlet
from broker.protocol import (
    MQTT5,
    Auth,
    ConnAck,
    ConnectReturnCode,
    Decoder,
    Disconnect,
    PingReq,
    PingResp,
    Property,
    Publish,
    ReasonCode,
    RemoteProtocolError,
    UnsupportedProtocolVersion,
    encode,
)
from broker.read_gate import HELD, HOOKS, THROTTLED, WRITING, YIELDED, ReadGate
from hooks import Chain, ClientContext, PublishContext

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.config import BrokerSettings, ListenerSettings
    from broker.enhanced_auth import AuthExchange
    from broker.hook_callers import HookCallers
    from broker.ingress import Ingress
    from broker.message import Message
    from broker.metrics import Metrics
    from broker.peers import ClientOwnership
    from broker.registry import Registry
    from broker.session import Session

log = logging.getLogger("nautilus.connection")

PINGRESP = encode(PingResp(), 4)  # the same bytes in every version
# Bounded work per loop turn: one read may hold thousands of packets (uvloop reads up to
# 256 KiB at once), and handling them all in one callback would keep every other client
# waiting (tens of milliseconds under a flood). After TURN_BUDGET seconds, checked every
# TURN_CHECK packets, the engine stops reading, lets the loop turn (flushes, other
# clients), and goes on with what it has buffered in the next turn.
TURN_BUDGET = 0.002
TURN_CHECK = 16
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
class PacketHandlers:
    """What an engine runs for each packet (the one set: broker/client/handlers.py), given
    by its services, so that the engine imports none of them: the function that handles
    each packet class, and the one that routes a PUBLISH postponed while it was held."""

    by_packet: Mapping[type, Callable[[ClientEngine, Any], None]]
    route_held: Callable[[ClientEngine, Publish, Message, PublishContext | None], None]


@dataclass(frozen=True, slots=True)
class ConnectTerms:
    """What the broker tells every client at CONNECT, worked out once from its settings."""

    max_packet_size: int  # the largest packet it takes (the decoder's bound)
    connack_properties: dict  # what an MQTT 5 client learns in CONNACK [3.2.2.3]


@dataclass(frozen=True, slots=True)
class Listener:
    """The listener a client came in through: its settings, and the address it is bound
    to (which hook contexts report)."""

    index: int  # in the broker's listeners
    settings: ListenerSettings
    address: tuple[str, int]


class ClientServices(Protocol):
    """What an engine and its packet flows are served by (the Broker provides it; a unit
    test assembles it from the real parts, tests/unit/test_client_engine.py): they never
    import broker/server.py."""

    @property
    def loop(self) -> Clock:
        """The broker's clock (broker/clock.py): no I/O is done through it."""
        ...

    handlers: PacketHandlers  # what handles each packet (a trace swaps them)
    settings: BrokerSettings
    terms: ConnectTerms
    metrics: Metrics
    chains: HookCallers  # the plugins' hooks
    ingress: Ingress  # its publishes' way into routing; flow control holds it
    registry: Registry  # its session and subscriptions

    @property
    def peers(self) -> ClientOwnership:
        """Its client id registered cluster-wide."""
        ...


class ClientOutlet(Outlet, Protocol):
    """Where an engine's answers go (broker/writer.py): a session's outlet, plus the
    acknowledgements that wait for the store, and the session it drains."""

    session: Session | None  # drained when the outlet has room again

    def acknowledge(self, data: bytes) -> None:
        """Write a PUBACK / PUBREC: a promise, kept back until the message is stored."""


class Flow(Protocol):
    """A hook flow under way (an asyncio.Task in broker/connection.py)."""

    def cancel(self) -> bool:
        """Stop it at its next await (False if it has ended)."""


class Shell(Protocol):
    """What an engine asks of the I/O around it (broker/connection.py)."""

    def read(self, wanted: bool) -> None:
        """Read from the client, or stop reading (flow control, hook flows, throttling)."""

    def spawn(self, flow: Coroutine[Any, Any, None]) -> Flow:
        """Run a hook flow; call the engine's `flow_done` when it ends (cancelled too)."""

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Call back at the clock's time `when`."""

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Call back after the handling under way."""

    def watch_keepalive(self, seconds: int) -> None:
        """CONNACK is on its way: the connect timeout ends; the client must send something
        every `seconds` from now on (0: no watch)."""

    def close_transport(self) -> None:
        """Write what is written, then close the socket (gracefully)."""


class Tap(Protocol):
    """A trace of this client (broker/trace/tap.py): what the engine reads, and what
    becomes of its connection. Untraced, the engine has none, and checks that once per
    read (never per packet)."""

    def received(self, data: bytes) -> None:
        """Bytes read from the client, before they are handled."""

    def event(self, text: str) -> None:
        """Something happened to the connection or its session."""

    def lost(self) -> None:
        """The socket is gone: the trace follows the client's next connection."""


class ClientEngine:
    __slots__ = (
        "_postponed",
        "_rate_count",
        "_rate_window_end",
        "auth_exchange",
        "awaiting_hooks",
        "client",
        "clock",
        "deciding",
        "decoder",
        "gate",
        "host",
        "listener",
        "outlet",
        "session",
        "shell",
        "tap",
        "writes_blocked",
    )

    def __init__(
        self,
        host: ClientServices,
        shell: Shell,
        outlet: ClientOutlet,
        clock: Callable[[], float],
        listener: Listener,
    ) -> None:
        self.host = host
        self.shell = shell
        self.outlet = outlet
        self.client = client = outlet.client  # shared with the outlet: its wire profile
        client.max_message_rate = host.settings.max_message_rate  # an auth plugin may change it
        self.clock = clock  # the loop's time: deadlines (broker/clock.py)
        self.listener = listener
        self.decoder = Decoder("server", max_packet_size=host.terms.max_packet_size)
        self.session: Session | None = None
        self.auth_exchange: AuthExchange | None = None  # MQTT 5 enhanced authentication
        # Whether the client is read now: flow control, hook flows, the rate limit, the
        # turn's budget and its writes each close it for their reason (broker/read_gate.py).
        self.gate = ReadGate(self)
        self.awaiting_hooks = 0  # hook decisions (e.g. a webhook's) holding further packets
        self.deciding: Flow | None = None  # the decide_later flow under way: see close()
        self.writes_blocked = False  # the transport's buffer is full: see writing()
        self.tap: Tap | None = None  # while the client is traced
        self._rate_count = 0
        self._rate_window_end = 0.0
        # A PUBLISH held back by flow control, routed first when released (postpone()).
        self._postponed: tuple[Publish, Message, PublishContext | None] | None = None

    def __repr__(self) -> str:
        return f"<ClientEngine {self.client.name()}>"

    @property
    def closing(self) -> bool:
        return self.client.phase == CLOSING

    # -- bytes in ----------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        if self.client.phase == CLOSING:
            return  # lingering: read and discard (see close)
        self.host.metrics.bytes_received += len(data)
        if self.tap is not None:
            self.tap.received(data)
        self.decoder.receive_data(data)
        if self.writes_blocked:  # it sends, and does not read what it is sent (writing)
            self.gate.close(WRITING)
        self.process()

    def process(self) -> None:
        """Handle every complete packet buffered, unless closed or paused meanwhile."""
        decoder = self.decoder
        client = self.client
        gate = self.gate
        handlers = self.host.handlers
        by_packet = handlers.by_packet
        try:
            postponed = self._postponed
            if postponed is not None and not (gate.holds(HELD) or client.phase == CLOSING):
                self._postponed = None  # routed first: this client's messages keep order
                handlers.route_held(self, *postponed)
            handled = 0
            started = 0.0
            while not (gate.closed or client.phase == CLOSING):
                packet = decoder.next_packet()
                if packet is None:
                    return
                if client.phase == AUTHENTICATING and type(packet) not in (Auth, Disconnect):
                    # Only AUTH or DISCONNECT until CONNACK [MQTT-4.12.0-4].
                    raise RemoteProtocolError("packet during authentication", 0x82)
                by_packet[type(packet)](self, packet)
                handled += 1
                if handled % TURN_CHECK == 0:
                    if not started:
                        started = self.clock()
                    elif self.clock() - started >= TURN_BUDGET:
                        self._yield_turn()
        except UnsupportedProtocolVersion as exc:
            log.info("%s: %s", client.name(), exc)
            # Answer in the 3.1.1 layout, which every client version can read.
            code = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
            self.outlet.write(encode(ConnAck(code), 4))
            self.host.metrics.connack_sent(code)
            self.close()
        except RemoteProtocolError as exc:  # the client's; a LocalProtocolError is ours
            self.host.metrics.mqtt_protocol_error += 1
            if exc.reason_code == ReasonCode.PACKET_TOO_LARGE:
                self.host.metrics.mqtt_invalid_msg_size_error += 1
            log.info("%s: protocol error: %s", client.name(), exc)
            self.close(exc.reason_code, str(exc))
        except Exception:
            # A bug of ours: this connection ends, the broker and everyone else go on.
            log.exception("%s: internal error; closing the connection", client.name())
            self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def on_pingreq(self, packet: PingReq) -> None:
        self.host.metrics.mqtt_pingreq_received += 1
        self.host.metrics.mqtt_pingresp_sent += 1
        self.outlet.write(PINGRESP)

    # -- the session -------------------------------------------------------------------

    def attach(self, session: Session, receive_maximum: int) -> None:
        """The session is this client's from now on (CONNACK is written)."""
        self.session = session
        self.outlet.session = session
        session.attach(self.outlet, receive_maximum)

    def connected(self) -> None:
        """CONNACK is on its way: the connect timeout ends, the keepalive watch begins."""
        self.shell.watch_keepalive(self.client.keepalive)

    def leave_session(self) -> None:
        """Hand the session back to the registry (offline, or ended), with our will."""
        session = self.session
        if session is None:
            return
        self.session = self.outlet.session = None
        will, self.client.will = self.client.will, None
        self.host.registry.disconnected(
            session, will, self.client.will_delay, self.client_context()
        )

    def take_over(self) -> None:
        """Another connection claimed this client id [MQTT-3.1.4-3]: close, and leave the
        session at once so that the new connection can attach to it."""
        if self.tap is not None:
            self.tap.event("session taken over by another connection")
        self.close(ReasonCode.SESSION_TAKEN_OVER)
        self.leave_session()

    def client_context(self) -> ClientContext:
        """This client as the client event hooks see it."""
        client = self.client
        return ClientContext(
            client_id=client.client_id,
            mountpoint=client.mountpoint,
            username=client.username,
            attributes=client.attributes,
            session_id=client.session_id,
            reason=client.disconnect_reason,
        )

    # -- the end -----------------------------------------------------------------------

    def close(self, reason_code: int | None = None, reason: str | None = None) -> None:
        """Close this connection; MQTT 5 clients past CONNECT are told why first (with
        `reason` as the Reason String, which DISCONNECT may always carry [MQTT-3.1.2-29])."""
        if self.closing:
            return
        client = self.client
        if not client.disconnect_reason:
            client.disconnect_reason = _disconnect_reason(reason_code)
        if self.tap is not None:
            self.tap.event(f"connection closing: {client.disconnect_reason}")
        if reason_code is not None and self.session is not None and client.protocol_level == MQTT5:
            self.host.metrics.mqtt_disconnect_sent += 1
            props: dict[int, Any] = {Property.REASON_STRING: reason} if reason else {}
            self.outlet.send(Disconnect(reason_code, props))
        self.shell.close_transport()  # what is written goes first
        client.advance(CLOSING)
        self._stop_deciding()
        self._leave()

    def lost(self) -> None:
        """The socket is gone (closed by us, or by the client without a word)."""
        if self.client.phase != CLOSING:
            self.client.advance(CLOSING)
        if not self.client.disconnect_reason:
            self.client.disconnect_reason = "tcp_closed"  # gone without a word
        self._stop_deciding()
        self._leave()
        if self.tap is not None:
            self.tap.lost()

    def _stop_deciding(self) -> None:
        """Cancel the decision under way: its verdict would be dropped (the client is
        gone), and work it has not started yet is then never done. A connect storm needs
        this: a password hash queued for a client that the connect timeout closed is
        skipped, not computed (the passwd plugin's pool, plugins/passwd/plugin.py)."""
        if self.deciding is not None:
            self.deciding.cancel()
            self.deciding = None

    def _leave(self) -> None:
        """This client is done: it waits for no subscriber, and its session goes back to
        the registry (idempotent: called at close and again when the socket is gone)."""
        self.host.ingress.forget(self)
        self.leave_session()

    # -- flow control: this client as a publisher --------------------------------------

    def postpone(self, packet: Publish, message: Message, context: PublishContext | None) -> None:
        """Keep a message whose subscriber is full, unacknowledged, until released (the
        client is held right after). If the connection ends first, the client sends it
        again: it was never acknowledged."""
        self._postponed = (packet, message, context)

    def hold(self) -> None:
        """Stop reading: a subscriber this client feeds has a full queue."""
        self.host.metrics.flow_publisher_held += 1
        self.gate.close(HELD)

    def release(self) -> None:
        """Read again: the subscribers it waited for have drained."""
        if self.gate.holds(HELD) and not self.closing:
            self.gate.open(HELD)
            self.shell.call_soon(self.process)  # packets that arrived before the hold

    def writing(self, taken: bool) -> None:
        """The client takes what we write (`taken`), or has stopped (the transport's
        buffer is full). One that sends while it does not take what it is sent is not
        read until it does (`receive`); one that sends nothing meanwhile (a subscriber at
        QoS 0) costs nothing: its reading is left alone."""
        self.writes_blocked = not taken
        if taken and self.gate.open(WRITING) and not self.closing:
            self.shell.call_soon(self.process)  # packets that arrived before

    def gate_turned(self, reading: bool) -> None:
        """The gate's answer changed: tell the shell (not once the connection closes: it
        reads and discards then, broker/connection.py)."""
        if not self.closing:
            self.shell.read(reading)

    def _yield_turn(self) -> None:
        """This turn's budget is spent (TURN_BUDGET): go on in the next one."""
        self.host.metrics.client_turns_yielded += 1
        self.gate.close(YIELDED)
        self.shell.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        if self.gate.holds(YIELDED) and not self.closing:
            self.gate.open(YIELDED)
            self.process()

    # -- hook flows that await ---------------------------------------------------------

    def decide_later(
        self, chain: Chain, context: Any, then: Callable[..., None], *args: Any
    ) -> None:
        """Run a deciding chain that awaits (some implementation is a coroutine) as a hook
        flow, then `then(*args, verdict)`. (A synchronous chain is run inline by the
        caller: `chain.run_sync`, the hot path.)"""
        self.deciding = self.spawn(self._decided(chain, context, then, args))

    async def _decided(
        self, chain: Chain, context: Any, then: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        try:
            verdict = await chain.run(context)
        finally:
            self.deciding = None  # nothing left to cancel; `then` may start the next one
        if not self.closing:
            then(*args, verdict)

    def spawn(self, flow: Coroutine[Any, Any, None]) -> Flow:
        """Run an awaiting hook flow; no further packet is handled until it is done, so
        this client's packets keep their order. (A flow may start the next one.)"""
        self.awaiting_hooks += 1
        self.gate.close(HOOKS)
        return self.shell.spawn(flow)

    def flow_done(self, error: BaseException | None, cancelled: bool = False) -> None:
        """A hook flow ended (`error`: what it raised)."""
        self.awaiting_hooks -= 1
        if not self.awaiting_hooks:
            self.gate.open(HOOKS)
        if cancelled:
            return
        if error is not None:
            log.error("%s: internal error in a hook flow", self.client.name(), exc_info=error)
            return self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
        if not self.closing:
            self.process()

    # -- max_message_rate ---------------------------------------------------------------

    def count_rate(self) -> None:
        """max_message_rate: after N PUBLISHes in a second, stop reading from this client
        until the second is over (VerneMQ throttles the socket the same way)."""
        now = self.clock()
        if now >= self._rate_window_end:
            self._rate_window_end = now + 1.0
            self._rate_count = 0
        self._rate_count += 1
        if self._rate_count >= self.client.max_message_rate:
            self.host.metrics.client_publish_throttled += 1
            self.gate.close(THROTTLED)
            self.shell.call_at(self._rate_window_end, self._end_throttle)

    def _end_throttle(self) -> None:
        if self.gate.holds(THROTTLED) and not self.closing:
            self.gate.open(THROTTLED)
            self.process()


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
