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
from typing import TYPE_CHECKING

from broker.message import Message
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
    Subscribe,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    encode,
)
from broker.protocol import SubAck as SubAckPacket
from broker.router import SubOptions
from broker.topics import valid_topic_filter, valid_topic_name

if TYPE_CHECKING:
    from broker.server import Broker
    from broker.session import Session

log = logging.getLogger("nautilus.connection")

MQTT5 = 5
PINGRESP = b"\xd0\x00"
STALL_LIMIT = 1.0  # seconds a congested subscriber may hold publishers back
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never" [3.1.2.11.2]


class Connection(asyncio.Protocol):
    __slots__ = (
        "_closing",
        "_out",
        "_stall_timer",
        "_timer",
        "broker",
        "client_id",
        "decoder",
        "keepalive",
        "last_seen",
        "loop",
        "peer",
        "protocol_level",
        "reading_paused",
        "session",
        "stuck",
        "transport",
        "waiting_publishers",
        "will",
        "will_delay",
        "writable",
    )

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
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
        self.reading_paused = False
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
        self.broker.connections.add(self)
        self.broker.metrics.socket_open += 1
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
            while not self._closing and not self.reading_paused:
                packet = decoder.next_packet()
                if packet is None:
                    return
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
            log.info("%s: protocol error: %s", self._name(), exc)
            self.close(exc.reason_code)
        except Exception:
            # A bug of ours: this connection ends, the broker and everyone else go on.
            log.exception("%s: internal error; closing the connection", self._name())
            self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        self.broker.connections.discard(self)
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
        if not self.reading_paused and not self._closing:
            self.reading_paused = True
            self.transport.pause_reading()
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
            self.transport.resume_reading()
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
        if self.reading_paused:  # we stopped reading it: its silence is ours
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
        self._timer.cancel()
        self._timer = None
        self.protocol_level = level = packet.protocol_level
        self.broker.metrics.mqtt_connect_received += 1
        client_id = packet.client_id
        props = packet.properties
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
        if not self.broker.settings.allow_anonymous:
            # No plugin can allow a client yet (hooks come with the plugin system).
            return self._refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD)
        self.client_id = client_id
        if packet.will is not None:
            will = packet.will
            self.will = Message(will.topic, will.payload, will.qos, will.retain, will.properties)
            self.will_delay = will.properties.pop(Property.WILL_DELAY_INTERVAL, 0)
        self.keepalive = packet.keepalive
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
        session, present = self.broker.registry.connect(self, client_id, packet.clean_start, expiry)
        self.session = session
        self.send(ConnAck(ReasonCode.SUCCESS, present, self._connack_properties(assigned)))
        self.broker.metrics.mqtt_connack_sent += 1
        session.attach(self, props.get(Property.RECEIVE_MAXIMUM, 65535))

    def _connack_properties(self, assigned_id: str | None) -> dict:
        if self.protocol_level != MQTT5:
            return {}
        props = self.broker.connack_properties
        if assigned_id is not None:
            props = {**props, Property.ASSIGNED_CLIENT_IDENTIFIER: assigned_id}
        return props

    def _refuse(self, reason: int) -> None:
        code = reason if self.protocol_level == MQTT5 else V3_CONNACK_CODE[reason]
        if self.protocol_level != MQTT5 and reason == ReasonCode.TOPIC_NAME_INVALID:
            code = None  # 3.1.1 has no code for it: close without CONNACK [MQTT-3.2.2-6]
        log.info("%s: connection refused: %s", self._name(), ReasonCode(reason).name)
        if code is not None:
            self.send(ConnAck(code))
        self.close()

    # -- PUBLISH in --------------------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        self.broker.metrics.mqtt_publish_received += 1
        topic = packet.topic
        if not valid_topic_name(topic):
            return self.close(ReasonCode.TOPIC_NAME_INVALID)
        if Property.TOPIC_ALIAS in packet.properties:
            # We announce Topic Alias Maximum 0, so any alias is invalid [MQTT-3.3.2-8].
            return self.close(ReasonCode.TOPIC_ALIAS_INVALID)
        qos = packet.qos
        if qos == 2:
            received = self.session.received_qos2
            if packet.packet_id in received:  # a resend: acknowledge, do not route twice
                return self.send(PubRec(packet.packet_id))
            if len(received) >= self.broker.settings.receive_max_broker:
                return self.close(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
            received.add(packet.packet_id)
        if not topic.startswith("$SYS"):  # $SYS belongs to the broker
            message = Message(
                topic,
                packet.payload,
                qos,
                packet.retain,
                packet.properties,
                self.client_id,
                packet.raw,
                self.protocol_level,
            )
            congested = self.broker.publish(message)
            if congested:
                self.wait_for(congested)
        if qos == 1:
            self.write(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))
        elif qos == 2:
            self.write(b"\x50\x02" + packet.packet_id.to_bytes(2, "big"))

    def _on_pubrel(self, packet: PubRel) -> None:
        try:
            self.session.received_qos2.remove(packet.packet_id)
            code = ReasonCode.SUCCESS
        except KeyError:
            code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self.send(PubComp(packet.packet_id, code if self.protocol_level == MQTT5 else 0))

    # -- acknowledgements of our PUBLISHes ---------------------------------------------

    def _on_puback(self, packet: PubAck) -> None:
        self.session.on_puback(packet.packet_id)

    def _on_pubrec(self, packet: PubRec) -> None:
        code = self.session.on_pubrec(packet.packet_id, packet.reason_code)
        if code >= 0:
            self.send(PubRel(packet.packet_id, code if self.protocol_level == MQTT5 else 0))

    def _on_pubcomp(self, packet: PubComp) -> None:
        self.session.on_pubcomp(packet.packet_id)

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        self.broker.metrics.mqtt_subscribe_received += 1
        v5 = self.protocol_level == MQTT5
        sub_ids = packet.properties.get(Property.SUBSCRIPTION_IDENTIFIER)
        sub_id = sub_ids[0] if sub_ids else None
        codes = []
        retained = []
        for sub in packet.subscriptions:
            topic_filter = sub.topic_filter
            if not valid_topic_filter(topic_filter) or topic_filter.startswith("$share/"):
                if not v5:
                    codes.append(0x80)
                elif topic_filter.startswith("$share/"):
                    codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                else:
                    codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            options = SubOptions(
                sub.qos, sub.no_local, sub.retain_as_published, sub.retain_handling, sub_id
            )
            is_new = self.broker.subscribe(self.session, topic_filter, options)
            codes.append(sub.qos)
            # Retain Handling 0: send retained; 1: only for a new subscription; 2: never.
            if sub.retain_handling == 0 or (sub.retain_handling == 1 and is_new):
                retained.append((topic_filter, options))
        self.send(SubAckPacket(packet.packet_id, codes))
        for topic_filter, options in retained:
            self.broker.send_retained(self.session, topic_filter, options)

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        self.broker.metrics.mqtt_unsubscribe_received += 1
        codes = []
        for topic_filter in packet.topic_filters:
            found = self.broker.unsubscribe(self.session, topic_filter)
            codes.append(ReasonCode.SUCCESS if found else ReasonCode.NO_SUBSCRIPTION_EXISTED)
        self.send(UnsubAck(packet.packet_id, codes if self.protocol_level == MQTT5 else []))

    # -- the rest ----------------------------------------------------------------------

    def _on_pingreq(self, packet: PingReq) -> None:
        self.write(PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
            self.will = None  # a normal DISCONNECT discards the will [MQTT-3.14.4-3]
        expiry = packet.properties.get(Property.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if self.session.expiry == 0 and expiry:
                # Zero at CONNECT cannot become non-zero at DISCONNECT [MQTT-3.14.2-2].
                return self.close(ReasonCode.PROTOCOL_ERROR)
            self.session.expiry = None if expiry == NEVER_EXPIRES else expiry
        self.close()

    def _on_auth(self, packet: Packet) -> None:
        # Enhanced authentication comes with the hooks issue; without a method it is an error.
        self.close(ReasonCode.PROTOCOL_ERROR)

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
        Subscribe: _on_subscribe,
        Unsubscribe: _on_unsubscribe,
        PingReq: _on_pingreq,
        Disconnect: _on_disconnect,
        Auth: _on_auth,
    }
