"""PUBLISH for a client: inbound messages (topic aliases, checks, auth_on_publish,
routing, PUBACK / PUBREC, PUBREL) and the acknowledgements of the messages the broker sent
(PUBACK, PUBREC, PUBCOMP).

Functions over a client's engine (broker/client/engine.py) and its ClientState: nothing
here touches a transport. The hot path runs one way, down the layers: `on_publish` ->
`_route` -> `Routing.publish` (the sessions write their deliveries to their outlets),
then the PUBACK to this client's outlet. After routing, a publisher whose message filled
a subscriber's queue is held (broker/flow.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.authorization import publish_refusal, refusal_properties
from broker.ingress import NETSPLIT, UNSTORABLE, context_of
from broker.message import Message
from broker.mountpoints import inside
from broker.protocol import (
    MQTT5,
    Property,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    encode_puback,
    encode_pubrec,
)
from broker.topics import valid_topic_name
from hooks import MatchedAcl, Ok, PublishContext, Result
from hooks.decisions import GENERATION

if TYPE_CHECKING:
    from broker.client.engine import ClientEngine

log = logging.getLogger("nautilus.connection")

# The fast path of QoS 0 floods: PUBLISHes to one topic that arrived together, up to this
# many bytes, are routed at once (see _route_run).
RUN_BYTES = 64 * 1024
ACKS_AT_ONCE = 256  # PUBACKs from one subscriber handled together (one drain after them)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def on_publish(engine: ClientEngine, packet: Publish) -> None:
    host = engine.host
    client = engine.client
    ingress = host.ingress
    host.metrics.mqtt_publish_received += 1
    if client.max_message_rate:
        engine.count_rate()
    properties = packet.properties  # empty below MQTT 5: the checks on them cost nothing
    if properties and Property.TOPIC_ALIAS in properties and not _resolve_alias(engine, packet):
        return None
    topic = packet.topic
    if not valid_topic_name(topic):
        return _protocol_error(engine, ReasonCode.TOPIC_NAME_INVALID, "invalid topic name", packet)
    depth = host.settings.topic_max_depth
    if depth and topic.count("/") >= depth:
        host.metrics.topic_depth_exceeded += 1
        levels = topic.count("/") + 1
        why = f"topic of {levels} levels, deeper than topic_max_depth ({depth})"
        return _protocol_error(engine, ReasonCode.TOPIC_NAME_INVALID, why, packet)
    if (
        properties
        and properties.get(Property.PAYLOAD_FORMAT_INDICATOR) == 1
        and not _utf8(packet.payload)
    ):
        # Flagged as UTF-8 but is not: refused with 0x99 [MQTT-3.3.2-4].
        if packet.qos:
            ack = PubAck if packet.qos == 1 else PubRec
            return engine.outlet.send(ack(_packet_id(packet), ReasonCode.PAYLOAD_FORMAT_INVALID))
        return None
    # Admission comes after the rules of the connection: a message dropped in a netsplit
    # still sets the topic alias it carries, which the client's next ones use.
    closed = ingress.closed_for(packet.qos)
    if closed is NETSPLIT:
        # As VerneMQ: QoS 0 is dropped, QoS 1/2 get no acknowledgement, so the client
        # sends them again.
        return None
    if closed is UNSTORABLE:
        return _refuse_unstorable(engine, packet)
    if packet.qos == 2:
        session = engine.session
        assert session is not None  # PUBLISH comes after CONNECT (the decoder sees to it)
        received = session.window.received
        if packet.packet_id in received:  # a resend: acknowledge, do not route twice
            return engine.outlet.send(PubRec(_packet_id(packet)))
        if len(received) >= engine.host.settings.receive_max_broker:
            why = "more QoS 2 messages unreleased than receive_max_broker"
            return _protocol_error(engine, ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, why)
    chain = ingress.authorizer(client.protocol_level == MQTT5)
    if chain is None:  # no authorization plugin: publishing is allowed
        if not (packet.qos or properties or client.max_message_rate):
            run = engine.decoder.take_like(packet, RUN_BYTES)
            if run:
                return _route_run(engine, [packet, *run])
        return _route(engine, packet, None, False)
    if client.decisions is not None:  # the chain said how long some answers hold
        kept = ingress.recall(client, packet, engine.clock())
        if kept is not None:
            return _kept_publish(engine, packet, kept)
    context = context_of(client, packet)
    generation = GENERATION.value  # an answer is kept only if nothing is forgotten meanwhile
    if chain.synchronous:  # every plugin decides at once: inline, the hot path
        return _decided(engine, packet, context, generation, chain.run_sync(context))
    engine.decide_later(chain, context, _decided, engine, packet, context, generation)


def _decided(
    engine: ClientEngine,
    packet: Publish,
    context: PublishContext,
    generation: int,
    result: Result,
) -> None:
    """The chain's answer: kept for the next messages like this one if every plugin said
    how long it holds (Ingress.remember), then carried out."""
    if result.cache_for is not None:
        engine.host.ingress.remember(engine.client, packet, result, engine.clock(), generation)
    _authorized_publish(engine, packet, context, result)


def _kept_publish(engine: ClientEngine, packet: Publish, kept: Result) -> None:
    """A PUBLISH decided by the chain's kept answer: carried out as if the chain had just
    given it. One it allows unchanged (naming an ACL rule at most) goes as with no plugin:
    a run of QoS 0 ones takes the fast path, and no context is made for it unless an event
    needs one."""
    client = engine.client
    if type(kept) is Ok:
        modifiers = kept.modifiers
        if not modifiers or (len(modifiers) == 1 and "matched_acl" in modifiers):
            if not (packet.qos or packet.properties or client.max_message_rate):
                run = engine.decoder.take_like(packet, RUN_BYTES)
                if run:
                    return _route_run(engine, [packet, *run], kept)
            if not engine.host.ingress.tells(client.protocol_level == MQTT5):
                return _route(engine, packet, None, False, modifiers.get("matched_acl"))
    return _authorized_publish(engine, packet, context_of(client, packet), kept)


def _protocol_error(
    engine: ClientEngine, code: int, why: str, packet: Publish | None = None
) -> None:
    """A PUBLISH that closes its connection, with the one INFO line every protocol error
    gets (docs/operations.md, Logs), as the engine logs the decoder's."""
    topic = f" ({_shown(packet.topic)})" if packet is not None else ""
    log.info("%s: protocol error: PUBLISH: %s%s", engine.client.name(), why, topic)
    engine.close(code)


