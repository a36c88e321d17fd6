"""CONNECT for a client: validation, enhanced authentication, auth plugins, the session,
CONNACK.

Functions over a client's engine (broker/client/engine.py) and its ClientState
(broker/client_state.py), which they move from awaiting-connect through authenticating
to connected; DISCONNECT ends here too. The order follows VerneMQ: on_auth_m5 (MQTT 5
enhanced authentication, [4.12]), auth_on_register (unless allow_anonymous), the will's
auth_on_publish, then the registry (takeover, clean start, expiry), on_register,
on_client_wakeup, CONNACK, and the resumed session's redelivery.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from broker.authorization import (
    ack_properties,
    refusal_properties,
    refusal_reason,
    register_refusal,
    session_limits,
    subscriber_pair,
)
from broker.client_state import AUTHENTICATING, CONNECTED
from broker.enhanced_auth import CONTINUE, SUCCESS, AuthExchange
from broker.episodes import Episode
from broker.ingress import context_of
from broker.message import Message, TopicAliases
from broker.mountpoints import inside, subscriber_id
from broker.peers import MetadataUnavailable, Registration, StaleRequest
from broker.protocol import (
    MQTT5,
    V3_CONNACK_CODE,
    Auth,
    ConnAck,
    Connect,
    ConnectReturnCode,
    Disconnect,
    Property,
    ReasonCode,
)
from broker.topics import valid_topic_name
from hooks import AuthContext, Chain, Ok, RegisterContext, Result
from hooks.results import NO_HOOK

if TYPE_CHECKING:
    from broker.client.engine import ClientEngine, ClientServices

log = logging.getLogger("nautilus.connection")

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never" [3.1.2.11.2]
REFUSALS_INTERVAL = 10.0  # seconds between two lines counting CONNECTs refused (an outage)

# Per broker: the CONNECTs refused because the cluster's metadata is away. During a Redis
# outage every client refused retries at once, thousands a second: the first refusal is
# logged, then a count per REFUSALS_INTERVAL, then the first registration that works.
_refusals: weakref.WeakKeyDictionary[ClientServices, Episode] = weakref.WeakKeyDictionary()


def _cluster_refusals(broker: ClientServices) -> Episode:
    refusals = _refusals.get(broker)
    if refusals is None:
        refusals = _refusals[broker] = Episode(
            log, "connects refused", broker.loop, interval=REFUSALS_INTERVAL
        )
    return refusals


def on_connect(engine: ClientEngine, packet: Connect) -> None:
    engine.client.advance(AUTHENTICATING)  # until CONNACK: see broker/client_state.py
    engine.client.protocol_level = level = packet.protocol_level
    engine.host.metrics.mqtt_connect_received += 1
    # Binds every packet we send from now on, a refusing CONNACK too [MQTT-3.1.2-24].
    engine.client.max_packet_out = packet.properties.get(Property.MAXIMUM_PACKET_SIZE, 0)
    client_id = packet.client_id
    assigned = None
    if not client_id:
        # [MQTT-3.1.3-6/8]: 3.1.1 assigns an id only to clean sessions; 3.1 never does.
        if level == 3 or (level == 4 and not packet.clean_start):
            return refuse(engine, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        client_id = assigned = f"auto-{uuid.uuid4().hex}"
    elif len(client_id) > engine.host.settings.max_client_id_size:
        return refuse(engine, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
    if packet.will is not None and not valid_topic_name(packet.will.topic):
        return refuse(engine, ReasonCode.TOPIC_NAME_INVALID)
    engine.client.client_id = client_id
    listener = engine.listener.settings
    engine.client.mountpoint = listener.mountpoint
    # use_identity_as_username: the certificate's CN, whatever CONNECT says; a certificate
    # without one is refused (as Mosquitto does), not let through to a password check.
    if listener.use_identity_as_username and not engine.client.identity:
        return refuse(engine, ReasonCode.NOT_AUTHORIZED)
    engine.client.username = engine.client.identity or packet.username
    engine.client.problem_info = packet.properties.get(Property.REQUEST_PROBLEM_INFORMATION, 1) == 1
    settings = engine.host.settings
    if settings.server_reference:
        # This node is being drained: send clients elsewhere [4.11] (MQTT 3: "unavailable").
        moved = ReasonCode.SERVER_MOVED if settings.server_moved else ReasonCode.USE_ANOTHER_SERVER
        return refuse(engine, moved, {Property.SERVER_REFERENCE: settings.server_reference})
    method = packet.properties.get(Property.AUTHENTICATION_METHOD) if level == MQTT5 else None
    if method is not None:  # enhanced authentication comes first [4.12]
        chain = engine.host.chains.on_auth_m5
        if not chain:
            return refuse(engine, ReasonCode.BAD_AUTHENTICATION_METHOD)
        engine.auth_exchange = AuthExchange(chain, method)
        engine.client.pending_connect = (packet, assigned)
        engine.spawn(_auth_step(engine, packet.properties.get(Property.AUTHENTICATION_DATA)))
        return
    _authenticate(engine, packet, assigned, {})


def _authenticate(
    engine: ClientEngine, packet: Connect, assigned: str | None, auth_props: dict
) -> None:
    """auth_on_register and the will's auth_on_publish, then CONNACK (`auth_props`:
    what enhanced authentication adds to it)."""
    chains = engine.host.chains
    level = engine.client.protocol_level
    v5 = level == MQTT5
    register = None
    # Anonymous access, or a client the certificate authenticated (use_identity_as_username):
    # then auth_on_register is skipped.
    if not (engine.host.settings.allow_anonymous or engine.client.identity):
        register = chains.auth_on_register[v5]
    will_check = None
    if packet.will is not None:
        will_check = chains.auth_on_publish[v5] or None
    if register is None and will_check is None:
        return _accept(engine, packet, assigned, {}, auth_props)
    context = RegisterContext(
        client_id=engine.client.client_id,
        mountpoint=engine.client.mountpoint,
        username=engine.client.username,
        attributes=engine.client.attributes,
        session_id=engine.client.session_id,
        peer=engine.client.peer[:2],
        password=packet.password,
        clean_start=packet.clean_start,
        protocol_level=level,
        properties=packet.properties,
        **_listener_fields(engine),
    )
    if register is None:
        return _check_will(engine, packet, assigned, context, {}, will_check, auth_props)
    args = (engine, packet, assigned, context, will_check, auth_props)
    if not register:  # authentication is required and no plugin does it: refused
        return _registered(*args, NO_HOOK)
    if register.synchronous:
        return _registered(*args, register.run_sync(context))
    engine.decide_later(register, context, _registered, *args)


def _registered(
    engine: ClientEngine,
    packet: Connect,
    assigned: str | None,
    context: RegisterContext,
    will_check: Chain | None,
    auth_props: dict,
    result: Result,
) -> None:
    """auth_on_register(_m5) decided: refuse, or apply its modifiers and check the will."""
    if type(result) is not Ok:
        return _register_failed(engine, context, result, register_refusal(result))
    modifiers = dict(result.modifiers)
    _apply_register_modifiers(engine, packet, context, modifiers)
    _check_will(engine, packet, assigned, context, modifiers, will_check, auth_props)


def _check_will(
    engine: ClientEngine,
    packet: Connect,
    assigned: str | None,
    context: RegisterContext,
    modifiers: dict,
    will_check: Chain | None,
    auth_props: dict,
) -> None:
    """The will's auth_on_publish, if a plugin implements it, then CONNACK."""
    if will_check is None:
        return _accept(engine, packet, assigned, modifiers, auth_props)
    assert packet.will is not None
    will = context_of(engine.client, packet.will)
    args = (engine, packet, assigned, context, modifiers, auth_props)
    if will_check.synchronous:
        return _will_checked(*args, will_check.run_sync(will))
    engine.decide_later(will_check, will, _will_checked, *args)


