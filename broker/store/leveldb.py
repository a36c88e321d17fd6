"""LevelDB backend (plyvel).

Layout, one key space with prefixes:
    r/<topic>                    retained message
    s/<client id>                session record (JSON: expiry, offline_since, subscriptions)
    q/<client id>\\0<seq:8 bytes> a message queued for an offline session
Client ids cannot contain U+0000 [MQTT-1.5.4-2], so \\0 ends the id unambiguously.

Messages are stored as MQTT 5 PUBLISH packets: the codec already writes and validates
every field and property, so there is no second serialisation to keep in step. A queued
message that reached the session through a shared subscription is prefixed with
\\0, a 2-byte length and that `$share/<group>/<filter>` (a PUBLISH never starts with
\\0), so that after a restart it can still go to another member of its group.

Writes go into one WriteBatch committed once per event-loop turn (`sync=true` makes each
commit durable with one fsync for the whole turn's writes).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import plyvel

from broker.message import Delivery, Message
from broker.protocol import Decoder, Property, Publish, encode
from broker.router import SHARE_PREFIX, SubOptions
from broker.store.base import MessageStore, SessionRecord

RETAINED = b"r/"
SESSION = b"s/"
QUEUE = b"q/"


def _publish_bytes(message: Message, qos: int, retain: bool, sub_ids: tuple[int, ...]) -> bytes:
    properties = message.properties
    if sub_ids:
        properties = {**properties, Property.SUBSCRIPTION_IDENTIFIER: list(sub_ids)}
    # The packet id is required on the wire for QoS > 0 and meaningless in the store.
    packet = Publish(message.topic, message.payload, qos, retain, False, 1 if qos else None,
                     properties)  # fmt: skip
    return encode(packet, 5)


def _queued_bytes(delivery: Delivery) -> bytes:
    data = _publish_bytes(delivery.message, delivery.qos, delivery.retain, delivery.sub_ids)
    group = delivery.group
    if group is None:
        return data
    share = f"{SHARE_PREFIX}{group.name}/{group.filter}".encode()
    return b"\0" + len(share).to_bytes(2, "big") + share + data


def _delivery_from(data: bytes, now: float) -> tuple[Delivery, str | None]:
    """A queued message and the shared subscription filter it came through, if any.
    (`now`: a stored message's expiry interval counts again from the restart.)"""
    share = None
    if data[0] == 0:
        end = 3 + int.from_bytes(data[1:3], "big")
        share, data = data[3:end].decode(), data[end:]
    decoder = Decoder("client", 5)
    decoder.receive_data(data)
    packet = decoder.next_packet()
    assert isinstance(packet, Publish)
    sub_ids = tuple(packet.properties.pop(Property.SUBSCRIPTION_IDENTIFIER, ()))
    message = Message(
        packet.topic, packet.payload, packet.qos, packet.retain, packet.properties, now=now
    )
    return Delivery(message, packet.qos, packet.retain, sub_ids), share


def _queue_prefix(client_id: str) -> bytes:
    return QUEUE + client_id.encode() + b"\0"


class LevelDBStore(MessageStore):
    persistent = True

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop, *, sync: bool = True) -> None:
        os.makedirs(path, exist_ok=True)
        self._db = plyvel.DB(os.path.join(path, "messages"), create_if_missing=True)
        self._loop = loop
        self._sync = sync
        self._batch = None

    def _writes(self):
        if self._batch is None:
            self._batch = self._db.write_batch(sync=self._sync)
            self._loop.call_soon(self.commit)
        return self._batch

    def commit(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.write()

    # -- retained ----------------------------------------------------------------------

    def put_retained(self, message: Message) -> None:
        value = _publish_bytes(message, message.qos, True, ())
        self._writes().put(RETAINED + message.topic.encode(), value)

    def delete_retained(self, topic: str) -> None:
        self._writes().delete(RETAINED + topic.encode())

    def load_retained(self) -> Iterator[Message]:
        now = self._loop.time()
        for _, value in self._db.iterator(prefix=RETAINED):
            delivery, _ = _delivery_from(value, now)
            yield delivery.message

    # -- sessions ----------------------------------------------------------------------

    def put_session(self, record: SessionRecord) -> None:
        subscriptions = {
            f: [o.qos, o.no_local, o.retain_as_published, o.retain_handling, o.subscription_id]
            for f, o in record.subscriptions.items()
        }
        value = {
            "expiry": record.expiry,
            "offline_since": record.offline_since,
            "subscriptions": subscriptions,
        }
        self._writes().put(SESSION + record.client_id.encode(), json.dumps(value).encode())

    def delete_session(self, client_id: str) -> None:
        batch = self._writes()
        batch.delete(SESSION + client_id.encode())
        for key in self._db.iterator(prefix=_queue_prefix(client_id), include_value=False):
            batch.delete(key)

    def load_sessions(self) -> Iterator[SessionRecord]:
        self.commit()
        for key, value in self._db.iterator(prefix=SESSION):
            client_id = key[len(SESSION) :].decode()
            data = json.loads(value)
            record = SessionRecord(
                client_id,
                data["expiry"],
                data["offline_since"],
                {f: SubOptions(*o) for f, o in data["subscriptions"].items()},
            )
            prefix = _queue_prefix(client_id)
            now = self._loop.time()
            record.queue = [
                (int.from_bytes(k[len(prefix) :], "big"), *_delivery_from(v, now))
                for k, v in self._db.iterator(prefix=prefix)
            ]
            yield record

    # -- offline queues ----------------------------------------------------------------

    def enqueue(self, client_id: str, seq: int, delivery: Delivery) -> None:
        key = _queue_prefix(client_id) + seq.to_bytes(8, "big")
        self._writes().put(key, _queued_bytes(delivery))

    def dequeue(self, client_id: str, seq: int) -> None:
        self._writes().delete(_queue_prefix(client_id) + seq.to_bytes(8, "big"))

    def clear_queue(self, client_id: str) -> None:
        self.commit()
        batch = self._writes()
        for key in self._db.iterator(prefix=_queue_prefix(client_id), include_value=False):
            batch.delete(key)

    def close(self) -> None:
        self.commit()
        self._db.close()
