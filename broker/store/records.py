"""How messages, queue entries and session records are laid out as bytes in the store.

A message record is the protocol level of its PUBLISH (1 byte), its absolute expiry time
(wall clock, 8-byte float, 0.0: none) and a PUBLISH packet: the bytes the publisher sent
when the broker still has them (so storing costs no encoding), otherwise the message
encoded as MQTT 5. The codec already reads and validates every field and property, so
there is no second serialisation to keep in step, and expiry keeps counting across a
restart.

A queue entry is one flags byte, then the `$share/<group>/<filter>` it came through (if
flag SHARED: 2-byte length + UTF-8), the delivery's QoS, retain flag and subscription ids
(1 byte, 1 byte, a count and 4-byte ids), then either the message record itself or (flag
REF) the 8-byte id of a message body stored once for several queues.

Times: the broker runs on the event loop's monotonic clock; `wall_offset` is
time.time() - loop.time().
"""

from __future__ import annotations

import json
import struct

from broker.message import MQTT5, Delivery, Message
from broker.mountpoints import outside
from broker.protocol import Decoder, Publish, encode
from broker.store.base import SessionRecord
from broker.subscription_trie import SubOptions

SHARED = 0x01
REF = 0x02
_HEAD = struct.Struct(">Bd")  # protocol level, expiry
_BODY_ID = struct.Struct(">Q")


class RecordError(ValueError):
    """Bytes in the store that do not decode (a corrupt or foreign record)."""


def encode_message(message: Message, wall_offset: float) -> bytes:
    expires = 0.0 if message.expires_at is None else message.expires_at + wall_offset
    if message.raw is not None:
        return _HEAD.pack(message.raw_level, expires) + message.raw
    # The topic its clients know (the raw PUBLISH above carries that one too): MQTT strings
    # cannot hold the "\0" of a mountpoint's topic (broker/mountpoints.py).
    packet = Publish(outside(message.topic), message.payload, message.qos, message.retain,
                     False, 1 if message.qos else None, message.properties)  # fmt: skip
    return _HEAD.pack(MQTT5, expires) + encode(packet, MQTT5)


def decode_message(data: bytes | memoryview, wall_offset: float) -> Message:
    """The stored message, its expiry on this run's clock."""
    if len(data) < _HEAD.size:
        raise RecordError("message record too short")
    level, expires = _HEAD.unpack_from(data)
    decoder = Decoder("client", level)
    decoder.receive_data(bytes(data[_HEAD.size :]))
    try:
        packet = decoder.next_packet()
    except Exception as exc:  # the codec's ProtocolError and friends: all mean corrupt
        raise RecordError(f"stored PUBLISH does not decode: {exc}") from exc
    if not isinstance(packet, Publish):
        raise RecordError("stored record is not a PUBLISH")
    message = Message(
        packet.topic, packet.payload, packet.qos, packet.retain, packet.properties, now=0.0
    )
    message.expires_at = None if expires == 0.0 else expires - wall_offset
    return message


def encode_entry(delivery: Delivery, wall_offset: float, body_id: int | None = None) -> bytes:
    """A queue entry: the delivery, with its message inline or as a reference."""
    flags = 0 if body_id is None else REF
    head = b""
    group = delivery.group
    if group is not None:
        flags |= SHARED
        share = f"$share/{group.name}/{group.filter}".encode()
        head = len(share).to_bytes(2, "big") + share
    sub_ids = delivery.sub_ids
    fields = bytes((flags,)) + head + bytes((delivery.qos, delivery.retain, len(sub_ids)))
    if sub_ids:
        fields += b"".join(i.to_bytes(4, "big") for i in sub_ids)
    if body_id is None:
        return fields + encode_message(delivery.message, wall_offset)
    return fields + _BODY_ID.pack(body_id)


class Entry:
    """A decoded queue entry, its message still to be found (`body_id`) or read (`rest`)."""

    __slots__ = ("body_id", "qos", "rest", "retain", "share", "sub_ids")

    def __init__(self, data: bytes) -> None:
        try:
            flags = data[0]
            pos = 1
            self.share = None
            if flags & SHARED:
                end = 3 + int.from_bytes(data[1:3], "big")
                self.share = data[3:end].decode()
                pos = end
            self.qos, retain, count = data[pos], data[pos + 1], data[pos + 2]
            self.retain = bool(retain)
            pos += 3
            self.sub_ids = tuple(
                int.from_bytes(data[pos + 4 * i : pos + 4 * i + 4], "big") for i in range(count)
            )
            pos += 4 * count
            self.body_id = _BODY_ID.unpack_from(data, pos)[0] if flags & REF else None
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise RecordError(f"queue entry does not decode: {exc}") from exc
        self.rest = memoryview(data)[pos:]

    def delivery(self, message: Message) -> Delivery:
        return Delivery(message, self.qos, self.retain, self.sub_ids)


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


_COUNTERS = struct.Struct(">QQ")  # layout 2: entries, next seq
_COUNTERS_3 = struct.Struct(">QQQB")  # layout 3: entries, next seq, floor, flags

# Flags of a layout-3 counters record: the session may have in-flight records (f/) or
# inbound QoS 2 ids (i/) in the store. Clear: it has none, and they need not be looked for.
HAS_INFLIGHT = 0x01
HAS_RECEIVED = 0x02
MAY_HAVE_ANY = HAS_INFLIGHT | HAS_RECEIVED  # what a record that does not say means


def encode_counters(
    queued: int, next_seq: int, floor: int | None = None, flags: int = MAY_HAVE_ANY
) -> bytes:
    """A queue's counters record; without `floor`, the layout-2 form (entries, next seq)."""
    if floor is None:
        return _COUNTERS.pack(queued, next_seq)
    return _COUNTERS_3.pack(queued, next_seq, floor, flags)


def decode_counters(data: bytes) -> tuple[int, int, int, int]:
    """(entries, next seq, floor, flags): no entry has a seq below `floor`; a layout-2
    record says nothing of either (floor 0, flags MAY_HAVE_ANY)."""
    if len(data) == _COUNTERS_3.size:
        queued, next_seq, floor, flags = _COUNTERS_3.unpack(data)
        return queued, next_seq, floor, flags
    if len(data) != _COUNTERS.size:
        raise RecordError("queue counters record has the wrong size")
    queued, next_seq = _COUNTERS.unpack(data)
    return queued, next_seq, 0, MAY_HAVE_ANY