def _will_checked(
    engine: ClientEngine,
    packet: Connect,
    assigned: str | None,
    context: RegisterContext,
    modifiers: dict,
    auth_props: dict,
    result: Result,
) -> None:
    if type(result) is not Ok:
        # VerneMQ answers a refused will with CONNACK 5 / not authorized.
        return _register_failed(engine, context, result, ReasonCode.NOT_AUTHORIZED)
    _accept(engine, packet, assigned, modifiers, auth_props)


def _apply_register_modifiers(
    engine: ClientEngine, packet: Connect, context: RegisterContext, modifiers: dict
) -> None:
    if "username" in modifiers:
        engine.client.username = context.username = modifiers["username"]
    if "client_id" in modifiers:
        engine.client.client_id = context.client_id = modifiers["client_id"]
    # A mountpoint alone moves the client to that tree (VerneMQ ignored it: its issues 332,
    # 476, 559, 1212); `subscriber_id` is VerneMQ's pair of both.
    if "subscriber_id" in modifiers:
        mountpoint, client_id = subscriber_pair(modifiers["subscriber_id"])
        engine.client.mountpoint = context.mountpoint = mountpoint
        engine.client.client_id = context.client_id = client_id
    if "mountpoint" in modifiers:
        engine.client.mountpoint = context.mountpoint = modifiers["mountpoint"]
    for key in ("clean_start", "clean_session"):
        if key in modifiers:
            packet.clean_start = modifiers[key]
    if modifiers.get("max_message_size"):
        engine.decoder.max_packet_size = modifiers["max_message_size"]
    if "max_message_rate" in modifiers:
        engine.client.max_message_rate = modifiers["max_message_rate"]


