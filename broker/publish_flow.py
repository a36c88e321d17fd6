"""PUBLISH for a client connection: inbound messages (topic aliases, checks,
auth_on_publish, routing, PUBACK / PUBREC, PUBREL) and the acknowledgements of the
messages the broker sent (PUBACK, PUBREC, PUBCOMP).

Functions over the connection shell (`conn`) and its ClientState: nothing here touches a
transport. The hot path is `on_publish` -> `_route` -> `Routing.publish`; after routing,
a publisher whose message filled a subscriber's queue is held (broker/flow.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.authorization import apply_publish_modifiers, publish_refusal, refusal_properties
from broker.message import Message
from broker.protocol import (
    Property,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    Will,
    encode_puback,
    encode_pubrec,
)
from broker.topics import valid_topic_name
from hooks import Ok, PublishContext, Result
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    from broker.connection import Connection

log = logging.getLogger("nautilus.connection")

MQTT5 = 5


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def on_publish(conn: Connection, packet: Publish) -> None:
    conn.broker.metrics.mqtt_publish_received += 1
    if conn.client.max_message_rate:
        conn.count_rate()
    properties = packet.properties  # empty below MQTT 5: the checks on them cost nothing
    if properties and Property.TOPIC_ALIAS in properties and not _resolve_alias(conn, packet):
        return None
    if not valid_topic_name(packet.topic):
        return _protocol_error(conn, ReasonCode.TOPIC_NAME_INVALID, "invalid topic name", packet)
    depth = conn.broker.settings.topic_max_depth
    if depth and packet.topic.count("/") >= depth:
        conn.broker.metrics.topic_depth_exceeded += 1
        levels = packet.topic.count("/") + 1
        why = f"topic of {levels} levels, deeper than topic_max_depth ({depth})"
        return _protocol_error(conn, ReasonCode.TOPIC_NAME_INVALID, why, packet)
    if (
        properties
        and properties.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1
        and not _utf8(packet.payload)
    ):
        # Flagged as UTF-8 but is not: refused with 0x99 [MQTT-3.3.2-4].
        if packet.qos:
            ack = PubAck if packet.qos == 1 else PubRec
            return conn.send(ack(_packet_id(packet), ReasonCode.PAYLOAD_FORMAT_INVALID))
        return None
    if packet.qos and conn.broker.store.failed:
        conn.broker.store.commit()  # try again: there may be room by now
        if conn.broker.store.failed:
            return _refuse_unstorable(conn, packet)
    if packet.qos == 2:
        session = conn.session
        assert session is not None  # PUBLISH comes after CONNECT (the decoder sees to it)
        received = session.window.received
        if packet.packet_id in received:  # a resend: acknowledge, do not route twice
            return conn.send(PubRec(_packet_id(packet)))
        if len(received) >= conn.broker.settings.receive_max_broker:
            why = "more QoS 2 messages unreleased than receive_max_broker"
            return _protocol_error(conn, ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, why)
    chain = conn.broker.chains.auth_on_publish[conn.client.protocol_level == MQTT5]
    if not chain:  # no authorization plugin: publishing is allowed
        return _route(conn, packet, None, False)
    context = publish_context(conn, packet)
    conn.decide(chain, context, _authorized_publish, conn, packet, context)


def _protocol_error(conn: Connection, code: int, why: str, packet: Publish | None = None) -> None:
    """A PUBLISH that closes its connection, with the one INFO line every protocol error
    gets (docs/operations.md, Logs), as broker/connection.py logs the decoder's."""
    topic = f" ({_shown(packet.topic)})" if packet is not None else ""
    log.info("%s: protocol error: PUBLISH: %s%s", conn.client.name(), why, topic)
    conn.close(code)


def _shown(topic: str, limit: int = 100) -> str:
    """A topic for a log line: quoted and escaped, and cut if long (a client chose it)."""
    return repr(topic if len(topic) <= limit else topic[:limit] + "...")


