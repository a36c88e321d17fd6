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
from typing import TYPE_CHECKING

from broker.authorization import (
    apply_publish_modifiers,
    publish_refusal,
    refusal_properties,
)
from broker.connect_flow import NEVER_EXPIRES, ConnectHandling
from broker.enhanced_auth import AuthExchange
from broker.message import Message, TopicAliases
from broker.protocol import (
    V3_CONNACK_CODE,
    Auth,
    ConnAck,
    Connect,
    ConnectReturnCode,
    Decoder,
    Disconnect,
    Packet,
    PingReq,
    Property,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    RemoteProtocolError,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocolVersion,
    Will,
    encode,
)
from broker.subscriptions import SubscriptionHandling
from broker.topics import valid_topic_name
from hooks import (
    Chain,
    Ok,
    PublishContext,
)

if TYPE_CHECKING:
    from broker.server import Broker
    from broker.session import Session

log = logging.getLogger("nautilus.connection")

MQTT5 = 5
PINGRESP = b"\xd0\x00"
OUT_HIGH_WATER = 64 * 1024  # unflushed bytes after which deliveries wait in the queue
LINGER = 1.0  # seconds a connection we close keeps reading (and discarding) before it goes
_PROBLEM_INFO = frozenset({Property.REASON_STRING, Property.USER_PROPERTY})


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Connection(ConnectHandling, SubscriptionHandling, asyncio.Protocol):
    __slots__ = (
        "_closing",
        "_connecting",
        "_out",
        "_out_bytes",
        "_rate_count",
        "_rate_window_end",
        "_timer",
        "_transport_paused",
        "_write_paused",
        "aliases_in",
        "aliases_out",
        "attributes",
        "auth_exchange",
        "broker",
        "busy",
        "client_id",
        "decoder",
        "keepalive",
        "last_seen",
        "listener",
        "loop",
        "max_message_rate",
        "max_packet_out",
        "peer",
        "problem_info",
        "protocol_level",
        "reading_paused",
        "session",
        "throttled",
        "transport",
        "username",
        "will",
        "will_delay",
        "writable",
    )

    def __init__(self, broker: Broker, listener: int = 0) -> None:
        self.broker = broker
        self.listener = listener  # index into the broker's listeners
        self.loop = broker.loop
        self.decoder = Decoder("server", max_packet_size=broker.max_packet_size)
        self.transport: asyncio.Transport | None = None
        self.protocol_level = 4
        self.session: Session | None = None
        self.client_id: str | None = None
        self.keepalive = 0
        self.last_seen = 0.0
        self.peer = ("?", 0)
        self.will: Message | None = None
        self.will_delay = 0
        self.writable = True  # Outlet: room for deliveries (see OUT_HIGH_WATER)
        self._write_paused = False  # the transport's buffer is above its high-water mark
        self.reading_paused = False  # held by flow control: a subscriber we feed is full
        self.busy = 0  # awaiting hook flows (e.g. a webhook) holding further packets
        self._transport_paused = False
        self.max_message_rate = broker.settings.max_message_rate  # PUBLISHes per second
        self.throttled = False
        self._rate_count = 0
        self._rate_window_end = 0.0
        self.username: str | None = None
        self.max_packet_out = 0  # the MQTT 5 client's Maximum Packet Size; 0: no limit
        self.problem_info = True  # may acknowledgements carry Reason Strings [3.1.2.11.7]
        self.aliases_in: dict[int, str] = {}  # Topic Aliases the client set
        self.aliases_out: TopicAliases | None = None  # ours towards the client, if any
        self.auth_exchange: AuthExchange | None = None  # MQTT 5 enhanced authentication
        self._connecting: tuple | None = None  # (CONNECT, assigned id) during the exchange
        self.attributes: dict = {}  # shared by the plugins for this connection
        self._closing = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        self.broker.metrics.socket_open += 1
        if not self.broker.admit(self):
            self._closing = True  # over the listener's max_connections: not even read
            transport.close()
            return
        self.broker.connections.add(self)
        self._timer = self.loop.call_later(self.broker.settings.connect_timeout, self._no_connect)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # lingering: read and discard (see close)
        self.last_seen = self.loop.time()
        self.broker.metrics.bytes_received += len(data)
        self.decoder.receive_data(data)
        self._process()

    def _process(self) -> None:
        """Handle every complete packet buffered, unless closed or paused meanwhile."""
        decoder = self.decoder
        try:
            while not (self._closing or self.reading_paused or self.busy or self.throttled):
                packet = decoder.next_packet()
                if packet is None:
                    return
                if self._connecting is not None and type(packet) not in (Auth, Disconnect):
                    # Only AUTH or DISCONNECT until CONNACK [MQTT-4.12.0-4].
                    raise RemoteProtocolError("packet during authentication", 0x82)
                self._handlers[type(packet)](self, packet)
        except UnsupportedProtocolVersion as exc:
            log.info("%s: %s", self._name(), exc)
            # Answer in the 3.1.1 layout, which every client version can read.
            code = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
            self.transport.write(b"\x20\x02\x00" + bytes((code,)))
            self.broker.metrics.connack_sent(code)
            self.close()
        except ProtocolError as exc:
            self.broker.metrics.mqtt_protocol_error += 1
            if exc.reason_code == ReasonCode.PACKET_TOO_LARGE:
                self.broker.metrics.mqtt_invalid_msg_size_error += 1
            log.info("%s: protocol error: %s", self._name(), exc)
            self.close(exc.reason_code, str(exc))
        except Exception:
            # A bug of ours: this connection ends, the broker and everyone else go on.
            log.exception("%s: internal error; closing the connection", self._name())
            self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        if self not in self.broker.connections:
            return  # refused at connection_made
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        self.broker.connections.discard(self)
        self.broker.listener_connections[self.listener] -= 1
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
        will, self.will = self.will, None
        self.broker.registry.release(session, will, self.will_delay, self._client_context())

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

    def hold(self) -> None:
        """Stop reading: a subscriber this client feeds has a full queue."""
        self.broker.metrics.flow_publisher_held += 1
        self.reading_paused = True
        self._update_reading()

    def release(self) -> None:
        """Read again: the subscribers it waited for have drained."""
        if self.reading_paused and not self._closing:
            self.reading_paused = False
            self._update_reading()
            self.loop.call_soon(self._process)  # packets that arrived before the hold

    # -- writing -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        out = self._out
        if not out:
            self.loop.call_soon(self._flush)
        out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= OUT_HIGH_WATER:
            self.writable = False  # what comes next waits in the session's queue

    def send(self, packet: Packet) -> None:
        data = encode(packet, self.protocol_level)
        limit = self.max_packet_out
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
        return encode(dataclasses.replace(packet, properties=kept), self.protocol_level)

    def _flush(self) -> None:
        out = self._out
        if out and not self._closing:
            self.transport.writelines(out)
            self.broker.metrics.bytes_sent += self._out_bytes
        self._out = []
        self._out_bytes = 0
        self.writable = not self._write_paused
        session = self.session
        if session is not None and self.writable and (session.queue or session.held):
            session.drain()  # the next step of a long queue, one step per loop turn

    def close(self, reason_code: int | None = None, reason: str | None = None) -> None:
        """Close this connection; MQTT 5 clients past CONNECT are told why first (with
        `reason` as the Reason String, which DISCONNECT may always carry [MQTT-3.1.2-29])."""
        if self._closing:
            return
        if reason_code is not None and self.session is not None and self.protocol_level == MQTT5:
            self.broker.metrics.mqtt_disconnect_sent += 1
            self.send(Disconnect(reason_code, {Property.REASON_STRING: reason} if reason else {}))
        self._flush()
        self._closing = True
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

    def _name(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}" + (f" ({self.client_id})" if self.client_id else "")

    # -- timers ------------------------------------------------------------------------

    def _no_connect(self) -> None:
        log.info("%s: no CONNECT within %ss", self._name(), self.broker.settings.connect_timeout)
        self.close()

    def _check_keepalive(self) -> None:
        # The client must send something every keepalive seconds; we allow 1.5x [MQTT-3.1.2-22].
        if self._transport_paused:  # we stopped reading it: its silence is ours
            self.last_seen = self.loop.time()
        deadline = self.last_seen + self.keepalive * 1.5
        remaining = deadline - self.loop.time()
        if remaining > 0:
            self._timer = self.loop.call_later(remaining, self._check_keepalive)
            return
        self.broker.metrics.client_keepalive_expired += 1
        log.info("%s: keepalive expired", self._name())
        self.close(ReasonCode.KEEP_ALIVE_TIMEOUT)

    # -- hook flows that await ---------------------------------------------------------

    def _spawn(self, flow) -> None:
        """Run an awaiting hook flow; no further packet is handled until it is done, so
        this client's packets keep their order. (A flow may start the next one.)"""
        self.busy += 1
        self._update_reading()
        task = asyncio.ensure_future(flow)
        self.broker.tasks.add(task)
        task.add_done_callback(self._flow_done)

    def _flow_done(self, task: asyncio.Task) -> None:
        self.broker.tasks.discard(task)
        self.busy -= 1
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("%s: internal error in a hook flow", self._name(), exc_info=task.exception())
            return self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
        if not self._closing:
            self._update_reading()
            self._process()

    def _update_reading(self) -> None:
        """Pause the transport while back-pressure or a hook flow holds this client."""
        if self._closing:
            return
        paused = self.reading_paused or self.busy or self.throttled
        if paused != self._transport_paused:
            self._transport_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _connack_properties(self, assigned_id: str | None) -> dict:
        if self.protocol_level != MQTT5:
            return {}
        props = self.broker.connack_properties
        if assigned_id is not None:
            props = {**props, Property.ASSIGNED_CLIENT_IDENTIFIER: assigned_id}
        return props

    def _refuse(self, reason: int, properties: dict | None = None) -> None:
        # 3.x has five codes; "not authorized" stands for every other refusal.
        v3_code = V3_CONNACK_CODE.get(reason, ConnectReturnCode.NOT_AUTHORIZED)
        log.info("%s: connection refused (reason %#04x)", self._name(), reason)
        if self.protocol_level == MQTT5:
            self.send(ConnAck(reason, False, properties or {}))
        elif reason != ReasonCode.TOPIC_NAME_INVALID:
            self.send(ConnAck(v3_code, False))
        else:  # 3.1.1 has no code for it: close without CONNACK [MQTT-3.2.2-6]
            return self.close()
        self.broker.metrics.connack_sent(v3_code)
        self.close()

    # -- PUBLISH in --------------------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        self.broker.metrics.mqtt_publish_received += 1
        if self.max_message_rate:
            self._count_rate()
        if Property.TOPIC_ALIAS in packet.properties and not self._resolve_alias(packet):
            return None
        if not valid_topic_name(packet.topic):
            return self.close(ReasonCode.TOPIC_NAME_INVALID)
        depth = self.broker.settings.topic_max_depth
        if depth and packet.topic.count("/") >= depth:
            self.broker.metrics.topic_depth_exceeded += 1
            return self.close(ReasonCode.TOPIC_NAME_INVALID)
        if packet.properties.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1 and not _utf8(
            packet.payload
        ):
            # Flagged as UTF-8 but is not: refused with 0x99 [MQTT-3.3.2-4].
            if packet.qos:
                ack = PubAck if packet.qos == 1 else PubRec
                return self.send(ack(packet.packet_id, ReasonCode.PAYLOAD_FORMAT_INVALID))
            return None
        if packet.qos == 2:
            received = self.session.received_qos2
            if packet.packet_id in received:  # a resend: acknowledge, do not route twice
                return self.send(PubRec(packet.packet_id))
            if len(received) >= self.broker.settings.receive_max_broker:
                return self.close(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
        chain = self.broker.auth_on_publish[self.protocol_level == MQTT5]
        if not chain:  # no authorization plugin: publishing is allowed
            return self._route(packet, None)
        context = self._publish_context(packet)
        if chain.synchronous:
            return self._authorized_publish(packet, context, chain.run_sync(context))
        self._spawn(self._authorize_publish(packet, context, chain))

    def _count_rate(self) -> None:
        """max_message_rate: after N PUBLISHes in a second, stop reading from this client
        until the second is over (VerneMQ throttles the socket the same way)."""
        now = self.loop.time()
        if now >= self._rate_window_end:
            self._rate_window_end = now + 1.0
            self._rate_count = 0
        self._rate_count += 1
        if self._rate_count >= self.max_message_rate:
            self.broker.metrics.client_publish_throttled += 1
            self.throttled = True
            self._update_reading()
            self.loop.call_at(self._rate_window_end, self._end_throttle)

    def _end_throttle(self) -> None:
        if self.throttled and not self._closing:
            self.throttled = False
            self._update_reading()
            self._process()

    def _resolve_alias(self, packet: Publish) -> bool:
        """Apply a client's Topic Alias [3.3.2.3.4]: a topic sets it, an empty topic uses it.
        The alias is this connection's business: it is removed before routing."""
        alias = packet.properties.pop(Property.TOPIC_ALIAS)
        if alias > self.broker.settings.topic_alias_max_broker:
            self.close(ReasonCode.TOPIC_ALIAS_INVALID)  # above what we announced
            return False
        if packet.topic:
            self.aliases_in[alias] = packet.topic
        else:
            topic = self.aliases_in.get(alias)
            if topic is None:  # an alias never set on this connection [MQTT-3.3.2-12]
                self.close(ReasonCode.PROTOCOL_ERROR)
                return False
            packet.topic = topic
        packet.raw = None  # the bytes carry the alias, not (necessarily) the topic
        return True

    async def _authorize_publish(
        self, packet: Publish, context: PublishContext, chain: Chain
    ) -> None:
        result = await chain.run(context)
        if not self._closing:
            self._authorized_publish(packet, context, result)

    def _authorized_publish(self, packet: Publish, context: PublishContext, result) -> None:
        if type(result) is Ok:
            changed = apply_publish_modifiers(context, result)
            return self._route(packet, context if changed else None)
        log.debug("%s: publish to %r refused: %s", self._name(), packet.topic, result)
        if self.protocol_level == 4:
            return self.close()  # MQTT 3.1.1 has no refusal code: VerneMQ disconnects
        if packet.qos == 0:
            return None
        if self.protocol_level == MQTT5:
            ack = PubAck if packet.qos == 1 else PubRec
            props = refusal_properties(result) if self.problem_info else {}
            return self.send(ack(packet.packet_id, publish_refusal(result), props))
        return self._acknowledge(packet)  # MQTT 3.1: dropped silently

    def _route(self, packet: Publish, changed: PublishContext | None) -> None:
        """Route an allowed PUBLISH (as the plugins changed it, if they did) and ack it."""
        if packet.qos == 2:
            self.session.received_qos2.add(packet.packet_id)
        if changed is None:
            message = Message(
                packet.topic,
                packet.payload,
                packet.qos,
                packet.retain,
                packet.properties,
                self.client_id,
                packet.raw,
                self.protocol_level,
                now=self.loop.time(),
            )
        else:
            message = Message(
                changed.topic,
                changed.payload,
                changed.qos,
                changed.retain,
                changed.properties,
                self.client_id,
                now=self.loop.time(),
            )
        if not message.topic.startswith("$SYS"):  # $SYS belongs to the broker
            full = self.broker.publish(message, self.session.shared_policy)
            if full:
                self.broker.flow.hold(self, full)
            on_publish = self.broker.on_publish[self.protocol_level == MQTT5]
            if on_publish:
                self.broker.hooks.notify(on_publish.name, changed or self._publish_context(packet))
        self._acknowledge(packet)

    def _acknowledge(self, packet: Publish) -> None:
        if packet.qos == 1:
            self.broker.metrics.mqtt_puback_sent += 1
            self.write(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))
        elif packet.qos == 2:
            self.broker.metrics.mqtt_pubrec_sent += 1
            self.write(b"\x50\x02" + packet.packet_id.to_bytes(2, "big"))

    def _publish_context(self, packet: Publish | Will) -> PublishContext:
        """This client's PUBLISH (or the will its CONNECT carries) as hooks see it."""
        return PublishContext(
            client_id=self.client_id,
            username=self.username,
            attributes=self.attributes,
            topic=packet.topic,
            payload=packet.payload,
            qos=packet.qos,
            retain=packet.retain,
            properties=packet.properties,  # plugins change it by modifier, not in place
        )

    def _on_pubrel(self, packet: PubRel) -> None:
        self.broker.metrics.mqtt_pubrel_received += 1
        self.broker.metrics.mqtt_pubcomp_sent += 1
        try:
            self.session.received_qos2.remove(packet.packet_id)
            code = ReasonCode.SUCCESS
        except KeyError:
            code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self.send(PubComp(packet.packet_id, code if self.protocol_level == MQTT5 else 0))

    # -- acknowledgements of our PUBLISHes ---------------------------------------------

    def _on_puback(self, packet: PubAck) -> None:
        self.broker.metrics.mqtt_puback_received += 1
        self.session.on_puback(packet.packet_id)

    def _on_pubrec(self, packet: PubRec) -> None:
        self.broker.metrics.mqtt_pubrec_received += 1
        code = self.session.on_pubrec(packet.packet_id, packet.reason_code)
        if code >= 0:
            self.broker.metrics.mqtt_pubrel_sent += 1
            self.send(PubRel(packet.packet_id, code if self.protocol_level == MQTT5 else 0))

    def _on_pubcomp(self, packet: PubComp) -> None:
        self.broker.metrics.mqtt_pubcomp_received += 1
        self.session.on_pubcomp(packet.packet_id)

    # -- the rest ----------------------------------------------------------------------

    def _on_pingreq(self, packet: PingReq) -> None:
        self.broker.metrics.mqtt_pingreq_received += 1
        self.broker.metrics.mqtt_pingresp_sent += 1
        self.write(PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        self.broker.metrics.mqtt_disconnect_received += 1
        if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
            self.will = None  # a normal DISCONNECT discards the will [MQTT-3.14.4-3]
        expiry = packet.properties.get(Property.SESSION_EXPIRY_INTERVAL)
        if expiry is not None and self.session is not None:
            session = self.session.owner
            if session.expiry == 0 and expiry:
                # Zero at CONNECT cannot become non-zero at DISCONNECT [MQTT-3.14.2-2].
                return self.close(ReasonCode.PROTOCOL_ERROR)
            session.expiry = None if expiry == NEVER_EXPIRES else expiry
        self.close()

    _handlers = {
        Connect: ConnectHandling._on_connect,
        Publish: _on_publish,
        PubAck: _on_puback,
        PubRec: _on_pubrec,
        PubRel: _on_pubrel,
        PubComp: _on_pubcomp,
        Subscribe: SubscriptionHandling._on_subscribe,
        Unsubscribe: SubscriptionHandling._on_unsubscribe,
        PingReq: _on_pingreq,
        Disconnect: _on_disconnect,
        Auth: ConnectHandling._on_auth,
    }
