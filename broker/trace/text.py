"""How a trace shows what it saw: a packet, a hook call and its result, as one line.

A packet is its type and its fields, `SUBSCRIBE(packet_id=1, subscriptions=[...])`, a hook
call its name and its context's fields, `auth_on_register(username='u', ...) -> ok`.
Fields with nothing in them (None, empty strings, bytes, lists and dicts) are left out,
except a PUBLISH's payload; MQTT 5 properties go by name; payloads are cut to the trace's
`trunc_payload` bytes, with their full size; a password is never shown, nor the client
id, mountpoint and session id of a hook's context (the line names the client already).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.protocol import Packet, Property
from hooks import Error, Ok, Result

_HIDDEN = frozenset({"password"})
_SIZE_ONLY = frozenset({"client_cert", Property.AUTHENTICATION_DATA})
_PAYLOADS = frozenset({"payload", Property.CORRELATION_DATA})
_NOT_SHOWN = frozenset({"raw"})  # a PUBLISH's bytes, again
_SAID_BY_THE_LINE = frozenset({"client_id", "mountpoint", "session_id"})
_ALWAYS = frozenset({"payload"})
_PROPERTY_NAMES = {int(p): p.name.lower() for p in Property}
_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's field names


def packet(value: Packet, trunc: int) -> str:
    """`CONNECT(client_id='c', ...)`: the packet type and its fields."""
    return f"{type(value).__name__.upper()}({_fields(value, trunc, _NOT_SHOWN)})"


def hook_call(hook: str, context: Any, trunc: int) -> str:
    """`auth_on_register(username='u', clean_start=True, ...)`."""
    return f"{hook}({_fields(context, trunc, _SAID_BY_THE_LINE)})"


def result(value: Result, trunc: int) -> str:
    """A deciding hook's verdict, in VerneMQ's words: ok (with its modifiers), error
    (with its reason), next."""
    if type(value) is Ok:
        modifiers = dict(value.modifiers)
        return f"ok {_shown('modifiers', modifiers, trunc)}" if modifiers else "ok"
    if type(value) is Error:
        code = f" ({value.reason_code:#04x})" if value.reason_code is not None else ""
        return f"error {value.reason}{code}"
    return "next"


def payload(data: bytes, trunc: int) -> str:
    """The first `trunc` bytes, and the size when it is cut."""
    if len(data) <= trunc:
        return repr(data)
    return f"{data[:trunc]!r}... ({len(data)} bytes)"


def _fields(value: Any, trunc: int, omitted: frozenset[str] = _NOT_SHOWN) -> str:
    shown = []
    for name in _names(type(value)):
        if name in omitted:
            continue
        item = getattr(value, name)
        if _empty(item) and name not in _ALWAYS:
            continue
        shown.append(f"{name}={_shown(name, item, trunc)}")
    return ", ".join(shown)


def _names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names (looked up once per class: a busy client's packets
    come by thousands)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(field.name for field in dataclasses.fields(cls))
    return names


def _empty(item: Any) -> bool:
    return item is None or (isinstance(item, str | bytes | list | tuple | dict) and not item)


def _shown(name: str | int, item: Any, trunc: int) -> str:
    if name in _HIDDEN:
        return "<hidden>"
    if isinstance(item, bytes):
        if name in _SIZE_ONLY:
            return f"<{len(item)} bytes>"
        return payload(item, trunc) if name in _PAYLOADS else repr(item)
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return f"{type(item).__name__}({_fields(item, trunc)})"
    if isinstance(item, list):
        return "[" + ", ".join(_shown(name, element, trunc) for element in item) + "]"
    if isinstance(item, dict):
        if name == "properties":
            pairs = (
                f"{_PROPERTY_NAMES.get(key, key)}={_shown(key, v, trunc)}"
                for key, v in item.items()
            )
        else:
            pairs = (f"{key}={_shown(key, v, trunc)}" for key, v in item.items())
        return "{" + ", ".join(pairs) + "}"
    return repr(item)