def _refuse_unstorable(conn: Connection, packet: Publish) -> None:
    """The store cannot write (a full disk): a QoS 1/2 message is refused, not acknowledged
    (MQTT 5: 0x80 with a Reason String; MQTT 3 has no refusal code: disconnect)."""
    conn.broker.metrics.store_publish_refused += 1
    if conn.client.protocol_level != MQTT5:
        return conn.close()
    ack = PubAck if packet.qos == 1 else PubRec
    reason: dict[int, str] = {Property.REASON_STRING: "the broker cannot store messages now"}
    conn.send(ack(_packet_id(packet), ReasonCode.UNSPECIFIED_ERROR, reason))


def _resolve_alias(conn: Connection, packet: Publish) -> bool:
    """Apply a client's Topic Alias [3.3.2.3.4]: a topic sets it, an empty topic uses it.
    The alias is this connection's business: it is removed before routing."""
    alias = packet.properties.pop(Property.TOPIC_ALIAS)
    if alias > conn.broker.settings.topic_alias_max_broker:  # above what we announced
        why = f"topic alias {alias} above topic_alias_max_broker"
        _protocol_error(conn, ReasonCode.TOPIC_ALIAS_INVALID, why)
        return False
    aliases = conn.client.aliases_in
    if aliases is None:  # the first alias: the client gets a table of its own
        aliases = conn.client.aliases_in = {}
    if packet.topic:
        aliases[alias] = packet.topic
    else:
        topic = aliases.get(alias)
        if topic is None:  # an alias never set on this connection [MQTT-3.3.2-12]
            _protocol_error(conn, ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} never set")
            return False
        packet.topic = topic
    packet.raw = None  # the bytes carry the alias, not (necessarily) the topic
    return True


def _authorized_publish(
    conn: Connection, packet: Publish, context: PublishContext, result: Result
) -> None:
    if type(result) is Ok:
        changed = apply_publish_modifiers(context, result)
        return _route(conn, packet, context, changed)
    log.debug("%s: publish to %r refused: %s", conn.client.name(), packet.topic, result)
    if conn.client.protocol_level == 4:
        conn.client.disconnect_reason = "publish_not_authorized_3_1_1"  # Courier's name
        return conn.close()  # MQTT 3.1.1 has no refusal code: VerneMQ disconnects
    if packet.qos == 0:
        return None
    if conn.client.protocol_level == MQTT5:
        ack = PubAck if packet.qos == 1 else PubRec
        props = refusal_properties(result) if conn.client.problem_info else {}
        return conn.send(ack(_packet_id(packet), publish_refusal(result), props))
    return _acknowledge(conn, packet)  # MQTT 3.1: dropped silently


def _route(
    conn: Connection, packet: Publish, context: PublishContext | None, changed: bool
) -> None:
    """Route an allowed PUBLISH (as the plugins changed it, if they did) and ack it.
    `context`: the auth_on_publish chain's, if one ran (on_publish sees it as it was left)."""
    session = conn.session
    assert session is not None
    if packet.qos == 2:
        session.receive_qos2(_packet_id(packet))
    if not changed:
        message = Message(
            packet.topic,
            packet.payload,
            packet.qos,
            packet.retain,
            packet.properties,
            conn.client.client_id,
            packet.raw,
            conn.client.protocol_level,
            now=conn.loop.time(),
        )
    else:
        assert context is not None
        message = Message(
            context.topic,
            context.payload,
            context.qos,
            context.retain,
            context.properties,
            conn.client.client_id,
            now=conn.loop.time(),
        )
    if context is not None and context.matched_acl is not None:
        message.acl_name = context.matched_acl.name  # deliveries report the publisher's
    if message.topic.startswith("$SYS"):  # $SYS belongs to the broker
        return _acknowledge(conn, packet)
    route_held(conn, packet, message, context)


