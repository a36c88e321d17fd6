"""CONNECT for a client connection: validation, enhanced authentication, auth plugins,
the session, CONNACK.

A mixin of `broker.connection.Connection`. The order follows VerneMQ: on_auth_m5 (MQTT 5
enhanced authentication, [4.12]), auth_on_register (unless allow_anonymous), the will's
auth_on_publish, then the registry (takeover, clean start, expiry), on_register,
on_client_wakeup, CONNACK, and the resumed session's redelivery.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from broker.authorization import (
    ack_properties,
    refusal_properties,
    refusal_reason,
    register_refusal,
    session_limits,
)
from broker.enhanced_auth import CONTINUE, SUCCESS, AuthExchange
from broker.message import Message, TopicAliases
from broker.protocol import (
    Auth,
    ConnAck,
    Connect,
    ConnectReturnCode,
    Property,
    ReasonCode,
)
from broker.topics import valid_topic_name
from hooks import AuthContext, Chain, ClientContext, Ok, RegisterContext
from hooks.results import NO_HOOK

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("nautilus.connection")

MQTT5 = 5
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval meaning "never" [3.1.2.11.2]


def run_inline(flow: Coroutine) -> None:
    """Run a hook flow whose chains are all plain methods, without a task: its awaits
    never suspend, so one send() runs it to the end (about 40 us less per CONNECT)."""
    try:
        flow.send(None)
    except StopIteration:
        return
    flow.close()
    raise RuntimeError("a hook flow of synchronous chains suspended")


class ConnectHandling:
    """Packet handlers for CONNECT and AUTH; they also use the connection's timers,
    decoder, send(), close(), _spawn(), _name() and _closing."""

    __slots__ = ()

    broker: Broker
    protocol_level: int

    def _on_connect(self, packet: Connect) -> None:
        self.protocol_level = level = packet.protocol_level
        self.broker.metrics.mqtt_connect_received += 1
        # Binds every packet we send from now on, a refusing CONNACK too [MQTT-3.1.2-24].
        self.max_packet_out = packet.properties.get(Property.MAXIMUM_PACKET_SIZE, 0)
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
        self.problem_info = packet.properties.get(Property.REQUEST_PROBLEM_INFORMATION, 1) == 1
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
            result = await will_check.run(self._publish_context(packet.will))
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
            self._refuse(code, refusal_properties(result))

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
                will.topic,
                will.payload,
                will.qos,
                will.retain,
                will.properties,
                self.client_id,
                now=self.loop.time(),
            )
        self.keepalive = packet.keepalive
        server_keepalive = self._server_keepalive()
        if server_keepalive is not None:
            self.keepalive = server_keepalive
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
        session, present = registry.connect(self.client_id, packet.clean_start, expiry)
        session.apply_limits(session_limits(modifiers))
        self.session = session
        hooks = self.broker.hooks
        on_register = hooks.chain("on_register_m5" if level == MQTT5 else "on_register")
        if on_register:
            hooks.notify(on_register.name, self._register_event(packet))
        if hooks.chain("on_client_wakeup"):
            hooks.notify("on_client_wakeup", self._client_context())
        connack_props = {**self._connack_properties(assigned), **auth_props}
        if level == MQTT5 and "properties" in modifiers:
            # auth_on_register_m5 may add User Properties (and a Reason String).
            connack_props.update(ack_properties(modifiers["properties"]))
        if server_keepalive is not None:
            connack_props = {**connack_props, Property.SERVER_KEEP_ALIVE: server_keepalive}
        response_information = self.broker.settings.response_information
        if response_information and props.get(Property.REQUEST_RESPONSE_INFORMATION):
            # [3.1.2.11.7]: only when asked for; %c stands for the client id.
            info = response_information.replace("%c", self.client_id)
            connack_props = {**connack_props, Property.RESPONSE_INFORMATION: info}
        self.send(ConnAck(ReasonCode.SUCCESS, present, connack_props))
        self.broker.metrics.connack_sent(ConnectReturnCode.ACCEPTED)
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
