"""VerneMQ's webhook JSON, both ways: hook context -> request body, response -> result.

Pure functions, no I/O. The shapes are vmq_webhooks' (see docs/plugins/webhooks.md):

- `request_body(hook, context)` builds the JSON object VerneMQ posts for that hook:
  `mountpoint` and `client_id` always, `username` null when absent, the payload in
  base64 unless the endpoint turned that off, MQTT 5 properties under their `p_*` names.
- `decode_response(hook, body)` turns an endpoint's answer into `Ok(modifiers)`, `NEXT`
  or `Error(text)`, and raises `InvalidResponse` for anything it cannot accept (the
  plugin denies then; it never lets a broken answer through).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any, TypeGuard

from broker.protocol import Property
from hooks import HOOKS, NEXT, Error, Ok, Result
from hooks.spec import check_modifiers


class InvalidResponse(ValueError):
    """An answer the plugin cannot use; `reason` becomes the Error's reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# -- MQTT 5 properties <-> VerneMQ's p_* names -----------------------------------------

# Property -> (VerneMQ name, how its value is written in JSON).
PROPERTY_NAMES: dict[int, tuple[str, str]] = {
    Property.PAYLOAD_FORMAT_INDICATOR: ("p_payload_format_indicator", "format"),
    Property.MESSAGE_EXPIRY_INTERVAL: ("p_message_expiry_interval", "u32"),
    Property.CONTENT_TYPE: ("p_content_type", "str"),
    Property.RESPONSE_TOPIC: ("p_response_topic", "str"),
    Property.CORRELATION_DATA: ("p_correlation_data", "base64"),
    Property.SUBSCRIPTION_IDENTIFIER: ("p_subscription_id", "ids"),
    Property.SESSION_EXPIRY_INTERVAL: ("p_session_expiry_interval", "u32"),
    Property.ASSIGNED_CLIENT_IDENTIFIER: ("p_assigned_client_id", "str"),
    Property.SERVER_KEEP_ALIVE: ("p_server_keep_alive", "u16"),
    Property.AUTHENTICATION_METHOD: ("p_authentication_method", "str"),
    Property.AUTHENTICATION_DATA: ("p_authentication_data", "base64"),
    Property.REQUEST_PROBLEM_INFORMATION: ("p_request_problem_info", "bool"),
    Property.WILL_DELAY_INTERVAL: ("p_will_delay_interval", "u32"),
    Property.REQUEST_RESPONSE_INFORMATION: ("p_request_response_info", "bool"),
    Property.RESPONSE_INFORMATION: ("p_response_info", "str"),
    Property.SERVER_REFERENCE: ("p_server_ref", "str"),
    Property.REASON_STRING: ("p_reason_string", "str"),
    Property.RECEIVE_MAXIMUM: ("p_receive_max", "u16"),
    Property.TOPIC_ALIAS_MAXIMUM: ("p_topic_alias_max", "u16"),
    Property.TOPIC_ALIAS: ("p_topic_alias", "u16"),
    Property.MAXIMUM_QOS: ("p_max_qos", "bit"),
    Property.RETAIN_AVAILABLE: ("p_retain_available", "bool"),
    Property.USER_PROPERTY: ("p_user_property", "pairs"),
    Property.MAXIMUM_PACKET_SIZE: ("p_max_packet_size", "u32"),
    Property.WILDCARD_SUBSCRIPTION_AVAILABLE: ("p_wildcard_subs_available", "bool"),
    Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE: ("p_sub_ids_available", "bool"),
    Property.SHARED_SUBSCRIPTION_AVAILABLE: ("p_shared_subs_available", "bool"),
}
_BY_NAME = {name: (Property(prop), kind) for prop, (name, kind) in PROPERTY_NAMES.items()}

# What a publish/deliver modifier may set: the message's own properties (the broker adds
# subscription identifiers per subscriber; topic aliases are per connection).
MESSAGE_PROPERTIES = frozenset(
    {
        Property.PAYLOAD_FORMAT_INDICATOR,
        Property.MESSAGE_EXPIRY_INTERVAL,
        Property.CONTENT_TYPE,
        Property.RESPONSE_TOPIC,
        Property.CORRELATION_DATA,
        Property.USER_PROPERTY,
    }
)

