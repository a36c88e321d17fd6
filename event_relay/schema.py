"""What an event is: its type codes and fields, shared by the encoder, the decoder, the
Courier sidecar push and the docs (docs/event-relay.md, "Events").

On the wire an event is a msgpack array: the seven common fields, then its type's own
fields in the order listed here. Readers name them with `decode_event`, so a new field
(appended at the end of a type) breaks no reader.
"""

from __future__ import annotations

from typing import Any

# Every event starts with these.
COMMON = ("seq", "ts", "type", "client_id", "mountpoint", "username", "session_id")

_MESSAGE = ("topic", "qos", "retain", "payload_size", "payload")
# `online`: the clients connected just after this event; `connected_ts`: when the
# session that ended connected (None if before the broker started).
_DISCONNECT = ("reason", "connected_ts", "online")

# type code -> (hook name, its own fields). Codes are fixed forever; new types get new ones.
TYPES: dict[int, tuple[str, tuple[str, ...]]] = {
    1: (
        "on_register",
        ("peer_addr", "peer_port", "clean_start", "protocol_level", "user_properties", "online"),
    ),
    2: (
        "on_register_failed",
        ("peer_addr", "peer_port", "clean_start", "protocol_level", "reason"),
    ),
    3: ("on_publish", (*_MESSAGE, "acl_name", "acl_pattern")),
    4: ("on_subscribe", ("topics",)),  # [[filter, granted qos or 128, acl_name, acl_pattern]]
    5: ("on_unsubscribe", ("topics",)),  # [filter]
    6: ("on_deliver", (*_MESSAGE, "acl_name", "persisted")),
    7: ("on_delivery_complete", (*_MESSAGE, "acl_name", "persisted")),
    8: ("on_offline_message", _MESSAGE),
    9: ("on_message_drop", (*_MESSAGE, "reason", "acl_name")),
    10: ("on_client_wakeup", ()),
    11: ("on_client_offline", _DISCONNECT),
    12: ("on_client_gone", _DISCONNECT),
    13: ("on_session_expired", ()),
}

CODES: dict[str, int] = {name: code for code, (name, _) in TYPES.items()}
HOOK_NAMES: tuple[str, ...] = tuple(CODES)


def decode_event(values: list[Any]) -> dict[str, Any]:
    """Name the fields of one decoded msgpack event (`type` becomes the hook name).
    An event of a type this version does not know keeps its fields as `values`."""
    event = dict(zip(COMMON, values, strict=False))
    known = TYPES.get(event.get("type", 0))
    rest = values[len(COMMON) :]
    if known is None:
        event["values"] = rest
        return event
    name, fields = known
    event["type"] = name
    event.update(zip(fields, rest, strict=False))
    return event
