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

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from broker.authorization import apply_publish_modifiers, refusal_reason, subscriber_pair
from broker.message import Message
from broker.mountpoints import inside, subscriber_id
from broker.topics import valid_topic_name
from hooks import Ok, PublishContext, RegisterContext, Result
from hooks.results import NO_HOOK
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    import asyncio

    from broker.config import BrokerSettings
    from broker.flow import FlowControl
    from broker.hook_callers import HookCallers
    from broker.peers import Peers
    from broker.routing import Routing
    from broker.store import MessageStore

MQTT5 = 5


class PublishHost(Protocol):
    """What a publish on behalf of a client uses of the broker (the Broker provides it)."""

    settings: BrokerSettings
    loop: asyncio.AbstractEventLoop
    chains: HookCallers
    routing: Routing
    flow: FlowControl
    store: MessageStore
    peers: Peers
    before_ack: list[Callable[[], bool]]  # plugins that must keep a QoS 1/2 message first


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


async def publish(host: PublishHost, request: OnBehalf) -> PublishContext:
    """Authenticate, authorize and route `request`'s message; the message as routed
    (after the plugins' modifiers). Raises Refused."""
    _check(host, request)
    register = _register_context(request)
    if not host.settings.allow_anonymous:
        chain = host.chains.auth_on_register[True]
        result = await chain.run(register) if chain else NO_HOOK
        if type(result) is not Ok:
            _register_failed(host, register, result)
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
    chain = host.chains.auth_on_publish[True]
    if chain:
        result = await chain.run(context)
        if type(result) is not Ok:
            raise Refused(Kind.NOT_AUTHORIZED, refusal_reason(result))
        apply_publish_modifiers(context, result)
    _route(host, context)
    return context


def _check(host: PublishHost, request: OnBehalf) -> None:
    """What a broker refuses before any plugin is asked (as it does for a PUBLISH)."""
    topic = request.topic
    if not valid_topic_name(topic):
        raise Refused(Kind.INVALID, f"{topic!r} is not a topic to publish to")
    if topic.startswith("$SYS"):
        raise Refused(Kind.INVALID, "the $SYS tree is the broker's")
    depth = host.settings.topic_max_depth
    if depth and topic.count("/") >= depth:
        raise Refused(Kind.INVALID, f"the topic is deeper than topic_max_depth ({depth})")
    limit = host.settings.max_message_size
    if limit and len(request.payload) > limit:
        raise Refused(Kind.INVALID, f"the payload is larger than max_message_size ({limit})")
    if host.peers.split and host.peers.refuses("publish") is not None:
        raise Refused(Kind.UNAVAILABLE, "a netsplit (allow_publish_during_netsplit is off)")
    if request.qos and host.store.failed:
        host.store.commit()  # try again: there may be room by now
        if host.store.failed:
            raise Refused(Kind.UNAVAILABLE, "the broker cannot store messages now")


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


def _register_failed(host: PublishHost, context: RegisterContext, result: Result) -> NoReturn:
    reason = refusal_reason(result)
    chain = host.chains.on_register_failed
    if chain:
        context.reason = reason
        context.password = None  # events never see credentials
        host.chains.notify(chain, context)
    raise Refused(Kind.NOT_AUTHENTICATED, reason)


def _route(host: PublishHost, context: PublishContext) -> None:
    """The allowed message on the path of any publish (broker/client/publish.py)."""
    routing = host.routing
    topic = inside(context.mountpoint, context.topic)
    if host.flow.congested and routing.full_subscribers(topic):
        # An MQTT publisher would be held until they catch up; a request is not held.
        raise Refused(Kind.UNAVAILABLE, "subscribers of this topic are behind; try again")
    message = Message(
        topic,
        context.payload,
        context.qos,
        context.retain,
        context.properties,
        subscriber_id(context.mountpoint, context.client_id),
        now=host.loop.time(),
    )
    matched = context.matched_acl
    if matched is not None:
        message.acl_name = matched.name
    chains = host.chains
    if chains.recorder is not None:
        chains.recorder.published(context, message, matched)
    if chains.on_publish[True]:
        chains.notify(chains.on_publish[True], context)
    routing.publish(message)
    if chains.on_message_drop and not routing.has_subscribers(message.topic):
        # Courier's, as for an MQTT publish (a copy: on_publish's tasks hold the context)
        dropped = dataclasses.replace(context, reason="no_matching_subscribers")
        chains.notify(chains.on_message_drop, dropped)
    if context.qos:  # stored before it is answered, as a PUBACK is
        host.store.commit()
        if host.store.failed or not all(kept() for kept in host.before_ack):
            raise Refused(Kind.UNAVAILABLE, "the broker could not store the message")