def _shown(topic: str, limit: int = 100) -> str:
    """A topic for a log line: quoted and escaped, and cut if long (a client chose it)."""
    return repr(topic if len(topic) <= limit else topic[:limit] + "...")


def _refuse_unstorable(engine: ClientEngine, packet: Publish) -> None:
    """The store cannot write (a full disk): a QoS 1/2 message is refused, not acknowledged
    (MQTT 5: 0x80 with a Reason String; MQTT 3 has no refusal code: disconnect)."""
    engine.host.metrics.store_publish_refused += 1
    if engine.client.protocol_level != MQTT5:
        return engine.close()
    ack = PubAck if packet.qos == 1 else PubRec
    reason: dict[int, str] = {Property.REASON_STRING: UNSTORABLE}
    engine.outlet.send(ack(_packet_id(packet), ReasonCode.UNSPECIFIED_ERROR, reason))


def _resolve_alias(engine: ClientEngine, packet: Publish) -> bool:
    """Apply a client's Topic Alias [3.3.2.3.4]: a topic sets it, an empty topic uses it.
    The alias is this connection's business: it is removed before routing."""
    alias = packet.properties.pop(Property.TOPIC_ALIAS)
    if alias > engine.host.settings.topic_alias_max_broker:  # above what we announced
        why = f"topic alias {alias} above topic_alias_max_broker"
        _protocol_error(engine, ReasonCode.TOPIC_ALIAS_INVALID, why)
        return False
    aliases = engine.client.aliases_in
    if aliases is None:  # the first alias: the client gets a table of its own
        aliases = engine.client.aliases_in = {}
    if packet.topic:
        aliases[alias] = packet.topic
    else:
        topic = aliases.get(alias)
        if topic is None:  # an alias never set on this connection [MQTT-3.3.2-12]
            _protocol_error(engine, ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} never set")
            return False
        packet.topic = topic
    packet.raw = None  # the bytes carry the alias, not (necessarily) the topic
    return True


def _authorized_publish(
    engine: ClientEngine, packet: Publish, context: PublishContext, result: Result
) -> None:
    decision = engine.host.ingress.decided(context, result)
    if decision.allowed:
        return _route(engine, packet, context, decision.changed)
    log.debug("%s: publish to %r refused: %s", engine.client.name(), packet.topic, result)
    if engine.client.protocol_level == 4:
        engine.client.disconnect_reason = "publish_not_authorized_3_1_1"  # Courier's name
        return engine.close()  # MQTT 3.1.1 has no refusal code: VerneMQ disconnects
    if packet.qos == 0:
        return None
    if engine.client.protocol_level == MQTT5:
        ack = PubAck if packet.qos == 1 else PubRec
        props = refusal_properties(result) if engine.client.problem_info else {}
        return engine.outlet.send(ack(_packet_id(packet), publish_refusal(result), props))
    return _acknowledge(engine, packet)  # MQTT 3.1: dropped silently


