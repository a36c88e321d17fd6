"""The relay's MessageRecorder (hooks/recorder.py): on_publish, on_deliver and
on_delivery_complete recorded from the broker's own objects, the events of one message,
or of one receiver, kept as one compact record.

A run is events recorded in a row that make one record:
- a message's on_publish (when relayed) and the deliveries made while routing it
  (`PUBLISH_DELIVERIES`), or deliveries of one message without its publish before them
  (`DELIVERIES`: on_publish not relayed, a message from another node);
- one receiver connection's deliveries and completions (`SESSION_EVENTS`): a queue drained
  when the subscriber has room again, the PUBACKs it sent and the deliveries they let go
  out. A DELIVERIES run of one receiver becomes one when that receiver's next event comes.
Anything else recorded ends the run first, so the log keeps the order in which things
happened; the run also ends with the loop turn. The message's fields are encoded once per
message run and each receiver's identity once per connection, which is what makes a
fan-out's deliveries, and a flood's queued ones, cheap to relay: the broker's own cost of a
delivery is about a microsecond, and a hook call with a context per delivery cost more
than that.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from broker.mountpoints import outside
from event_relay.log import EventLog
from event_relay.schema import CODES, DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS
from hooks import MatchedAcl, RecordedClient, RecordedDelivery, RecordedMessage

_ON_PUBLISH = CODES["on_publish"]
_ON_DELIVER = CODES["on_deliver"]
_ON_DELIVERY_COMPLETE = CODES["on_delivery_complete"]
_time_ns = time.time_ns
_pack = msgpack.Packer().pack
_TRUE, _FALSE = b"\xc3", b"\xc2"
# A receiver's or an item's last three fields, encoded: [qos][retain][persisted].
_FLAGS = [
    [
        [bytes((qos,)) + retain + persisted for persisted in (_FALSE, _TRUE)]
        for retain in (_FALSE, _TRUE)
    ]
    for qos in range(3)
]
_RECEIVER = b"\x97"  # a receiver is an array of 7 (event_relay/schema.py)
# An item of a SESSION_EVENTS record is an array of 8 whose first field is its type code.
_ITEM = {code: b"\x98" + bytes((code,)) for code in (_ON_DELIVER, _ON_DELIVERY_COMPLETE)}
_IDENTITIES_KEPT = 65_536  # receivers' encoded identities cached (then the cache starts over)


class Recorder:
    def __init__(
        self,
        log: EventLog,
        relayed: set[str],
        payloads: str,
        sample: dict[str, dict[str, int]],
        schedule: Callable[[Callable[[], None]], object],
    ) -> None:
        """`relayed`: the hooks the log keeps; `payloads`: full, size or none; `sample`:
        hook -> ACL label -> percentage relayed (Courier's); `schedule(callback)`: call it
        once the loop turn ends (the end of a run at the latest)."""
        self.log = log
        self._publish = "on_publish" in relayed
        self._deliver = "on_deliver" in relayed
        self._complete = "on_delivery_complete" in relayed
        self._full = payloads == "full"
        self._sizes = payloads != "none"
        self._sample = sample
        self.schedule = schedule  # the plugin sets the loop's call_soon once it runs
        self.sampled_out = 0
        # The open run: its record code (0: none), the message a message run's deliveries
        # extend, the session id of a session run's receiver (or of a DELIVERIES run's one
        # receiver so far: `_who`), the record's fields before its receivers or items, and
        # those (each encoded).
        self._code = 0
        self._message: RecordedMessage | None = None
        self._session_id: str | None = None
        self._who: Any = None
        self._head: list[Any] = []
        self._items: list[bytes] = []
        self._identities: dict[str, bytes] = {}  # session id -> encoded identity
        self._end_due = False

    # -- hooks.MessageRecorder -----------------------------------------------------------

    def published(
        self, client: RecordedClient, message: RecordedMessage, matched_acl: MatchedAcl | None
    ) -> None:
        if self._code:
            self._close()
        if not self._publish or (self._sample and self._sampled_out("on_publish", message)):
            return  # its deliveries, if relayed, make a DELIVERIES record
        payload = message.payload
        head = [
            0,
            _time_ns(),
            0,
            client.client_id,
            client.mountpoint,
            client.username,
            client.session_id,
            outside(message.topic),
            message.qos,
            message.retain,
            len(payload) if self._sizes else None,
            payload if self._full else None,
            message.acl_name,
            "" if matched_acl is None else matched_acl.pattern,
        ]
        if not self._deliver:
            self.log.append(_ON_PUBLISH, head)
            return
        self._open(PUBLISH_DELIVERIES, head, message)

    def delivered(self, session: RecordedClient, delivery: RecordedDelivery) -> None:
        message = delivery.message
        if not self._deliver or (self._sample and self._sampled_out("on_deliver", message)):
            return
        code = self._code
        if code and message is self._message:  # this message's run: one more receiver
            self._session_id = None  # not one receiver's any more
            self._items.append(self._receiver(session, delivery))
            return
        if code and session.session_id is self._session_id:  # this receiver's
            self._session_run()
            self._items.append(self._item(_ON_DELIVER, message, delivery))
            return
        if code:
            self._close()
        receiver = self._receiver(session, delivery)
        payload = message.payload
        head = [
            0,
            _time_ns(),
            0,
            outside(message.topic),
            len(payload) if self._sizes else None,
            payload if self._full else None,
            message.acl_name,
        ]
        self._open(DELIVERIES, head, message)
        self._items.append(receiver)
        self._session_id, self._who = session.session_id, session  # its one receiver so far

    def completed(self, session: RecordedClient, delivery: RecordedDelivery) -> None:
        message = delivery.message
        if not self._complete or (
            self._sample and self._sampled_out("on_delivery_complete", message)
        ):
            return
        item = self._item(_ON_DELIVERY_COMPLETE, message, delivery)
        if self._code and session.session_id is self._session_id:
            self._session_run()
        else:
            if self._code:
                self._close()
            self._open(SESSION_EVENTS, self._session_head(session, _time_ns()))
            self._session_id = session.session_id
        self._items.append(item)

    def published_run(
        self,
        client: RecordedClient,
        topic: str,
        payloads: Sequence[bytes],
        receivers: Sequence[RecordedClient],
        matched_acl: MatchedAcl | None,
    ) -> None:
        """A run of QoS 0 messages as the broker's fast path tells it: what it means,
        message by message (hooks/recorder.py)."""
        acl_name = "" if matched_acl is None else matched_acl.name
        for payload in payloads:
            message = _RunMessage(topic, payload, acl_name)
            self.published(client, message, matched_acl)
            delivery = _RunDelivery(message)
            for receiver in receivers:
                self.delivered(receiver, delivery)

    # -- the other events, and the end of a run ------------------------------------------

    def append(self, code: int, values: list[Any]) -> None:
        """Any other event: the open run is recorded first (the log keeps the order)."""
        if self._code:
            self._close()
        self.log.append(code, values)

    def seal(self) -> None:
        """Record the open run now (before the log is flushed for an acknowledgement)."""
        if self._code:
            self._close()

    def _open(self, code: int, head: list[Any], message: RecordedMessage | None = None) -> None:
        self._code = code
        self._message = message
        self._head = head
        if not self._end_due:  # a run ends with the loop turn at the latest
            self._end_due = True
            self.schedule(self._turn_ended)

    def _session_run(self) -> None:
        """The open run is the receiver's: a DELIVERIES run of its one delivery becomes a
        SESSION_EVENTS run holding it as its first item."""
        if self._code == SESSION_EVENTS:
            return
        _, ts, _, topic, size, payload, acl_name = self._head
        receiver = self._items[0]
        flags = receiver[-3:]
        fields = b"".join(map(_pack, (topic, size, payload, acl_name)))
        self._items = [_ITEM[_ON_DELIVER] + fields + flags]
        self._code, self._message = SESSION_EVENTS, None
        self._head = self._session_head(self._who, ts)

    def _turn_ended(self) -> None:
        self._end_due = False
        if self._code:
            self._close()

    def _close(self) -> None:
        head, items, code = self._head, self._items, self._code
        self._code, self._message, self._session_id, self._who = 0, None, None, None
        count = len(items)
        if count == 0:  # its first receiver or item failed, or a publish reached no one
            if code == PUBLISH_DELIVERIES:  # (now): a plain on_publish
                self.log.append(_ON_PUBLISH, head)
            return
        head[0] = self.log.next_seq
        head[2] = code
        head += (count, b"".join(items))
        self._items = []
        self.log.append_record(code, _pack(head), count + (code == PUBLISH_DELIVERIES))

    def _session_head(self, session: RecordedClient, ts: int) -> list[Any]:
        return [
            0,
            ts,
            0,
            session.client_id,
            session.mountpoint,
            session.username,
            session.session_id,
        ]

    def _receiver(self, session: RecordedClient, delivery: RecordedDelivery) -> bytes:
        """A message run's receiver: its identity (encoded once per connection), then its
        delivery's qos, retain and whether the store keeps it."""
        identity = self._identities.get(session.session_id)
        if identity is None:
            identity = self._identity(session)
        return identity + _FLAGS[delivery.qos][delivery.retain][delivery.seq >= 0]

    def _item(self, code: int, message: RecordedMessage, delivery: RecordedDelivery) -> bytes:
        """A session run's item: the event's code, the message's fields, the flags."""
        payload = message.payload
        fields = (
            outside(message.topic),
            len(payload) if self._sizes else None,
            payload if self._full else None,
            message.acl_name,
        )
        flags = _FLAGS[delivery.qos][delivery.retain][delivery.seq >= 0]
        return _ITEM[code] + b"".join(map(_pack, fields)) + flags

    def _identity(self, session: RecordedClient) -> bytes:
        """A receiver's first four fields, encoded once per connection."""
        identities = self._identities
        if len(identities) >= _IDENTITIES_KEPT:
            identities.clear()
        identity = identities[session.session_id] = b"".join(
            (
                _RECEIVER,
                _pack(session.client_id),
                _pack(session.mountpoint),
                _pack(session.username),
                _pack(session.session_id),
            )
        )
        return identity

    def _sampled_out(self, hook: str, message: RecordedMessage) -> bool:
        """Courier's rule: events whose ACL label has a rule are relayed with that
        probability; without a label or a rule, always."""
        rates = self._sample.get(hook)
        if rates is None or not message.acl_name:
            return False
        percentage = rates.get(message.acl_name)
        if percentage is None or random.random() * 100 < percentage:
            return False
        self.sampled_out += 1
        return True


class _RunMessage:
    """A message of a run (published_run), as a RecordedMessage."""

    __slots__ = ("acl_name", "payload", "topic")
    qos = 0
    retain = False

    def __init__(self, topic: str, payload: bytes, acl_name: str) -> None:
        self.topic = topic
        self.payload = payload
        self.acl_name = acl_name


class _RunDelivery:
    """A delivery of a run's message, as a RecordedDelivery: QoS 0, unretained, unstored."""

    __slots__ = ("message",)
    qos = 0
    retain = False
    seq = -1

    def __init__(self, message: _RunMessage) -> None:
        self.message = message