def _register_failed(engine: ClientEngine, context: RegisterContext, result, code: int) -> None:
    reason = refusal_reason(result)
    chains = engine.host.chains
    chain = chains.on_register_failed
    if chain:
        context.reason = reason
        context.password = None  # events (and the event relay) never see credentials
        chains.notify(chain, context)
    if not engine.closing:
        refuse(engine, code, refusal_properties(result), why=reason)


def _accept(
    engine: ClientEngine, packet: Connect, assigned: str | None, modifiers: dict, auth_props: dict
) -> None:
    """The client may connect: set up will, keepalive and session, send CONNACK."""
    client = engine.client
    client.advance(CONNECTED)
    level = client.protocol_level
    props = packet.properties
    client.subscriber_id = subscriber_id(client.mountpoint, client.client_id)
    if packet.will is not None:
        will = packet.will
        client.will_delay = will.properties.pop(Property.WILL_DELAY_INTERVAL, 0)
        client.will = Message(
            inside(client.mountpoint, will.topic),
            will.payload,
            will.qos,
            will.retain,
            will.properties,
            client.subscriber_id,
            now=engine.clock(),
        )
    engine.client.keepalive = packet.keepalive
    server_keepalive = _server_keepalive(engine)
    if server_keepalive is not None:
        engine.client.keepalive = server_keepalive
    alias_room = min(
        props.get(Property.TOPIC_ALIAS_MAXIMUM, 0), engine.host.settings.topic_alias_max_client
    )
    if alias_room:
        engine.client.aliases_out = TopicAliases(alias_room)
    engine.connected()  # the connect timeout ends, the keepalive watch begins
    if level == MQTT5:
        expiry = props.get(Property.SESSION_EXPIRY_INTERVAL, 0)
        expiry = None if expiry == NEVER_EXPIRES else expiry
    elif packet.clean_start:
        expiry = 0
    else:
        expiry = engine.host.settings.persistent_client_expiration or None
    # In a cluster the client id is registered cluster-wide first (broker/peers.py).
    registering = engine.host.peers.register(client.subscriber_id, expiry == 0)
    if registering is not None:
        engine.spawn(
            _register_in_cluster(
                engine,
                registering,
                packet,
                assigned,
                modifiers,
                auth_props,
                expiry,
                server_keepalive,
            )
        )
        return
    _attach(engine, packet, assigned, modifiers, auth_props, expiry, server_keepalive, None)


async def _register_in_cluster(
    engine: ClientEngine,
    registering: Coroutine[Any, Any, Registration | None],
    packet: Connect,
    assigned: str | None,
    modifiers: dict,
    auth_props: dict,
    expiry: int | None,
    server_keepalive: int | None,
) -> None:
    """Courier's remap: this node owns the client id from now on; the node that held it
    has released it (its queue follows) before the CONNACK goes out."""
    try:
        registration = await registering
    except MetadataUnavailable as exc:
        # The first refusal of an outage in full, then counts (a line per 10 s).
        _cluster_refusals(engine.host).occurred(
            "%s: connection refused (reason 0x88): cannot register in the cluster: %s "
            "(while this lasts, refused CONNECTs are counted: one line per %d s)",
            engine.client.name(),
            exc,
            REFUSALS_INTERVAL,
            reason="metadata unavailable",
        )
        if not engine.closing:
            refuse(engine, ReasonCode.SERVER_UNAVAILABLE, quiet=True)
        return
    except StaleRequest as exc:
        log.warning("%s: cannot register in the cluster: %s", engine.client.name(), exc)
        if not engine.closing:
            refuse(engine, ReasonCode.SERVER_UNAVAILABLE)
        return
    if registration is not None:
        refusals = _refusals.get(engine.host)
        if refusals is not None:
            refusals.ended("cluster registrations work again: connects accepted")
    args = (engine, packet, assigned, modifiers, auth_props, expiry, server_keepalive)
    _attach(*args, registration)