def _route(
    engine: ClientEngine,
    packet: Publish,
    context: PublishContext | None,
    changed: bool,
    matched: MatchedAcl | None = None,
) -> None:
    """Route an allowed PUBLISH (as the plugins changed it, if they did) and ack it.
    `context`: the auth_on_publish chain's, if one ran (on_publish sees it as it was left);
    `matched`: the ACL rule a kept answer names, when no event needs a context."""
    session = engine.session
    assert session is not None
    if packet.qos == 2:
        session.receive_qos2(_packet_id(packet))
    client = engine.client
    if not changed:
        if packet.topic.startswith("$SYS"):  # $SYS belongs to the broker
            return _acknowledge(engine, packet)
        properties = packet.properties
        message = Message(
            inside(client.mountpoint, packet.topic) if client.mountpoint else packet.topic,
            packet.payload,
            packet.qos,
            packet.retain,
            properties,
            client.subscriber_id,
            packet.raw,  # its topic is the subscribers' too: they are on the same tree
            client.protocol_level,
            now=engine.clock() if properties else None,  # for an expiry interval only
        )
        if matched is not None:
            message.acl_name = matched.name  # deliveries report the publisher's rule
    else:
        assert context is not None
        if context.topic.startswith("$SYS"):
            return _acknowledge(engine, packet)
        message = engine.host.ingress.message(context, client.subscriber_id, engine.clock())
    route_held(engine, packet, message, context)


def _route_run(engine: ClientEngine, packets: list[Publish], kept: Ok | None = None) -> None:
    """Route a run of QoS 0 PUBLISHes to one topic, unretained and without properties,
    that no plugin authorizes or changes (or that the chain's `kept` answer allows
    unchanged): in one piece where the ingress can (Ingress.publish_run), else one at a
    time, as always. Either way, what each subscriber receives and in which order, and
    what is recorded, is the same."""
    host = engine.host
    matched = kept.modifiers.get("matched_acl") if kept is not None else None
    if host.ingress.publish_run(engine.client, packets, matched):
        host.metrics.mqtt_publish_received += len(packets) - 1  # the first is counted
        return None
    for i, packet in enumerate(packets):
        if i:
            host.metrics.mqtt_publish_received += 1
        if kept is None:
            _route(engine, packet, None, False)
        else:
            _authorized_publish(engine, packet, context_of(engine.client, packet), kept)
        if engine.closing or engine.gate.closed:
            # Held by flow control (or closed): the rest waits in the decoder, unread.
            return engine.decoder.give_back(packets[i + 1 :])
    return None


def route_held(
    engine: ClientEngine, packet: Publish, message: Message, context: PublishContext | None
) -> None:
    """Route an allowed message and acknowledge it, unless a subscriber it goes to has a
    full queue: then the engine keeps it (unacknowledged) and is held, and this runs
    again when it is released. So no queue ever takes a message above its high-water
    mark, however many publishers feed it (broker/flow.py)."""
    host = engine.host
    ingress = host.ingress
    waiting_for = ingress.waits_for(message.topic)
    if waiting_for:
        engine.postpone(packet, message, context)
        return ingress.hold(engine, waiting_for)
    session = engine.session
    assert session is not None
    client = engine.client
    v5 = client.protocol_level == MQTT5
    full = ingress.publish(message, client, v5, context, packet, session.shared_policy)
    if full:
        ingress.hold(engine, full)
    _acknowledge(engine, packet)


def _packet_id(packet: Publish) -> int:
    """The packet id of a QoS 1/2 PUBLISH (the decoder refuses one without)."""
    assert packet.packet_id is not None
    return packet.packet_id


def _acknowledge(engine: ClientEngine, packet: Publish) -> None:
    if packet.qos == 1:
        engine.host.metrics.mqtt_puback_sent += 1
        engine.outlet.acknowledge(encode_puback(_packet_id(packet)))
    elif packet.qos == 2:
        engine.host.metrics.mqtt_pubrec_sent += 1
        engine.outlet.acknowledge(encode_pubrec(_packet_id(packet)))


def on_pubrel(engine: ClientEngine, packet: PubRel) -> None:
    engine.host.metrics.mqtt_pubrel_received += 1
    engine.host.metrics.mqtt_pubcomp_sent += 1
    session = engine.session
    assert session is not None
    if session.release_qos2(packet.packet_id):
        code = ReasonCode.SUCCESS
    else:
        code = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
    engine.outlet.send(
        PubComp(packet.packet_id, code if engine.client.protocol_level == MQTT5 else 0)
    )


# -- acknowledgements of our PUBLISHes ---------------------------------------------


def on_puback(engine: ClientEngine, packet: PubAck) -> None:
    # The PUBACKs that came with it too: their window slots are refilled in one drain.
    ids = [packet.packet_id, *engine.decoder.take_acks(ACKS_AT_ONCE)]
    engine.host.metrics.mqtt_puback_received += len(ids)
    session = engine.session
    assert session is not None
    session.on_pubacks(ids)


def on_pubrec(engine: ClientEngine, packet: PubRec) -> None:
    engine.host.metrics.mqtt_pubrec_received += 1
    session = engine.session
    assert session is not None
    code = session.on_pubrec(packet.packet_id, packet.reason_code)
    if code >= 0:
        engine.host.metrics.mqtt_pubrel_sent += 1
        engine.outlet.send(
            PubRel(packet.packet_id, code if engine.client.protocol_level == MQTT5 else 0)
        )


def on_pubcomp(engine: ClientEngine, packet: PubComp) -> None:
    engine.host.metrics.mqtt_pubcomp_received += 1
    session = engine.session
    assert session is not None
    session.on_pubcomp(packet.packet_id)
