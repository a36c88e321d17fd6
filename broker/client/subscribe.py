"""SUBSCRIBE and UNSUBSCRIBE for a client: filters, plugins, SUBACK, retained.

Functions over a client's engine (broker/client/engine.py) and its ClientState: the
subscription side of the protocol in one place, apart from the PUBLISH path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.authorization import ack_properties, granted_topics, refusal_properties
from broker.mountpoints import inside
from broker.protocol import MQTT5, Property, ReasonCode, Subscribe, UnsubAck, Unsubscribe
from broker.protocol import SubAck as SubAckPacket
from broker.subscription_trie import SHARE_PREFIX, parse_shared, shared_options
from broker.topics import valid_topic_filter
from hooks import Error, Ok, Result, SubscribeContext, TopicRequest, UnsubscribeContext

if TYPE_CHECKING:
    from broker.client.engine import ClientEngine

ALLOWED = Ok()  # the verdict when no plugin has a say


def on_subscribe(engine: ClientEngine, packet: Subscribe) -> None:
    engine.host.metrics.mqtt_subscribe_received += 1
    peers = engine.host.peers
    if peers.split and (why := peers.refuses("subscribe")) is not None:
        # A netsplit (allow_subscribe_during_netsplit off): every filter refused.
        refused = [0x80] * len(packet.subscriptions)
        engine.outlet.send(SubAckPacket(packet.packet_id, refused, _why(engine, why)))
        engine.host.metrics.mqtt_suback_sent += 1
        return None
    codes: list[int | None] = []  # None: valid, decided by the plugins below
    requests: list[TopicRequest] = []
    for sub in packet.subscriptions:
        if sub.no_local and sub.topic_filter.startswith(SHARE_PREFIX):
            # No Local on a shared subscription is a Protocol Error [MQTT-3.8.3-4].
            return engine.close(ReasonCode.PROTOCOL_ERROR)
        code = _filter_problem(engine, sub.topic_filter, requests)
        codes.append(code)
        if code is None:
            requests.append(
                TopicRequest(
                    topic=sub.topic_filter,
                    qos=sub.qos,
                    no_local=sub.no_local,
                    retain_as_published=sub.retain_as_published,
                    retain_handling=sub.retain_handling,
                )
            )
    chain = engine.host.chains.auth_on_subscribe[engine.client.protocol_level == MQTT5]
    if not chain or not requests:  # no authorization plugin: subscribing is allowed
        return _subscribe(engine, packet, codes, [(r, r.qos) for r in requests], ALLOWED)
    context = SubscribeContext(
        client_id=engine.client.client_id,
        mountpoint=engine.client.mountpoint,
        username=engine.client.username,
        attributes=engine.client.attributes,
        session_id=engine.client.session_id,
        topics=requests,
        properties=packet.properties,
    )
    if chain.synchronous:
        return _authorized_subscribe(engine, packet, codes, context, chain.run_sync(context))
    engine.decide_later(chain, context, _authorized_subscribe, engine, packet, codes, context)


def _authorized_subscribe(
    engine: ClientEngine,
    packet: Subscribe,
    codes: list[int | None],
    context: SubscribeContext,
    result: Result,
) -> None:
    granted = granted_topics(context.topics, result, engine.client.protocol_level)
    _subscribe(engine, packet, codes, granted, result)


def _filter_problem(
    engine: ClientEngine, topic_filter: str, earlier: list[TopicRequest]
) -> int | None:
    """The SUBACK failure code for a filter we cannot take, None for a good one
    (`earlier`: the filters of this SUBSCRIBE already taken, for the quota)."""
    v5 = engine.client.protocol_level == MQTT5
    shared = parse_shared(topic_filter)
    if shared is not None:  # $share/<group>/<filter>
        group, inner = shared
        if not group or "+" in group or "#" in group or not valid_topic_filter(inner):
            return ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80
    elif not valid_topic_filter(topic_filter):
        return ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80
    depth = engine.host.settings.topic_max_depth
    inner = topic_filter if shared is None else shared[1]
    if depth and inner.count("/") >= depth:
        engine.host.metrics.topic_depth_exceeded += 1
        return ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80
    limit = engine.host.settings.max_subscriptions_per_client
    assert engine.session is not None  # SUBSCRIBE comes after CONNECT (the decoder sees to it)
    subscriptions = engine.session.subscriptions
    mountpoint = engine.client.mountpoint
    if (
        limit
        and inside(mountpoint, topic_filter) not in subscriptions
        and len(subscriptions)
        + sum(inside(mountpoint, r.topic) not in subscriptions for r in earlier)
        >= limit
    ):
        engine.host.metrics.subscription_limit_exceeded += 1
        return ReasonCode.QUOTA_EXCEEDED if v5 else 0x80
    return None


def _subscribe(
    engine: ClientEngine,
    packet: Subscribe,
    codes: list,
    granted: list[tuple[TopicRequest, int]],
    result: Result,
) -> None:
    """Subscribe what was granted, answer SUBACK, then send the retained messages.
    on_subscribe fires only when the plugins allowed the request (`result` Ok)."""
    session = engine.session
    assert session is not None
    sub_ids = packet.properties.get(Property.SUBSCRIPTION_IDENTIFIER)
    sub_id = sub_ids[0] if sub_ids else None
    decisions = iter(granted)
    retained = []
    for i, code in enumerate(codes):
        if code is not None:
            continue
        request, codes[i] = next(decisions)
        if codes[i] > 2:
            continue
        options = shared_options(
            codes[i],
            request.no_local,
            request.retain_as_published,
            request.retain_handling,
            sub_id,
        )
        topic_filter = inside(engine.client.mountpoint, request.topic)
        is_new = engine.host.registry.subscribe(session.owner, topic_filter, options)
        # Retain Handling 0: send retained; 1: only for a new subscription; 2: never.
        # A shared subscription gets no retained messages [MQTT-4.8.2].
        if request.topic.startswith(SHARE_PREFIX):
            continue
        if request.retain_handling == 0 or (request.retain_handling == 1 and is_new):
            retained.append((topic_filter, options))
    props = {}
    if (
        type(result) is Error
        and engine.client.protocol_level == MQTT5
        and engine.client.problem_info
    ):
        props = refusal_properties(result)
    engine.outlet.send(SubAckPacket(packet.packet_id, codes, props))
    engine.host.metrics.mqtt_suback_sent += 1
    for topic_filter, options in retained:
        engine.host.registry.send_retained(session, topic_filter, options)
    chains = engine.host.chains
    on_subscribe = chains.on_subscribe[engine.client.protocol_level == MQTT5]
    if on_subscribe and granted and type(result) is Ok:
        topics = [
            TopicRequest(
                topic=request.topic,
                qos=code,
                no_local=request.no_local,
                retain_as_published=request.retain_as_published,
                retain_handling=request.retain_handling,
                matched_acl=request.matched_acl,
            )
            for request, code in granted
        ]
        chains.notify(
            on_subscribe,
            SubscribeContext(
                client_id=engine.client.client_id,
                mountpoint=engine.client.mountpoint,
                username=engine.client.username,
                attributes=engine.client.attributes,
                session_id=engine.client.session_id,
                topics=topics,
                properties=packet.properties,
            ),
        )


def on_unsubscribe(engine: ClientEngine, packet: Unsubscribe) -> None:
    engine.host.metrics.mqtt_unsubscribe_received += 1
    peers = engine.host.peers
    if peers.split and (why := peers.refuses("unsubscribe")) is not None:
        # A netsplit (allow_unsubscribe_during_netsplit off). MQTT 5 says so per filter;
        # an MQTT 3 UNSUBACK cannot refuse: the connection closes instead of lying.
        if engine.client.protocol_level != MQTT5:
            return engine.close()
        refused: list[int] = [ReasonCode.UNSPECIFIED_ERROR] * len(packet.topic_filters)
        engine.outlet.send(UnsubAck(packet.packet_id, refused, _why(engine, why)))
        engine.host.metrics.mqtt_unsuback_sent += 1
        return None
    chain = engine.host.chains.on_unsubscribe[engine.client.protocol_level == MQTT5]
    if not chain:
        return _unsubscribe(engine, packet, packet.topic_filters, ALLOWED)
    context = UnsubscribeContext(
        client_id=engine.client.client_id,
        mountpoint=engine.client.mountpoint,
        username=engine.client.username,
        attributes=engine.client.attributes,
        session_id=engine.client.session_id,
        topics=list(packet.topic_filters),
        properties=packet.properties,
    )
    if chain.synchronous:
        return _decided_unsubscribe(engine, packet, context, chain.run_sync(context))
    engine.decide_later(chain, context, _decided_unsubscribe, engine, packet, context)


def _decided_unsubscribe(
    engine: ClientEngine, packet: Unsubscribe, context: UnsubscribeContext, result: Result
) -> None:
    _unsubscribe(engine, packet, _unsubscribe_topics(context, result), result)


def _unsubscribe_topics(context: UnsubscribeContext, result) -> list[str]:
    """on_unsubscribe may rewrite the filters (Ok with `topics`); errors are ignored."""
    if type(result) is Ok and "topics" in result.modifiers:
        rewritten = [t if isinstance(t, str) else t[0] for t in result.modifiers["topics"]]
        if len(rewritten) == len(context.topics):
            return rewritten
    return context.topics


def _unsubscribe(
    engine: ClientEngine, packet: Unsubscribe, topic_filters: list[str], result: Result
) -> None:
    codes: list[int] = []
    session = engine.session
    assert session is not None
    for topic_filter in topic_filters:
        topic_filter = inside(engine.client.mountpoint, topic_filter)
        found = engine.host.registry.unsubscribe(session.owner, topic_filter)
        codes.append(ReasonCode.SUCCESS if found else ReasonCode.NO_SUBSCRIPTION_EXISTED)
    if engine.client.protocol_level != MQTT5:
        unsuback = UnsubAck(packet.packet_id)
    else:
        props = {}
        if type(result) is Ok and engine.client.problem_info:
            # on_unsubscribe_m5 may answer with a Reason String and User Properties.
            props = ack_properties(result.modifiers.get("properties", {}))
        unsuback = UnsubAck(packet.packet_id, codes, props)
    engine.outlet.send(unsuback)
    engine.host.metrics.mqtt_unsuback_sent += 1


def _why(engine: ClientEngine, why: str) -> dict[int, Any]:
    """A refusal's Reason String, for an MQTT 5 client that did not opt out of them."""
    if engine.client.protocol_level == MQTT5 and engine.client.problem_info:
        return {Property.REASON_STRING: why}
    return {}
