"""How messages, queue entries and session records are laid out as bytes in the store.

A message is kept as an MQTT 5 PUBLISH packet (the codec already writes and validates
every field and property, so there is no second serialisation to keep in step), preceded
by its absolute expiry time (wall clock, 8-byte float, 0.0: none), so that MQTT 5 message
expiry keeps counting across a restart.

A queue entry is one flags byte, then the `$share/<group>/<filter>` it came through (if
flag SHARED: 2-byte length + UTF-8), then either the message itself with the delivery's
QoS, retain flag and subscription ids (INLINE), or a reference to a message body stored
once for several queues (REF: 8-byte body id, QoS, retain, count of subscription ids and
the ids as 4-byte integers).

Times: the broker runs on the event loop's monotonic clock; `wall_offset` is
time.time() - loop.time() at the moment of conversion.
"""

from __future__ import annotations

import json
import struct

from broker.message import Delivery, Message
from broker.protocol import Decoder, Property, Publish, encode
from broker.router import SubOptions
from broker.store.base import SessionRecord

SHARED = 0x01
REF = 0x02
_EXPIRY = struct.Struct(">d")
_REF = struct.Struct(">QBBB")


class RecordError(ValueError):
    """Bytes in the store that do not decode (a corrupt or foreign record)."""


def encode_message(
    message: Message, qos: int, retain: bool, sub_ids: tuple[int, ...], wall_offset: float
) -> bytes:
    properties = message.properties
    if sub_ids:
        properties = {**properties, Property.SUBSCRIPTION_IDENTIFIER: list(sub_ids)}
    # The packet id is required on the wire for QoS > 0 and meaningless in the store.
    packet = Publish(message.topic, message.payload, qos, retain, False, 1 if qos else None,
                     properties)  # fmt: skip
    expires = 0.0 if message.expires_at is None else message.expires_at + wall_offset
    return _EXPIRY.pack(expires) + encode(packet, 5)


def decode_message(data: bytes | memoryview, wall_offset: float) -> tuple[Publish, Message]:
    """The stored PUBLISH and the message it carries (expiry restored on this clock)."""
    if len(data) < _EXPIRY.size:
        raise RecordError("message record too short")
    (expires,) = _EXPIRY.unpack_from(data)
    decoder = Decoder("client", 5)
    decoder.receive_data(bytes(data[_EXPIRY.size :]))
    try:
        packet = decoder.next_packet()
    except Exception as exc:  # the codec's ProtocolError and friends: all mean corrupt
        raise RecordError(f"stored PUBLISH does not decode: {exc}") from exc
    if not isinstance(packet, Publish):
        raise RecordError("stored record is not a PUBLISH")
    properties = dict(packet.properties)
    properties.pop(Property.SUBSCRIPTION_IDENTIFIER, None)
    message = Message(packet.topic, packet.payload, packet.qos, packet.retain, properties, now=0.0)
    message.expires_at = None if expires == 0.0 else expires - wall_offset
    return packet, message


def encode_entry(delivery: Delivery, wall_offset: float, body_id: int | None = None) -> bytes:
    """A queue entry: the message inline, or a reference to body `body_id`."""
    flags = 0
    head = b""
    group = delivery.group
    if group is not None:
        flags |= SHARED
        share = f"$share/{group.name}/{group.filter}".encode()
        head = len(share).to_bytes(2, "big") + share
    if body_id is None:
        body = encode_message(
            delivery.message, delivery.qos, delivery.retain, delivery.sub_ids, wall_offset
        )
    else:
        flags |= REF
        sub_ids = delivery.sub_ids
        body = _REF.pack(body_id, delivery.qos, delivery.retain, len(sub_ids))
        body += b"".join(i.to_bytes(4, "big") for i in sub_ids)
    return bytes((flags,)) + head + body


def decode_entry(data: bytes) -> tuple[str | None, int | None, memoryview]:
    """(share, body id or None, the rest): the rest is the inline message, or the
    reference's delivery fields for `delivery_from_ref`."""
    if not data:
        raise RecordError("empty queue entry")
    flags = data[0]
    view = memoryview(data)[1:]
    share = None
    if flags & SHARED:
        end = 2 + int.from_bytes(view[:2], "big")
        share = bytes(view[2:end]).decode()
        view = view[end:]
    if flags & REF:
        (body_id,) = struct.unpack_from(">Q", view)
        return share, body_id, view[8:]
    return share, None, view


def delivery_inline(data: memoryview, wall_offset: float) -> Delivery:
    packet, message = decode_message(data, wall_offset)
    sub_ids = tuple(packet.properties.get(Property.SUBSCRIPTION_IDENTIFIER, ()))
    return Delivery(message, packet.qos, packet.retain, sub_ids)


def delivery_from_ref(fields: memoryview, message: Message) -> Delivery:
    qos, retain, count = fields[0], fields[1], fields[2]
    sub_ids = tuple(int.from_bytes(fields[3 + 4 * i : 7 + 4 * i], "big") for i in range(count))
    return Delivery(message, qos, bool(retain), sub_ids)


# -- sessions ---------------------------------------------------------------------------


def encode_session(record: SessionRecord) -> bytes:
    subscriptions = {
        f: [o.qos, o.no_local, o.retain_as_published, o.retain_handling, o.subscription_id]
        for f, o in record.subscriptions.items()
    }
    value = {
        "expiry": record.expiry,
        "offline_since": record.offline_since,
        "subscriptions": subscriptions,
    }
    return json.dumps(value).encode()


def decode_session(client_id: str, data: bytes) -> SessionRecord:
    try:
        value = json.loads(data)
        return SessionRecord(
            client_id,
            value["expiry"],
            value["offline_since"],
            {f: SubOptions(*o) for f, o in value["subscriptions"].items()},
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"session record of {client_id!r} does not decode: {exc}") from exc


_COUNTERS = struct.Struct(">QQ")


def encode_counters(queued: int, next_seq: int) -> bytes:
    return _COUNTERS.pack(queued, next_seq)


def decode_counters(data: bytes) -> tuple[int, int]:
    if len(data) != _COUNTERS.size:
        raise RecordError("queue counters record has the wrong size")
    queued, next_seq = _COUNTERS.unpack(data)
    return queued, next_seq
