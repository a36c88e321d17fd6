"""A publish on behalf of a client that is not connected: VerneMQ's vmq_http_pub in its
"on-behalf-of" mode, behind `POST /api/v1/publish` (broker/http/publish.py).

The request names a client id, user name and password. They go through auth_on_register
(unless allow_anonymous) and the message through auth_on_publish, as a CONNECT and a
PUBLISH of an MQTT 5 client would (the `_m5` chains, which fall back to a plugin's v4
hook), with the plugins' modifiers applied; then the message takes the path of any
publish: on_publish, retained, subscribers, shared groups, the other nodes. No session
is made and no on_register fired: a client connected with the same id is left alone.

Nothing here touches HTTP: a refusal is `Refused(kind, reason)`, which the handler turns
into its status.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from broker.authorization import refusal_reason, subscriber_pair
from broker.mountpoints import subscriber_id
from broker.protocol import MQTT5
from broker.topics import valid_topic_name
from hooks import Ok, PublishContext, RegisterContext, Result
from hooks.results import NO_HOOK
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    import asyncio

    from broker.config import BrokerSettings
    from broker.hook_callers import HookCallers
    from broker.ingress import Ingress


class PublishGate(Protocol):
    """What a publish on behalf of a client goes through: the node's authentication
    chains and its ingress (the Broker provides it)."""

    settings: BrokerSettings
    loop: asyncio.AbstractEventLoop
    chains: HookCallers  # auth_on_register, on_register_failed
    ingress: Ingress  # the message's way in


class Kind(Enum):
    INVALID = "invalid"  # the request itself (topic, size)
    NOT_AUTHENTICATED = "not_authenticated"  # auth_on_register said no
    NOT_AUTHORIZED = "not_authorized"  # auth_on_publish said no
    UNAVAILABLE = "unavailable"  # not now: a netsplit, the store, full subscribers


class Refused(Exception):
    def __init__(self, kind: Kind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(slots=True)
class OnBehalf:
    """A message and whose it is, as a request gives them."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[int, Any] = field(default_factory=dict)  # MQTT 5 (User Properties)
    client_id: str = ""  # "": one is made up, as for an MQTT 5 CONNECT without one
    mountpoint: str = ""  # the topic tree it publishes in (broker/mountpoints.py)
    username: str | None = None
    password: bytes | None = None
    peer: tuple[str, int] = ("", 0)  # who sent the request
    listener: tuple[str, int] = ("", 0)  # where it came in (the hooks' listener_addr/port)


async def publish(gate: PublishGate, request: OnBehalf) -> PublishContext:
    """Authenticate, authorize and route `request`'s message; the message as routed
    (after the plugins' modifiers). Raises Refused."""
    _check(gate, request)
    register = _register_context(request)
    if not gate.settings.allow_anonymous:
        chain = gate.chains.auth_on_register[True]
        result = await chain.run(register) if chain else NO_HOOK
        if type(result) is not Ok:
            _register_failed(gate, register, result)
        _apply_register_modifiers(register, result.modifiers, request)
    context = new_publish_context(
        register.client_id,
        register.username,
        register.attributes,
        register.session_id,
        request.topic,
        request.payload,
        request.qos,
        request.retain,
        request.properties,
        mountpoint=register.mountpoint,
    )
    authorizer = gate.ingress.authorizer(True)
    if authorizer is not None:
        decision = gate.ingress.decided(context, await authorizer.run(context))
        if not decision.allowed:
            raise Refused(Kind.NOT_AUTHORIZED, refusal_reason(decision.result))
    _route(gate, context)
    return context


def _check(gate: PublishGate, request: OnBehalf) -> None:
    """What a broker refuses before any plugin is asked (as it does for a PUBLISH)."""
    topic = request.topic
    if not valid_topic_name(topic):
        raise Refused(Kind.INVALID, f"{topic!r} is not a topic to publish to")
    if topic.startswith("$SYS"):
        raise Refused(Kind.INVALID, "the $SYS tree is the broker's")
    depth = gate.settings.topic_max_depth
    if depth and topic.count("/") >= depth:
        raise Refused(Kind.INVALID, f"the topic is deeper than topic_max_depth ({depth})")
    limit = gate.settings.max_message_size
    if limit and len(request.payload) > limit:
        raise Refused(Kind.INVALID, f"the payload is larger than max_message_size ({limit})")
    closed = gate.ingress.closed_for(request.qos)
    if closed is not None:
        raise Refused(Kind.UNAVAILABLE, closed)


def _register_context(request: OnBehalf) -> RegisterContext:
    return RegisterContext(
        client_id=request.client_id or f"auto-{uuid.uuid4().hex}",
        mountpoint=request.mountpoint,
        username=request.username,
        session_id=str(uuid.uuid4()),
        peer=request.peer,
        password=request.password,
        protocol_level=MQTT5,
        listener_type="http",
        listener_addr=request.listener[0],
        listener_port=request.listener[1],
    )


def _apply_register_modifiers(
    context: RegisterContext, modifiers: Mapping[str, Any], request: OnBehalf
) -> None:
    """Those of auth_on_register's modifiers that concern one message: who sends it, and
    how large it may be (the session's settings have no session to go to)."""
    context.username = modifiers.get("username", context.username)
    context.client_id = modifiers.get("client_id", context.client_id)
    if "subscriber_id" in modifiers:
        context.mountpoint, context.client_id = subscriber_pair(modifiers["subscriber_id"])
    context.mountpoint = modifiers.get("mountpoint", context.mountpoint)
    limit = modifiers.get("max_message_size")
    if limit and len(request.payload) > limit:
        raise Refused(Kind.INVALID, f"the payload is larger than this client's limit ({limit})")


def _register_failed(gate: PublishGate, context: RegisterContext, result: Result) -> NoReturn:
    reason = refusal_reason(result)
    chain = gate.chains.on_register_failed
    if chain:
        context.reason = reason
        context.password = None  # events never see credentials
        gate.chains.notify(chain, context)
    raise Refused(Kind.NOT_AUTHENTICATED, reason)


def _route(gate: PublishGate, context: PublishContext) -> None:
    """The allowed message through the ingress, as any publish; answered only once it is
    kept (QoS 1/2), as a PUBACK is."""
    ingress = gate.ingress
    sender = subscriber_id(context.mountpoint, context.client_id)
    message = ingress.message(context, sender, gate.loop.time())
    if ingress.waits_for(message.topic):
        # An MQTT publisher would be held until they catch up; a request is not held.
        raise Refused(Kind.UNAVAILABLE, "subscribers of this topic are behind; try again")
    ingress.publish(message, context, True, context)
    if context.qos and not ingress.kept():
        raise Refused(Kind.UNAVAILABLE, "the broker could not store the message")