_FORMAT = {0: "unspecified", 1: "utf8"}
_FORMAT_CODES = {"unspecified": 0, "utf8": 1}
_LIMITS = {"u16": 0xFFFF, "u32": 0xFFFFFFFF, "bit": 1}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidResponse("invalid_modifiers", f"{what}: expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidResponse("invalid_modifiers", f"{what}: not valid base64") from None


def encode_properties(props: dict[int, Any]) -> dict[str, Any]:
    """MQTT 5 properties as VerneMQ writes them: p_* keys, user properties in base64."""
    out: dict[str, Any] = {}
    for prop, value in props.items():
        known = PROPERTY_NAMES.get(prop)
        if known is None:
            continue
        name, kind = known
        if kind == "format":
            value = _FORMAT.get(value, "unspecified")
        elif kind == "base64":
            value = _b64(value)
        elif kind == "bool":
            value = bool(value)
        elif kind == "pairs":
            value = [{"key": _b64(k.encode()), "val": _b64(v.encode())} for k, v in value]
        elif kind == "ids":
            value = list(value)
        out[name] = value
    return out


def decode_properties(raw: Any, allowed: frozenset[int] | None = None) -> dict[int, Any]:
    """p_* properties from a response, checked value by value (they go on the wire)."""
    if not isinstance(raw, dict):
        raise InvalidResponse("invalid_modifiers", "properties: expected a JSON object")
    props: dict[int, Any] = {}
    for name, value in raw.items():
        known = _BY_NAME.get(name)
        if known is None:
            raise InvalidResponse("invalid_modifiers", f"unknown property {name!r}")
        prop, kind = known
        if allowed is not None and prop not in allowed:
            raise InvalidResponse("invalid_modifiers", f"property {name!r} cannot be set here")
        props[prop] = _decode_property(name, kind, value)
    return props


def _decode_property(name: str, kind: str, value: Any) -> Any:
    if kind == "format":
        if value not in _FORMAT_CODES:
            raise InvalidResponse("invalid_modifiers", f"{name}: expected 'utf8' or 'unspecified'")
        return _FORMAT_CODES[value]
    if kind == "base64":
        return _unb64(value, name)
    if kind == "pairs":
        if not isinstance(value, list):
            raise InvalidResponse("invalid_modifiers", f"{name}: expected a list")
        pairs = []
        for item in value:
            if not isinstance(item, dict) or set(item) != {"key", "val"}:
                raise InvalidResponse("invalid_modifiers", f'{name}: expected {{"key", "val"}}')
            try:
                pairs.append(
                    (_unb64(item["key"], name).decode(), _unb64(item["val"], name).decode())
                )
            except UnicodeDecodeError:
                raise InvalidResponse("invalid_modifiers", f"{name}: not UTF-8") from None
        return pairs
    if kind == "str":
        if not isinstance(value, str):
            raise InvalidResponse("invalid_modifiers", f"{name}: expected a string")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidResponse("invalid_modifiers", f"{name}: expected true or false")
        return int(value)
    if kind == "ids":
        if not isinstance(value, list) or not all(
            _is_int(i) and 1 <= i <= 268_435_455 for i in value
        ):
            raise InvalidResponse("invalid_modifiers", f"{name}: expected a list of ids")
        return list(value)
    if not _is_int(value) or not 0 <= value <= _LIMITS[kind]:
        raise InvalidResponse("invalid_modifiers", f"{name}: expected 0..{_LIMITS[kind]}")
    return value


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# -- request bodies ----------------------------------------------------------------------


def _text(data: bytes | None) -> str | None:
    """A password as JSON text (VerneMQ sends it as is). Bytes that are not UTF-8 are
    kept distinct as lone surrogates (\\udcXX), so no two passwords look the same."""
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _payload(payload: bytes, base64_payload: bool) -> str:
    if base64_payload:
        return _b64(payload)
    return payload.decode("utf-8", "replace")


def _peer(ctx: Any) -> tuple[str | None, int | None]:
    host, port = ctx.peer
    return (host or None), (port if host else None)


def _register(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    addr, port = _peer(ctx)
    body = {
        "peer_addr": addr,
        "peer_port": port,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "username": ctx.username,
        "password": _text(ctx.password),
        # VerneMQ's connection metadata: the listener, and a TLS client's certificate.
        "listener_addr": ctx.listener_addr,
        "listener_port": ctx.listener_port,
        "listener_type": ctx.listener_type,
    }
    if ctx.client_cert is not None:
        body["client_cert"] = base64.b64encode(ctx.client_cert).decode("ascii")  # DER
    if m5:
        body["clean_start"] = ctx.clean_start
        body["properties"] = encode_properties(ctx.properties)
    else:
        body["clean_session"] = ctx.clean_start
    return body


def _register_event(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    addr, port = _peer(ctx)
    body = {
        "peer_addr": addr,
        "peer_port": port,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "username": ctx.username,
    }
    if m5:
        body["properties"] = encode_properties(ctx.properties)
    return body


def _register_failed(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    body = _register_event(ctx, False, opts)
    body["reason"] = ctx.reason
    return body


def _publish(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    base64_payload, no_payload = opts
    body: dict[str, Any] = {
        "username": ctx.username,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "qos": ctx.qos,
        "topic": ctx.topic,
    }
    if not no_payload:
        body["payload"] = _payload(ctx.payload, base64_payload)
    body["retain"] = ctx.retain
    if m5:
        body["properties"] = encode_properties(ctx.properties)
    return body


def _offline_message(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    return {
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "qos": ctx.qos,
        "topic": ctx.topic,
        "payload": _payload(ctx.payload, opts[0]),
        "retain": ctx.retain,
    }


def _message_drop(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    body = _offline_message(ctx, m5, opts)
    body["reason"] = ctx.reason
    return body


_RETAIN_HANDLING = ("send_retain", "send_if_new_sub", "dont_send")


def _subscribe(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    topics: list[dict[str, Any]] = []
    for t in ctx.topics:
        if not m5:
            topics.append({"topic": t.topic, "qos": t.qos if t.qos <= 2 else 128})
        elif t.qos <= 2:
            topics.append(
                {
                    "topic": t.topic,
                    "qos": t.qos,
                    "no_local": t.no_local,
                    "rap": t.retain_as_published,
                    "retain_handling": _RETAIN_HANDLING[t.retain_handling],
                }
            )
        else:  # refused (on_subscribe): the reason code, no options
            topics.append({"topic": t.topic, "qos": t.qos})
    body = {
        "username": ctx.username,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "topics": topics,
    }
    if m5:
        body["properties"] = encode_properties(ctx.properties)
    return body


def _unsubscribe(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    body = {
        "username": ctx.username,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "topics": list(ctx.topics),
    }
    if m5:
        body["properties"] = encode_properties(ctx.properties)
    return body


def _auth(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    return {
        "username": ctx.username,
        "mountpoint": ctx.mountpoint,
        "client_id": ctx.client_id,
        "properties": encode_properties(ctx.properties),
    }


def _client(ctx: Any, m5: bool, opts: tuple[bool, bool]) -> dict[str, Any]:
    return {"mountpoint": ctx.mountpoint, "client_id": ctx.client_id}


_Builder = Callable[[Any, bool, tuple[bool, bool]], dict[str, Any]]
_BUILDERS: dict[str, _Builder] = {
    "auth_on_register": _register,
    "auth_on_publish": _publish,
    "auth_on_subscribe": _subscribe,
    "on_register": _register_event,
    "on_publish": _publish,
    "on_subscribe": _subscribe,
    "on_unsubscribe": _unsubscribe,
    "on_deliver": _publish,
    "on_auth": _auth,
    "on_offline_message": _offline_message,
    "on_client_wakeup": _client,
    "on_client_offline": _client,
    "on_client_gone": _client,
    "on_session_expired": _client,
    "on_message_drop": _message_drop,
    "on_register_failed": _register_failed,
    "on_delivery_complete": _publish,
}


def request_body(
    hook: str, context: Any, *, base64_payload: bool = True, no_payload: bool = False
) -> dict[str, Any]:
    """The JSON object VerneMQ posts for `hook` (`no_payload`: auth_on_publish only)."""
    m5 = hook.endswith("_m5")
    base = hook[:-3] if m5 else hook
    no_payload = no_payload and base == "auth_on_publish"
    return _BUILDERS[base](context, m5, (base64_payload, no_payload))


def encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


# -- responses ---------------------------------------------------------------------------

_MAX_AGE = re.compile(r"max-age=(\d+)", re.IGNORECASE)
_AUTH_REASON_CODES = {"success": 0x00, "continue_authentication": 0x18, "reauthenticate": 0x19}


def max_age(cache_control: str | None) -> int | None:
    """Seconds from a `cache-control: max-age=N` header; None when absent or zero."""
    if not cache_control:
        return None
    match = _MAX_AGE.search(cache_control)
    if match is None:
        return None
    seconds = int(match[1])
    return seconds or None


def decode_response(hook: str, data: bytes, *, base64_payload: bool = True) -> Result:
    """An all_till_ok hook's HTTP 200 body as a result; raises InvalidResponse."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidResponse("received_payload_not_json", _excerpt(data)) from None
    if not isinstance(doc, dict):
        raise InvalidResponse("invalid_response", f"expected a JSON object, got {_excerpt(data)}")
    result = doc.get("result")
    if result == "next":
        return NEXT
    if isinstance(result, dict):
        error = result.get("error", "unknown_error")
        return Error(error if isinstance(error, str) else json.dumps(error))
    if result != "ok":
        raise InvalidResponse("invalid_response", f'"result" is {json.dumps(result)}')
    modifiers = _modifiers(hook, doc, base64_payload)
    if not modifiers:
        return Ok()
    problem = check_modifiers(hook, modifiers)
    if problem is not None:
        raise InvalidResponse("invalid_modifiers", problem)
    return Ok(modifiers)


def _excerpt(data: bytes) -> str:
    text = data[:80].decode("utf-8", "replace")
    return repr(text + ("..." if len(data) > 80 else ""))


def _modifiers(hook: str, doc: dict[str, Any], base64_payload: bool) -> dict[str, Any]:
    m5 = hook.endswith("_m5")
    base = hook[:-3] if m5 else hook
    if not m5 and base in ("auth_on_subscribe", "on_unsubscribe"):
        # v4: a top-level "topics" instead of "modifiers".
        topics = doc.get("topics")
        if topics is None:
            return {}
        if base == "auth_on_subscribe":
            return {"topics": _subscribe_topics(topics)}
        return {"topics": _filters(topics)}
    raw = doc.get("modifiers")
    if raw is None or raw == [] or raw == {}:
        return {}
    if not isinstance(raw, dict):
        raise InvalidResponse("invalid_modifiers", '"modifiers" must be a JSON object')
    modifiers = dict(raw)
    message = base in ("auth_on_publish", "on_deliver")
    if message and "payload" in modifiers:
        payload = modifiers["payload"]
        if base64_payload:
            modifiers["payload"] = _unb64(payload, "payload")
        elif isinstance(payload, str):
            modifiers["payload"] = payload.encode()
        else:
            raise InvalidResponse("invalid_modifiers", "payload: expected a string")
    if "properties" in modifiers:
        allowed = MESSAGE_PROPERTIES if message else None
        modifiers["properties"] = decode_properties(modifiers["properties"], allowed)
    if "topics" in modifiers:
        if base == "auth_on_subscribe":
            modifiers["topics"] = _subscribe_topics(modifiers["topics"])
        elif base == "on_unsubscribe":
            modifiers["topics"] = _filters(modifiers["topics"])
    if base == "on_auth" and isinstance(modifiers.get("reason_code"), str):
        code = _AUTH_REASON_CODES.get(modifiers["reason_code"])
        if code is None:
            raise InvalidResponse("invalid_modifiers", "reason_code: unknown name")
        modifiers["reason_code"] = code
    return modifiers


def _subscribe_topics(raw: Any) -> list[tuple[str, int]]:
    """[{"topic", "qos"[, "no_local", "rap", "retain_handling"]}] -> [(filter, qos)].

    A qos above 2 refuses that topic (128, or an MQTT 5 reason code such as 135). The
    hook contract carries (filter, qos) only, so the broker keeps the sub-options the
    client asked for; the ones given here are checked, then not applied.
    """
    if not isinstance(raw, list):
        raise InvalidResponse("invalid_modifiers", "topics: expected a list")
    topics = []
    for item in raw:
        if not isinstance(item, dict):
            raise InvalidResponse("invalid_modifiers", 'topics: expected {"topic", "qos"}')
        topic, qos = item.get("topic"), item.get("qos")
        if not isinstance(topic, str) or not _is_int(qos) or not 0 <= qos <= 255:
            raise InvalidResponse("invalid_modifiers", f"topics: invalid entry {item!r}")
        handling = item.get("retain_handling", "send_retain")
        if handling not in _RETAIN_HANDLING:
            raise InvalidResponse("invalid_modifiers", f"topics: retain_handling {handling!r}")
        topics.append((topic, qos))
    return topics


def _filters(raw: Any) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise InvalidResponse("invalid_modifiers", "topics: expected a list of strings")
    return list(raw)


def cacheable(hook: str) -> bool:
    """Only the auth_on_* hooks are cached (vmq_webhooks_cache)."""
    return hook.startswith("auth_on_")


def is_event(hook: str) -> bool:
    return HOOKS[hook].mode == "all"
