"""One client connection: bytes <-> codec <-> session, timers, and write batching.

Theory of operation: `data_received` feeds the decoder and handles every complete packet
synchronously; nothing on this path awaits. Outgoing bytes are appended to a list and
flushed with one `writelines` per event-loop turn, so a burst of deliveries costs one
system call. When the transport's buffer passes its high-water mark, `writable` turns
false and deliveries wait in the session's bounded queue until `resume_writing`.

Back-pressure: a publisher whose message had to wait for a congested subscriber stops
being read (`pause_reading`) until that subscriber's queue has drained, so a flood slows
to the pace of its readers instead of filling queues and being dropped. A subscriber that
stays congested for STALL_LIMIT seconds is deemed stuck: the publishers waiting for it go
on, and until its transport drains its queue's limit and drop policy apply instead, so one
stuck client cannot stall the broker.

Timers are `loop.call_later` handles: a connect timeout until CONNECT arrives, then one
keepalive timer that re-arms itself for the time left instead of being reset per packet.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from broker.authorization import (
    apply_publish_modifiers,
    publish_refusal,
    refusal_reason,
    register_refusal,
    session_limits,
)
from broker.enhanced_auth import CONTINUE, SUCCESS, AuthExchange
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
    encode,
)
from broker.subscriptions import SubscriptionHandling
from broker.topics import valid_topic_name
from hooks import (
    AuthContext,
    Chain,
    ClientContext,
    Ok,
    PublishContext,
    RegisterContext,
)
from hooks.results import NO_HOOK

if TYPE_CHECKING:
    from broker.server import Broker
    from broker.session import Session

log = logging.getLogger("nautilus.connection")

MQTT5 = 5
PINGRESP = b"\xd0\x00"
STALL_LIMIT = 1.0  # seconds a congested subscriber may hold publishers back
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never" [3.1.2.11.2]


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def run_inline(flow: Coroutine) -> None:
    """Run a hook flow whose chains are all plain methods, without a task: its awaits
    never suspend, so one send() runs it to the end (about 40 us less per CONNECT)."""
    try:
        flow.send(None)
    except StopIteration:
        return
    flow.close()
    raise RuntimeError("a hook flow of synchronous chains suspended")


class Connection(SubscriptionHandling, asyncio.Protocol):
    __slots__ = (
        "_closing",
        "_connecting",
        "_out",
        "_rate_count",
        "_rate_window_end",
        "_stall_timer",
        "_timer",
        "_transport_paused",
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
        "protocol_level",
        "reading_paused",
        "session",
        "stuck",
        "throttled",
        "transport",
        "username",
        "waiting_publishers",
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
        self.writable = True
        self.reading_paused = False  # back-pressure: a subscriber we feed is congested
        self.busy = 0  # awaiting hook flows (e.g. a webhook) holding further packets
        self._transport_paused = False
        self.max_message_rate = broker.settings.max_message_rate  # PUBLISHes per second
        self.throttled = False
        self._rate_count = 0
        self._rate_window_end = 0.0
        self.username: str | None = None
        self.max_packet_out = 0  # the MQTT 5 client's Maximum Packet Size; 0: no limit
        self.aliases_in: dict[int, str] = {}  # Topic Aliases the client set
        self.aliases_out: TopicAliases | None = None  # ours towards the client, if any
        self.auth_exchange: AuthExchange | None = None  # MQTT 5 enhanced authentication
        self._connecting: tuple | None = None  # (CONNECT, assigned id) during the exchange
        self.attributes: dict = {}  # shared by the plugins for this connection
        self.waiting_publishers: set[Connection] = set()  # publishers paused for our sake
        self.stuck = False  # congested too long: holds no publisher back any more
        self._stall_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._out: list[bytes] = []
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
            self.transport.write(
                b"\x20\x02\x00" + bytes((ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,))
            )
            self.close()
        except ProtocolError as exc:
            self.broker.metrics.mqtt_protocol_error += 1
            if exc.reason_code == ReasonCode.PACKET_TOO_LARGE:
                self.broker.metrics.mqtt_invalid_msg_size_error += 1
            log.info("%s: protocol error: %s", self._name(), exc)
            self.close(exc.reason_code)
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
        self._release_publishers()
        if self.session is not None:
            self.broker.registry.disconnected(self)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.stuck = False
        if self.session is not None:
            self.session.drain()
        self._release_publishers()

    # -- back-pressure -----------------------------------------------------------------

    def wait_for(self, congested: list[Connection]) -> None:
        """Stop reading from this publisher until the congested subscribers drain."""
        self.reading_paused = True
        self._update_reading()
        for subscriber in congested:
            subscriber.waiting_publishers.add(self)
            if subscriber._stall_timer is None:
                subscriber._stall_timer = self.loop.call_later(STALL_LIMIT, subscriber._stalled)

    def _stalled(self) -> None:
        self._stall_timer = None
        if not self.writable:
            log.info("%s: not reading; publishers no longer wait for it", self._name())
            self.stuck = True
        self._release_publishers()

    def _release_publishers(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        waiting = self.waiting_publishers
        if waiting:
            self.waiting_publishers = set()
            for publisher in waiting:
                publisher._resume_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and not self._closing:
            self.reading_paused = False
            self._update_reading()
            self.loop.call_soon(self._process)  # packets that arrived before the pause

    # -- writing -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        out = self._out
        if not out:
            self.loop.call_soon(self._flush)
        out.append(data)

    def send(self, packet: Packet) -> None:
        self.write(encode(packet, self.protocol_level))

    def _flush(self) -> None:
        out = self._out
        if out and not self._closing:
            self.transport.writelines(out)
            self.broker.metrics.bytes_sent += sum(map(len, out))
        self._out = []
        session = self.session
        if session is not None and self.writable:
            if session.queue:
                session.drain()  # the next step of a long queue, one step per loop turn
            self._release_publishers()

    def close(self, reason_code: int | None = None) -> None:
        """Close this connection; MQTT 5 clients past CONNECT are told why first."""
        if self._closing:
            return
        if reason_code is not None and self.session is not None and self.protocol_level == MQTT5:
            self.broker.metrics.mqtt_disconnect_sent += 1
            self.send(Disconnect(reason_code))
        self._flush()
        self._closing = True
        self.transport.close()

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

    # -- CONNECT -----------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        self.protocol_level = level = packet.protocol_level
        self.broker.metrics.mqtt_connect_received += 1
        client_id = packet.client_id
        assigned = None
        if not client_id:
            # [MQTT-3.1.3-6/8]: 3.1.1 assigns an id only to clean sessions; 3.1 never does.
            if level == 3 or (level == 4 and not packet.clean_start):
                return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
            client_id = assigned = f"auto-{uuid.uuid4().hex}"
        elif len(client_id) > self.broker.settings.max_client_id_size:
            return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        if packet.will is not None and not valid_topic_name(packet.will.topic):
            return self._refuse(ReasonCode.TOPIC_NAME_INVALID)
        self.client_id = client_id
        self.username = packet.username
        settings = self.broker.settings
        if settings.server_reference:
            # This node is being drained: send clients elsewhere [4.11] (MQTT 3: "unavailable").
            moved = (
                ReasonCode.SERVER_MOVED if settings.server_moved else ReasonCode.USE_ANOTHER_SERVER
            )
            return self._refuse(moved, {Property.SERVER_REFERENCE: settings.server_reference})
        method = packet.properties.get(Property.AUTHENTICATION_METHOD) if level == MQTT5 else None
        if method is not None:  # enhanced authentication comes first [4.12]
            chain = self.broker.hooks.chain("on_auth_m5")
            if not chain:
                return self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD)
            self.auth_exchange = AuthExchange(chain, method)
            self._connecting = (packet, assigned)
            return self._spawn(self._auth_step(packet.properties.get(Property.AUTHENTICATION_DATA)))
        self._authenticate(packet, assigned, {})

    def _authenticate(self, packet: Connect, assigned: str | None, auth_props: dict) -> None:
        """auth_on_register and the will's auth_on_publish, then CONNACK (`auth_props`:
        what enhanced authentication adds to it)."""
        hooks = self.broker.hooks
        level = self.protocol_level
        v5 = level == MQTT5
        register = None
        if not self.broker.settings.allow_anonymous:  # then auth_on_register is skipped
            register = hooks.chain("auth_on_register_m5" if v5 else "auth_on_register")
        will_check = None
        if packet.will is not None:
            will_check = hooks.chain("auth_on_publish_m5" if v5 else "auth_on_publish") or None
        if register is None and will_check is None:
            return self._accept(packet, assigned, {}, auth_props)
        context = RegisterContext(
            client_id=self.client_id,
            username=packet.username,
            attributes=self.attributes,
            peer=self.peer[:2],
            password=packet.password,
            clean_start=packet.clean_start,
            protocol_level=level,
            properties=packet.properties,
        )
        flow = self._authorize(packet, assigned, context, register, will_check, auth_props)
        if (register is None or register.synchronous) and (
            will_check is None or will_check.synchronous
        ):
            return run_inline(flow)
        self._spawn(flow)

    async def _authorize(
        self,
        packet: Connect,
        assigned: str | None,
        context: RegisterContext,
        register: Chain | None,
        will_check: Chain | None,
        auth_props: dict,
    ) -> None:
        """auth_on_register(_m5), then the will's auth_on_publish, then CONNACK."""
        modifiers: dict = {}
        if register is not None:
            result = await register.run(context) if register else NO_HOOK
            if type(result) is not Ok:
                return self._register_failed(context, result, register_refusal(result))
            modifiers = dict(result.modifiers)
            self._apply_register_modifiers(packet, context, modifiers)
        if will_check is not None:
            will = packet.will
            will_context = PublishContext(
                client_id=self.client_id,
                username=self.username,
                attributes=self.attributes,
                topic=will.topic,
                payload=will.payload,
                qos=will.qos,
                retain=will.retain,
                properties=will.properties,
            )
            result = await will_check.run(will_context)
            if type(result) is not Ok:
                # VerneMQ answers a refused will with CONNACK 5 / not authorized.
                return self._register_failed(context, result, ReasonCode.NOT_AUTHORIZED)
        if not self._closing:
            self._accept(packet, assigned, modifiers, auth_props)

    def _apply_register_modifiers(
        self, packet: Connect, context: RegisterContext, modifiers: dict
    ) -> None:
        if "username" in modifiers:
            self.username = context.username = modifiers["username"]
        if "client_id" in modifiers:
            self.client_id = context.client_id = modifiers["client_id"]
        for key in ("clean_start", "clean_session"):
            if key in modifiers:
                packet.clean_start = modifiers[key]
        if modifiers.get("max_message_size"):
            self.decoder.max_packet_size = modifiers["max_message_size"]
        if "max_message_rate" in modifiers:
            self.max_message_rate = modifiers["max_message_rate"]

    def _register_failed(self, context: RegisterContext, result, code: int) -> None:
        reason = refusal_reason(result)
        chain = self.broker.hooks.chain("on_register_failed")
        if chain:
            context.reason = reason
            context.password = None  # events (and the event relay) never see credentials
            self.broker.hooks.notify("on_register_failed", context)
        log.info("%s: not authorized: %s", self._name(), reason)
        if not self._closing:
            self._refuse(code)

    def _accept(
        self, packet: Connect, assigned: str | None, modifiers: dict, auth_props: dict
    ) -> None:
        """The client may connect: set up will, keepalive and session, send CONNACK."""
        self._timer.cancel()
        self._timer = None
        level = self.protocol_level
        props = packet.properties
        if packet.will is not None:
            will = packet.will
            self.will_delay = will.properties.pop(Property.WILL_DELAY_INTERVAL, 0)
            self.will = Message(
                will.topic, will.payload, will.qos, will.retain, will.properties, self.client_id
            )
        self.keepalive = packet.keepalive
        server_keepalive = self._server_keepalive()
        if server_keepalive is not None:
            self.keepalive = server_keepalive
        self.max_packet_out = props.get(Property.MAXIMUM_PACKET_SIZE, 0)
        alias_room = min(
            props.get(Property.TOPIC_ALIAS_MAXIMUM, 0), self.broker.settings.topic_alias_max_client
        )
        if alias_room:
            self.aliases_out = TopicAliases(alias_room)
        if self.keepalive:
            self.last_seen = self.loop.time()
            self._timer = self.loop.call_later(self.keepalive * 1.5, self._check_keepalive)
        if level == MQTT5:
            expiry = props.get(Property.SESSION_EXPIRY_INTERVAL, 0)
            expiry = None if expiry == NEVER_EXPIRES else expiry
        elif packet.clean_start:
            expiry = 0
        else:
            expiry = self.broker.settings.persistent_client_expiration or None
        registry = self.broker.registry
        session, present = registry.connect(self, self.client_id, packet.clean_start, expiry)
        session.apply_limits(session_limits(modifiers))
        self.session = session
        hooks = self.broker.hooks
        on_register = hooks.chain("on_register_m5" if level == MQTT5 else "on_register")
        if on_register:
            hooks.notify(on_register.name, self._register_event(packet))
        if hooks.chain("on_client_wakeup"):
            hooks.notify("on_client_wakeup", self._client_context())
        connack_props = {**self._connack_properties(assigned), **auth_props}
        if server_keepalive is not None:
            connack_props = {**connack_props, Property.SERVER_KEEP_ALIVE: server_keepalive}
        response_information = self.broker.settings.response_information
        if response_information and props.get(Property.REQUEST_RESPONSE_INFORMATION):
            # [3.1.2.11.7]: only when asked for; %c stands for the client id.
            info = response_information.replace("%c", self.client_id)
            connack_props = {**connack_props, Property.RESPONSE_INFORMATION: info}
        self.send(ConnAck(ReasonCode.SUCCESS, present, connack_props))
        self.broker.metrics.mqtt_connack_sent += 1
        session.attach(self, props.get(Property.RECEIVE_MAXIMUM, 65535))

    def _server_keepalive(self) -> int | None:
        """`max_keepalive` caps what an MQTT 5 client asked for (0 counts as "forever"),
        told in CONNACK's Server Keep Alive [MQTT-3.2.2-21]; MQTT 3 has no way to say so."""
        limit = self.broker.settings.max_keepalive
        if not limit or self.protocol_level != MQTT5:
            return None
        if self.keepalive and self.keepalive <= limit:
            return None
        return limit

    def _register_event(self, packet: Connect) -> RegisterContext:
        return RegisterContext(
            client_id=self.client_id,
            username=self.username,
            attributes=self.attributes,
            peer=self.peer[:2],
            clean_start=packet.clean_start,
            protocol_level=self.protocol_level,
            properties=packet.properties,
        )

    def _client_context(self) -> ClientContext:
        return ClientContext(
            client_id=self.client_id, username=self.username, attributes=self.attributes
        )

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
        if self.protocol_level == MQTT5:
            code = reason
        elif reason == ReasonCode.TOPIC_NAME_INVALID:
            code = None  # 3.1.1 has no code for it: close without CONNACK [MQTT-3.2.2-6]
        else:  # 3.x has five codes; "not authorized" stands for every other refusal
            code = V3_CONNACK_CODE.get(reason, ConnectReturnCode.NOT_AUTHORIZED)
        log.info("%s: connection refused (reason %#04x)", self._name(), reason)
        if code is not None:
            props = properties if self.protocol_level == MQTT5 and properties else {}
            self.send(ConnAck(code, False, props))
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
            return self.send(ack(packet.packet_id, publish_refusal(result)))
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
            )
        else:
            message = Message(
                changed.topic,
                changed.payload,
                changed.qos,
                changed.retain,
                changed.properties,
                self.client_id,
            )
        if not message.topic.startswith("$SYS"):  # $SYS belongs to the broker
            congested = self.broker.publish(message)
            if congested:
                self.wait_for(congested)
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

    def _publish_context(self, packet: Publish) -> PublishContext:
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
            if self.session.expiry == 0 and expiry:
                # Zero at CONNECT cannot become non-zero at DISCONNECT [MQTT-3.14.2-2].
                return self.close(ReasonCode.PROTOCOL_ERROR)
            self.session.expiry = None if expiry == NEVER_EXPIRES else expiry
        self.close()

    # -- enhanced authentication [4.12] -------------------------------------------------

    def _on_auth(self, packet: Auth) -> None:
        exchange = self.auth_exchange
        method = packet.properties.get(Property.AUTHENTICATION_METHOD)
        if exchange is None or method != exchange.method:
            return self.close(ReasonCode.PROTOCOL_ERROR)  # [MQTT-4.12.0-5] / [MQTT-4.12.1-1]
        allowed = (CONTINUE,) if self._connecting else (CONTINUE, ReasonCode.RE_AUTHENTICATE)
        if packet.reason_code not in allowed:
            return self.close(ReasonCode.PROTOCOL_ERROR)
        self._spawn(self._auth_step(packet.properties.get(Property.AUTHENTICATION_DATA)))

    async def _auth_step(self, data: bytes | None) -> None:
        context = AuthContext(
            client_id=self.client_id, username=self.username, attributes=self.attributes
        )
        step = await self.auth_exchange.step(context, data)
        if self._closing:
            return None
        connecting, self._connecting = self._connecting, None
        if step.reason_code >= 0x80:
            log.info("%s: authentication failed (%#04x)", self._name(), step.reason_code)
            return self._refuse(step.reason_code) if connecting else self.close(step.reason_code)
        if step.reason_code == CONTINUE:
            self._connecting = connecting
            return self.send(Auth(CONTINUE, step.properties))
        if connecting:
            return self._authenticate(*connecting, step.properties)
        return self.send(Auth(SUCCESS, step.properties))  # re-authenticated

    def take_over(self) -> None:
        """Another connection claimed this client id [MQTT-3.1.4-3]."""
        self.close(ReasonCode.SESSION_TAKEN_OVER)

    _handlers = {
        Connect: _on_connect,
        Publish: _on_publish,
        PubAck: _on_puback,
        PubRec: _on_pubrec,
        PubRel: _on_pubrel,
        PubComp: _on_pubcomp,
        Subscribe: SubscriptionHandling._on_subscribe,
        Unsubscribe: SubscriptionHandling._on_unsubscribe,
        PingReq: _on_pingreq,
        Disconnect: _on_disconnect,
        Auth: _on_auth,
    }