def _attach(
    engine: ClientEngine,
    packet: Connect,
    assigned: str | None,
    modifiers: dict,
    auth_props: dict,
    expiry: int | None,
    server_keepalive: int | None,
    registration: Registration | None,
) -> None:
    """The session (taken over, resumed or new) and the CONNACK."""
    level = engine.client.protocol_level
    props = packet.properties
    registry = engine.host.registry
    key = engine.client.subscriber_id
    known = key in registry
    session, present = registry.connect(key, packet.clean_start, expiry)
    engine.host.peers.registered(key, session, registration, fresh=not known)
    if registration is not None and registration.existed and not packet.clean_start:
        present = True  # the session lived on another node
    if engine.closing:  # the client left while the cluster registered it: offline now
        registry.disconnected(session, None, 0, engine.client_context())
        return
    session.apply_limits(session_limits(modifiers))
    engine.session = session
    chains = engine.host.chains
    on_register = chains.on_register[level == MQTT5]
    if on_register:
        chains.notify(on_register, _register_event(engine, packet))
    if chains.on_client_wakeup:
        chains.notify(chains.on_client_wakeup, engine.client_context())
    connack_props = {**_connack_properties(engine, assigned), **auth_props}
    if level == MQTT5 and "properties" in modifiers:
        # auth_on_register_m5 may add User Properties (and a Reason String).
        connack_props.update(ack_properties(modifiers["properties"]))
    if server_keepalive is not None:
        connack_props = {**connack_props, Property.SERVER_KEEP_ALIVE: server_keepalive}
    response_information = engine.host.settings.response_information
    if response_information and props.get(Property.REQUEST_RESPONSE_INFORMATION):
        # [3.1.2.11.7]: only when asked for; %c stands for the client id.
        info = response_information.replace("%c", engine.client.client_id)
        connack_props = {**connack_props, Property.RESPONSE_INFORMATION: info}
    engine.outlet.send(ConnAck(ReasonCode.SUCCESS, present, connack_props))
    engine.host.metrics.connack_sent(ConnectReturnCode.ACCEPTED)
    engine.attach(session, props.get(Property.RECEIVE_MAXIMUM, 65535))


def _server_keepalive(engine: ClientEngine) -> int | None:
    """`max_keepalive` caps what an MQTT 5 client asked for (0 counts as "forever"),
    told in CONNACK's Server Keep Alive [MQTT-3.2.2-21]; MQTT 3 has no way to say so."""
    limit = engine.host.settings.max_keepalive
    if not limit or engine.client.protocol_level != MQTT5:
        return None
    if engine.client.keepalive and engine.client.keepalive <= limit:
        return None
    return limit


def _register_event(engine: ClientEngine, packet: Connect) -> RegisterContext:
    return RegisterContext(
        client_id=engine.client.client_id,
        mountpoint=engine.client.mountpoint,
        username=engine.client.username,
        attributes=engine.client.attributes,
        session_id=engine.client.session_id,
        peer=engine.client.peer[:2],
        clean_start=packet.clean_start,
        protocol_level=engine.client.protocol_level,
        properties=packet.properties,
        **_listener_fields(engine),
    )


# VerneMQ's names of the listener types, as hooks and webhooks see them.
LISTENER_TYPES = {"tcp": "mqtt", "ssl": "mqtts", "ws": "mqttws", "wss": "mqttwss"}


def _listener_fields(engine: ClientEngine) -> dict[str, Any]:
    listener = engine.listener
    host, port = listener.address
    return {
        "listener_type": LISTENER_TYPES[listener.settings.type],
        "listener_addr": host,
        "listener_port": port,
        "client_cert": engine.client.certificate,
    }


