"""What an event is: its type codes and fields, shared by the encoder, the decoder, the
Courier sidecar push and the docs (docs/event-relay.md, "Events").

On the wire an event is a msgpack array: the seven common fields, then its type's own
fields in the order listed here. Readers name them with `decode_event`, so a new field
(appended at the end of a type) breaks no reader.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import msgpack

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
    # Not a hook's: the relay's own, the broker's clock in `ts` (the other common fields
    # empty), appended when no event has come for `heartbeat_interval` seconds and when a
    # reader asks (QUERY {heartbeat: true}), so that a reader's event time moves on while
    # the broker is quiet (a Spark query's watermark closes its last windows).
    17: ("heartbeat", ()),
}

CODES: dict[str, int] = {name: code for code, (name, _) in TYPES.items()}

# Compact records (docs/event-relay.md, "Compact records"): the events about one message,
# or of one receiver, made in a row, as one record (event_relay/recorder.py). `expand`
# makes them events again; their sequence numbers are the record's and the ones after it,
# and they share its ts. After the common fields' first three:
#   DELIVERIES          topic, payload_size, payload, acl_name, receiver_count, receivers
#   PUBLISH_DELIVERIES  on_publish's fields (client_id ... acl_pattern), receiver_count,
#                       receivers
#   SESSION_EVENTS      the receiver's client_id, mountpoint, username, session_id,
#                       item_count, items
# `receivers` is a bin holding receiver_count msgpack arrays one after another, each
# [client_id, mountpoint, username, session_id, qos, retain, persisted]; `items` one of
# item_count arrays, each [type code (on_deliver or on_delivery_complete), topic,
# payload_size, payload, acl_name, qos, retain, persisted] (a reader that only counts
# decodes none of them).
DELIVERIES = 14  # on_deliver once per receiver
PUBLISH_DELIVERIES = 15  # on_publish, then on_deliver once per receiver
SESSION_EVENTS = 16  # one receiver's on_deliver and on_delivery_complete events
_ON_PUBLISH, _ON_DELIVER = CODES["on_publish"], CODES["on_deliver"]
_ON_DELIVERY_COMPLETE = CODES["on_delivery_complete"]


def event_count(record: list[Any]) -> int:
    """How many events (sequence numbers) a record holds."""
    code = record[2]
    if code == PUBLISH_DELIVERIES:
        return 1 + record[14]
    if code in (DELIVERIES, SESSION_EVENTS):
        return record[7]
    return 1


def record_codes(codes: frozenset[int]) -> frozenset[int]:
    """The record codes to read for events of `codes`: a compact record is read when
    one of its events is wanted (the reader drops the others)."""
    found = set(codes)
    if _ON_DELIVER in codes:
        found |= {DELIVERIES, PUBLISH_DELIVERIES}
    if _ON_PUBLISH in codes:
        found.add(PUBLISH_DELIVERIES)
    if _ON_DELIVER in codes or _ON_DELIVERY_COMPLETE in codes:
        found.add(SESSION_EVENTS)
    return frozenset(found)


def _receivers(count: int, data: bytes) -> list[list[Any]]:
    """A compact record's receivers or items, decoded (a bin of `count` msgpack arrays)."""
    decoded: list[list[Any]] = msgpack.unpackb(b"\xdd" + count.to_bytes(4, "big") + data)
    return decoded


def expand(
    records: list[list[Any]],
    start: int = 0,
    end: int | None = None,
    codes: Container[int] | None = None,
) -> list[list[Any]]:
    """The events of `records` as plain event arrays, only those with start <= seq < end
    (a read may begin or end inside a record) and, when given, of the types in `codes` (a
    compact record may hold types a reader did not ask for)."""
    events: list[list[Any]] = []
    for record in records:
        code = record[2]
        if code == PUBLISH_DELIVERIES:
            seq, ts, _, client_id, mountpoint, username, session_id, topic = record[:8]
            qos, retain, size, payload, acl_name, acl_pattern, count, receivers = record[8:16]
            publish = [seq, ts, _ON_PUBLISH, client_id, mountpoint, username, session_id]
            publish += (topic, qos, retain, size, payload, acl_name, acl_pattern)
            events.append(publish)
            seq += 1
        elif code == DELIVERIES:
            seq, ts, _, topic, size, payload, acl_name, count, receivers = record[:9]
        elif code == SESSION_EVENTS:
            seq, ts, _, client_id, mountpoint, username, session_id, count, items = record[:9]
            for kind, topic, size, payload, acl_name, qos, retain, persisted in _receivers(
                count, items
            ):
                event = [seq, ts, kind, client_id, mountpoint, username, session_id, topic]
                event += (qos, retain, size, payload, acl_name, persisted)
                events.append(event)
                seq += 1
            continue
        else:
            events.append(record)
            continue
        for client_id, mountpoint, username, session_id, qos, retain, persisted in _receivers(
            count, receivers
        ):
            deliver = [seq, ts, _ON_DELIVER, client_id, mountpoint, username, session_id]
            deliver += (topic, qos, retain, size, payload, acl_name, persisted)
            events.append(deliver)
            seq += 1
    if start or end is not None or codes is not None:
        stop = end if end is not None else float("inf")
        events = [
            event
            for event in events
            if start <= event[0] < stop and (codes is None or event[2] in codes)
        ]
    return events


HEARTBEAT = CODES["heartbeat"]
# The event types that are hooks' (what `hooks` lists and the sidecar can push).
HOOK_NAMES: tuple[str, ...] = tuple(name for name in CODES if name != "heartbeat")


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