def route_held(
    conn: Connection, packet: Publish, message: Message, context: PublishContext | None
) -> None:
    """Route an allowed message and acknowledge it, unless a subscriber it goes to has a
    full queue: then the connection keeps it (unacknowledged) and is held, and this runs
    again when it is released. So no queue ever takes a message above its high-water
    mark, however many publishers feed it (broker/flow.py)."""
    broker = conn.broker
    flow = broker.flow
    if flow.congested:  # only while some subscriber holds publishers: costs nothing else
        waiting_for = broker.routing.full_subscribers(message.topic)
        if waiting_for:
            conn.postpone(packet, message, context)
            return flow.hold(conn, waiting_for)
    session = conn.session
    assert session is not None
    chains = broker.chains
    recorder = chains.recorder
    if recorder is not None:  # before routing, as on_publish: it tells the publish first
        recorder.published(conn.client, message, context.matched_acl if context else None)
    on_publish = chains.on_publish[conn.client.protocol_level == MQTT5]
    if on_publish:  # before routing: events tell the publish before its deliveries
        chains.notify(on_publish, context or publish_context(conn, packet))
    full = broker.routing.publish(message, session.shared_policy)
    if full:
        flow.hold(conn, full)
    if chains.on_message_drop and not broker.routing.has_subscribers(message.topic):
        # Courier's: a message nobody subscribed to is dropped, and said so.
        dropped = publish_context(conn, packet)
        dropped.reason = "no_matching_subscribers"
        dropped.matched_acl = context.matched_acl if context is not None else None
        chains.notify(chains.on_message_drop, dropped)
    _acknowledge(conn, packet)


def _packet_id(packet: Publish) -> int:
    """The packet id of a QoS 1/2 PUBLISH (the decoder refuses one without)."""
    assert packet.packet_id is not None
    return packet.packet_id


def _acknowledge(conn: Connection, packet: Publish) -> None:
    if packet.qos == 1:
        conn.broker.metrics.mqtt_puback_sent += 1
        conn.acknowledge(encode_puback(_packet_id(packet)))
    elif packet.qos == 2:
        conn.broker.metrics.mqtt_pubrec_sent += 1
        conn.acknowledge(encode_pubrec(_packet_id(packet)))


def publish_context(conn: Connection, packet: Publish | Will) -> PublishContext:
    """This client's PUBLISH (or the will its CONNECT carries) as hooks see it."""
    client = conn.client
    return new_publish_context(
        client.client_id,
        client.username,
        client.attributes,
        client.session_id,
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.properties,  # plugins change it by modifier, not in place
    )


def on_pubrel(conn: Connection, packet: PubRel) -> None:
    conn.broker.metrics.mqtt_pubrel_received += 1
    conn.broker.metrics.mqtt_pubcomp_sent += 1
    session = conn.session
    assert session is not None
    if session.release_qos2(packet.packet_id):
        code = ReasonCode.SUCCESS
    else:
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
    conn.send(PubComp(packet.packet_id, code if conn.client.protocol_level == MQTT5 else 0))


# -- acknowledgements of our PUBLISHes ---------------------------------------------


def on_puback(conn: Connection, packet: PubAck) -> None:
    conn.broker.metrics.mqtt_puback_received += 1
    session = conn.session
    assert session is not None
    session.on_puback(packet.packet_id)


def on_pubrec(conn: Connection, packet: PubRec) -> None:
    conn.broker.metrics.mqtt_pubrec_received += 1
    session = conn.session
    assert session is not None
    code = session.on_pubrec(packet.packet_id, packet.reason_code)
    if code >= 0:
        conn.broker.metrics.mqtt_pubrel_sent += 1
        conn.send(PubRel(packet.packet_id, code if conn.client.protocol_level == MQTT5 else 0))


def on_pubcomp(conn: Connection, packet: PubComp) -> None:
    conn.broker.metrics.mqtt_pubcomp_received += 1
    session = conn.session
    assert session is not None
    session.on_pubcomp(packet.packet_id)


# -- the rest ----------------------------------------------------------------------
