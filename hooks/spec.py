"""Every hook, declared once: its name, dispatch mode, context type and modifier allow-list.

Names are VerneMQ's, v4 and `_m5` (webhook configs and docs need them). A plugin
implements a hook by defining a method of that name, sync or `async`, taking one context
object. For an MQTT 5 client the broker calls the `_m5` hook; a plugin that only defines
the v4 method serves the `_m5` hook with it, as VerneMQ's compatibility layer does. The
context is the same class either way; v4 implementations simply ignore `properties`.

Modes: "all_till_ok" (auth: Ok stops and allows, Error stops and denies, Next or None
asks the next plugin, an exhausted chain denies), "all" (events: every plugin is called,
results are ignored).

Modifiers: each hook lists VerneMQ's modifiers with a validator, and those Nautilus does
not apply as `Unsupported(why)`, so a plugin that asks for one learns it from a clear
error instead of being silently ignored.

Side doors: the other names the broker looks for on a plugin (start/stop, before_ack,
metrics, metadata/metadata_backend, invalidate, bridges, placement, reload_tls, recorder),
each with how it is used and what for (SIDE_DOORS, at the end); hooks/side_doors.py checks
them when a plugin loads and resolves them once for the broker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Properties = dict[int, Any]


# -- contexts: one slotted dataclass per kind of hook; new fields break no plugin --------


@dataclass(frozen=True, slots=True)
class Metric:
    """One figure a plugin reports (its optional `metrics()` method returns them): served
    on /metrics as `name{node="...",<labels>} value`. Names follow Prometheus' rules
    (`[a-z_][a-z0-9_]*`), starting with the plugin's own prefix (`webhooks_`, `acl_`)."""

    name: str
    value: float
    kind: Literal["counter", "gauge"] = "counter"
    labels: tuple[tuple[str, str], ...] = ()
    help: str = ""


@dataclass(frozen=True, slots=True)
class MatchedAcl:
    """The ACL rule that allowed a publish or a subscription (Courier's MatchedACL): its
    label (`label <name>` in the ACL file; "" without one) and its topic pattern with the
    %u/%c/%m substitutions made."""

    name: str = ""
    pattern: str = ""


@dataclass(slots=True, kw_only=True)
class ClientContext:
    """Who: every hook knows the client. `attributes` is one dict per connection that
    plugins share (e.g. auth_jwt puts the token's claims there for the ACL plugin).
    `session_id` names this connection (a new one per CONNECT, UUIDv4 text as Courier's);
    `reason` says why, in the hooks that report something ending or failing
    (on_client_offline / on_client_gone: the disconnect reason; on_register_failed;
    on_message_drop)."""

    client_id: str
    mountpoint: str = ""
    username: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class RegisterContext(ClientContext):
    """auth_on_register(_m5), on_register(_m5), on_register_failed. `listener_*`: the
    listener the client came through (type "mqtt", "mqtts", "mqttws" or "mqttwss", as
    VerneMQ names them);
    `client_cert`: the certificate (DER) a TLS client showed, verified against the
    listener's CA."""

    peer: tuple[str, int] = ("", 0)
    password: bytes | None = None
    clean_start: bool = True
    protocol_level: int = 4
    properties: Properties = field(default_factory=dict)
    listener_type: str = "mqtt"
    listener_addr: str = ""
    listener_port: int = 0
    client_cert: bytes | None = None