def on_auth(engine: ClientEngine, packet: Auth) -> None:
    exchange = engine.auth_exchange
    method = packet.properties.get(Property.AUTHENTICATION_METHOD)
    if exchange is None or method != exchange.method:
        return engine.close(ReasonCode.PROTOCOL_ERROR)  # [MQTT-4.12.0-5] / [MQTT-4.12.1-1]
    allowed = (
        (CONTINUE,) if engine.client.pending_connect else (CONTINUE, ReasonCode.RE_AUTHENTICATE)
    )
    if packet.reason_code not in allowed:
        return engine.close(ReasonCode.PROTOCOL_ERROR)
    engine.spawn(_auth_step(engine, packet.properties.get(Property.AUTHENTICATION_DATA)))


async def _auth_step(engine: ClientEngine, data: bytes | None) -> None:
    context = AuthContext(
        client_id=engine.client.client_id,
        mountpoint=engine.client.mountpoint,
        username=engine.client.username,
        attributes=engine.client.attributes,
    )
    assert engine.auth_exchange is not None  # on_auth saw to it
    step = await engine.auth_exchange.step(context, data)
    if engine.closing:
        return None
    connecting, engine.client.pending_connect = engine.client.pending_connect, None
    if step.reason_code >= 0x80:
        log.info("%s: authentication failed (%#04x)", engine.client.name(), step.reason_code)
        return refuse(engine, step.reason_code) if connecting else engine.close(step.reason_code)
    if step.reason_code == CONTINUE:
        engine.client.pending_connect = connecting
        return engine.outlet.send(Auth(CONTINUE, step.properties))
    if connecting:
        return _authenticate(engine, *connecting, step.properties)
    engine.client.decisions = None  # the plugins may see this client anew: asked again
    return engine.outlet.send(Auth(SUCCESS, step.properties))  # re-authenticated


def _connack_properties(engine: ClientEngine, assigned_id: str | None) -> dict:
    if engine.client.protocol_level != MQTT5:
        return {}
    props = engine.host.terms.connack_properties
    if assigned_id is not None:
        props = {**props, Property.ASSIGNED_CLIENT_IDENTIFIER: assigned_id}
    return props


def refuse(
    engine: ClientEngine,
    reason: int,
    properties: dict | None = None,
    *,
    quiet: bool = False,
    why: str = "",
) -> None:
    """CONNACK with a refusal, then the close. `quiet`: the caller logged it already;
    `why`: the plugin's reason, for the log line (which names the code the client saw)."""
    # 3.x has five codes; "not authorized" stands for every other refusal.
    v3_code = V3_CONNACK_CODE.get(ReasonCode(reason), ConnectReturnCode.NOT_AUTHORIZED)
    v5 = engine.client.protocol_level == MQTT5
    if not quiet:
        because = f"{why}, " if why else ""
        seen = connack_text(reason if v5 else v3_code, v5)
        log.info("%s: connection refused: %s%s", engine.client.name(), because, seen)
    if v5:
        engine.outlet.send(ConnAck(reason, False, properties or {}))
    elif reason != ReasonCode.TOPIC_NAME_INVALID:
        engine.outlet.send(ConnAck(v3_code, False))
    else:  # 3.1.1 has no code for it: close without CONNACK [MQTT-3.2.2-6]
        return engine.close()
    engine.host.metrics.connack_sent(v3_code)
    engine.close()


def connack_text(code: int, v5: bool) -> str:
    """A refusal as the client saw it: `CONNACK 0x86 (bad user name or password)` for
    MQTT 5, `CONNACK 4 (bad username or password)` for 3.1 / 3.1.1."""
    if v5:
        return f"CONNACK {code:#04x} ({_words(ReasonCode(code).name)})"
    return f"CONNACK {code} ({_words(ConnectReturnCode(code).name)})"


def _words(name: str) -> str:
    return name.lower().replace("_", " ")


def on_disconnect(engine: ClientEngine, packet: Disconnect) -> None:
    engine.host.metrics.mqtt_disconnect_received += 1
    if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
        engine.client.will = None  # a normal DISCONNECT discards the will [MQTT-3.14.4-3]
    expiry = packet.properties.get(Property.SESSION_EXPIRY_INTERVAL)
    if expiry is not None and engine.session is not None:
        session = engine.session.owner
        if session.expiry == 0 and expiry:
            # Zero at CONNECT cannot become non-zero at DISCONNECT [MQTT-3.14.2-2].
            return engine.close(ReasonCode.PROTOCOL_ERROR)
        session.expiry = None if expiry == NEVER_EXPIRES else expiry
    engine.client.disconnect_reason = "normal_disconnect"
    engine.close()