@dataclass(slots=True, kw_only=True)
class PublishContext(ClientContext):
    """auth_on_publish(_m5), on_publish(_m5), on_deliver(_m5), on_offline_message,
    on_delivery_complete, on_message_drop. For delivery hooks the client is the receiver;
    `matched_acl` is then the publisher's (its label only), and `persisted` says whether the
    message went through the store on its way. on_message_drop's `reason`: queue_full,
    expired, max_packet_size_exceeded, no_matching_subscribers."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)
    matched_acl: MatchedAcl | None = None
    persisted: bool = False


_new = object.__new__


def new_publish_context(
    client_id: str,
    username: str | None,
    attributes: dict[str, Any],
    session_id: str,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    properties: Properties,
    matched_acl: MatchedAcl | None = None,
    persisted: bool = False,
    reason: str = "",
    mountpoint: str = "",
) -> PublishContext:
    """A PublishContext for the broker's hot path (a publish, each delivery): the same
    object as PublishContext(...) builds, in a third of the time the dataclass's keyword
    __init__ takes. tests/hooks checks that it sets every field."""
    context = _new(PublishContext)
    context.client_id = client_id
    context.mountpoint = mountpoint
    context.username = username
    context.attributes = attributes
    context.session_id = session_id
    context.reason = reason
    context.topic = topic
    context.payload = payload
    context.qos = qos
    context.retain = retain
    context.properties = properties
    context.matched_acl = matched_acl
    context.persisted = persisted
    return context


@dataclass(slots=True, kw_only=True)
class TopicRequest:
    topic: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    matched_acl: MatchedAcl | None = None  # in on_subscribe: the rule that allowed it


@dataclass(slots=True, kw_only=True)
class SubscribeContext(ClientContext):
    """auth_on_subscribe(_m5), on_subscribe(_m5). In on_subscribe a refused topic has qos
    0x80 (or its MQTT 5 reason code)."""

    topics: list[TopicRequest]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class UnsubscribeContext(ClientContext):
    """on_unsubscribe(_m5)."""

    topics: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class AuthContext(ClientContext):
    """on_auth_m5: the AUTH exchange (method and data are in properties)."""

    properties: Properties = field(default_factory=dict)


# -- modifier validators ----------------------------------------------------------------


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    return _int(value) and value >= 0


def _limit(value: Any) -> bool:
    """A queue bound: a count, or -1 for none (as the config's max_*_messages)."""
    return _int(value) and value >= -1


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _qos(value: Any) -> bool:
    return value in (0, 1, 2) and not isinstance(value, bool)


def _bytes(value: Any) -> bool:
    return isinstance(value, bytes)


def _properties(value: Any) -> bool:
    return isinstance(value, Mapping)


def _matched_acl(value: Any) -> bool:
    return isinstance(value, MatchedAcl)


def _publish_topic(value: Any) -> bool:
    return isinstance(value, str) and value != "" and "+" not in value and "#" not in value


def _topic_list(value: Any) -> bool:
    """auth_on_subscribe: [(filter, qos or reason code)]; on_unsubscribe: [filter]."""
    if not isinstance(value, list):
        return False
    return all(
        isinstance(item, str)
        or (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str))
        for item in value
    )


def _mountpoint(value: Any) -> bool:
    """A topic tree's name: one topic level, not a `$` one (broker/mountpoints.py says why)."""
    return (
        isinstance(value, str)
        and not any(c in value for c in "/+#\0")
        and not value.startswith("$")
    )


def _subscriber_id(value: Any) -> bool:
    """VerneMQ's {mountpoint, client_id}: a mapping with both, or a (mountpoint, client id)
    pair."""
    if isinstance(value, Mapping):
        pair = (value.get("mountpoint"), value.get("client_id"))
    elif isinstance(value, tuple | list) and len(value) == 2:
        pair = (value[0], value[1])
    else:
        return False
    return _mountpoint(pair[0]) and isinstance(pair[1], str) and pair[1] != ""


def _one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda value: value in choices


def _never(value: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A VerneMQ modifier that Nautilus does not apply: returning it is an error, logged
    with `why`. Values for which `harmless` is true ask for what Nautilus does anyway
    (empty SUBACK properties) and pass."""

    why: str
    harmless: Callable[[Any], bool] = _never


Validators = Mapping[str, Callable[[Any], bool] | Unsupported]

_NO_NETSPLIT = Unsupported(
    "it is a per-client netsplit switch; a Nautilus cluster (over Redis) never refuses "
    "work because another node is away, and while Redis is away "
    "cluster.allow_register_during_outage decides for every client"
)
_NO_MIGRATION = Unsupported(
    "it paces queue migration between nodes per client; Nautilus moves every queue in "
    "chunks of broker.max_msgs_per_drain_step"
)

_REGISTER: Validators = {
    **dict.fromkeys(
        ("allow_register", "allow_publish", "allow_subscribe", "allow_unsubscribe"), _NO_NETSPLIT
    ),
    **dict.fromkeys(
        ("max_message_size", "max_message_rate", "max_inflight_messages", "retry_interval"),
        _non_negative,
    ),
    **dict.fromkeys(("max_online_messages", "max_offline_messages"), _limit),
    **dict.fromkeys(("max_drain_time", "max_msgs_per_drain_step"), _NO_MIGRATION),
    "max_connection_lifetime": Unsupported("connections have no lifetime limit"),
    "username": _str,
    "client_id": _str,
    "mountpoint": _mountpoint,
    "subscriber_id": _subscriber_id,
    "clean_session": _bool,
    "clean_start": _bool,
    "upgrade_qos": Unsupported(
        "QoS upgrade is set for all clients (broker.upgrade_outgoing_qos), not per client"
    ),
    "queue_type": _one_of("fifo", "lifo"),
    "shared_subscription_policy": _one_of(
        "prefer_local", "local_only", "random", "round_robin", "prefer_online_before_local"
    ),
    "properties": _properties,
}
_PUBLISH: Validators = {
    "topic": _publish_topic,
    "payload": _bytes,
    "qos": _qos,
    "retain": _bool,
    "mountpoint": _mountpoint,
    "throttle": Unsupported(
        "per-message throttling is not implemented (max_message_rate, an auth_on_register "
        "modifier, paces a client)"
    ),
    "properties": _properties,
    "matched_acl": _matched_acl,  # Courier's: the rule that allowed it (events carry it)
}
_SUBSCRIBE: Validators = {
    "topics": _topic_list,
    "properties": Unsupported(
        "the SUBACK of an accepted SUBSCRIBE carries no plugin properties "
        "(a refusal's does: Error(properties=...))",
        lambda value: isinstance(value, Mapping) and not value,
    ),
}
_UNSUBSCRIBE: Validators = {"topics": _topic_list, "properties": _properties}
_DELIVER: Validators = {"topic": _publish_topic, "payload": _bytes, "properties": _properties}
_AUTH: Validators = {"properties": _properties, "reason_code": _int}


# -- the catalogue -----------------------------------------------------------------------

Mode = Literal["all_till_ok", "all"]


@dataclass(frozen=True, slots=True)
class HookSpec:
    name: str
    mode: Mode
    context: type
    modifiers: Validators = field(default_factory=dict)
    v4_fallback: str | None = None  # for an _m5 hook: the v4 hook that may serve it


def _pair(name: str, mode: Mode, context: type, modifiers: Validators = {}) -> list[HookSpec]:  # noqa: B006
    return [
        HookSpec(name, mode, context, modifiers),
        HookSpec(f"{name}_m5", mode, context, modifiers, v4_fallback=name),
    ]


HOOKS: dict[str, HookSpec] = {
    spec.name: spec
    for spec in [
        *_pair("auth_on_register", "all_till_ok", RegisterContext, _REGISTER),
        *_pair("auth_on_publish", "all_till_ok", PublishContext, _PUBLISH),
        *_pair("auth_on_subscribe", "all_till_ok", SubscribeContext, _SUBSCRIBE),
        *_pair("on_register", "all", RegisterContext),
        *_pair("on_publish", "all", PublishContext),
        *_pair("on_subscribe", "all", SubscribeContext),
        *_pair("on_unsubscribe", "all_till_ok", UnsubscribeContext, _UNSUBSCRIBE),
        *_pair("on_deliver", "all_till_ok", PublishContext, _DELIVER),
        HookSpec("on_auth_m5", "all_till_ok", AuthContext, _AUTH),
        HookSpec("on_offline_message", "all", PublishContext),
        HookSpec("on_client_wakeup", "all", ClientContext),
        HookSpec("on_client_offline", "all", ClientContext),
        HookSpec("on_client_gone", "all", ClientContext),
        HookSpec("on_session_expired", "all", ClientContext),
        HookSpec("on_message_drop", "all", PublishContext),
        # Courier's additions.
        HookSpec("on_register_failed", "all", RegisterContext),
        HookSpec("on_delivery_complete", "all", PublishContext),
    ]
}


def check_modifiers(hook: str, modifiers: Mapping[str, Any]) -> str | None:
    """None when every modifier is allowed for `hook`, else what is wrong (one line)."""
    allowed = HOOKS[hook].modifiers
    for key, value in modifiers.items():
        rule = allowed.get(key)
        if rule is None:
            return f"modifier {key!r} is not allowed in {hook}"
        if isinstance(rule, Unsupported):
            if not rule.harmless(value):
                return f"modifier {key!r} of {hook} is not supported by Nautilus: {rule.why}"
        elif not rule(value):
            return f"modifier {key!r} has an invalid value {value!r} in {hook}"
    return None


# -- side doors: what the broker looks for on a plugin besides its hooks ------------------

Calling = Literal["plain", "plain or async", "value"]


@dataclass(frozen=True, slots=True)
class SideDoor:
    """An attribute, besides the hooks, that the broker may find on a plugin: a method it
    calls with `params` (positional), plain only or plain or `async`; or a value it reads.
    Absent or None: the plugin has none. `needs`: the door that must come with this one.
    hooks/side_doors.py checks them when a plugin loads and resolves them for the broker."""

    name: str
    calling: Calling
    params: tuple[str, ...]
    gives: str  # what the broker gets back (a value door: what the value is)
    purpose: str
    needs: str | None = None

    @property
    def signature(self) -> str:
        """How the broker uses it: `before_ack() -> bool`, `[async] start() -> None`,
        `metadata: str`."""
        if self.calling == "value":
            return f"{self.name}: {self.gives}"
        maybe_async = "[async] " if self.calling == "plain or async" else ""
        return f"{maybe_async}{self.name}({', '.join(self.params)}) -> {self.gives}"


SIDE_DOORS: dict[str, SideDoor] = {
    door.name: door
    for door in [
        SideDoor(
            "start",
            "plain or async",
            (),
            "None",
            "runs when the broker starts, before it listens (the plugin's own servers, "
            "reloaders, connections)",
        ),
        SideDoor("stop", "plain or async", (), "None", "runs when the broker stops"),
        SideDoor(
            "before_ack",
            "plain",
            (),
            "bool",
            "called before the broker writes any PUBACK / PUBREC, after the store's commit: "
            "True once what the plugin keeps about that loop turn's messages is kept, False "
            "if it could not be (nothing is acknowledged)",
        ),
        SideDoor(
            "metrics",
            "plain",
            (),
            "Iterable[Metric]",
            "the plugin's figures, per /metrics scrape, on the event loop",
        ),
        SideDoor(
            "metadata",
            "value",
            (),
            "str",
            'the [cluster] metadata name this plugin serves (`metadata = "redis"`)',
            needs="metadata_backend",
        ),
        SideDoor(
            "metadata_backend",
            "plain",
            ("dead_after",),
            "MetadataBackend",
            "a new backend (broker/cluster/metadata.py) for the node's cluster to open, when "
            "[cluster] metadata names this plugin's `metadata`",
            needs="metadata",
        ),
        SideDoor(
            "invalidate",
            "plain or async",
            ("client_id", "username"),
            "int",
            "re-read what the plugin keeps of its decisions for the connected clients of "
            "`client_id` and/or `username` (both None: all), so that a change made where it "
            "reads them applies now (`nautilus admin auth invalidate`); how many clients",
        ),
        SideDoor(
            "bridges",
            "value",
            (),
            "BridgeControl",
            "the plugin's bridges to other brokers, as `nautilus admin bridge show|start|stop` "
            "drives them (hooks/bridges.py: rows() and [async] run(name, running))",
        ),
        SideDoor(
            "placement",
            "plain",
            ("node", "alive"),
            "None",
            "called once before start(): this node's name and a function answering the "
            "cluster's members alive now (sorted; None outside a cluster), for work that "
            "runs on one node at a time (the bridges)",
        ),
        SideDoor(
            "reload_tls",
            "plain",
            (),
            "None",
            "SIGHUP: load the plugin's own TLS certificate files again (its servers': the "
            "event relay's); ConfigError naming the key if they do not load (the old ones "
            "stay)",
        ),
        SideDoor(
            "recorder",
            "value",
            (),
            "MessageRecorder",
            "the per-message events (on_publish, on_deliver, on_delivery_complete) as plain "
            "calls with the broker's objects (hooks/recorder.py); one plugin at most",
        ),
    ]
}
