"""The relay's MessageRecorder (hooks/recorder.py): on_publish, on_deliver and
on_delivery_complete recorded from the broker's own objects, the publish and deliveries
of one message kept as one compact record.

A run is the events about one message recorded in a row: its on_publish (when relayed)
and the deliveries that follow it, as one record (`PUBLISH_DELIVERIES`); deliveries of a
message whose publish is not the record before them (a queue drained later, on_publish
not relayed) make a `DELIVERIES` record. Anything else recorded ends the run first, so the
log keeps the order in which things happened; the run also ends with the loop turn. The
message's fields are encoded once per record and each receiver's identity once per
connection, which is what makes a fan-out's deliveries cheap to relay: the broker's own
cost of a delivery is about a microsecond, and a hook call with a context per delivery
cost more than that.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import msgpack

from event_relay.log import EventLog
from event_relay.schema import CODES, DELIVERIES, PUBLISH_DELIVERIES
from hooks import MatchedAcl

_ON_PUBLISH = CODES["on_publish"]
_ON_DELIVERY_COMPLETE = CODES["on_delivery_complete"]
_time_ns = time.time_ns
_pack = msgpack.Packer().pack
_TRUE, _FALSE = b"\xc3", b"\xc2"
# A receiver's last three fields, encoded: [qos][retain][persisted].
_FLAGS = [
    [
        [bytes((qos,)) + retain + persisted for persisted in (_FALSE, _TRUE)]
        for retain in (_FALSE, _TRUE)
    ]
    for qos in range(3)
]
_RECEIVER = b"\x97"  # a receiver is an array of 7 (event_relay/schema.py)
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
        # The open run: the message its deliveries extend, the record's fields before its
        # receivers, and the receivers (identity, flags, identity, flags, ...).
        self._message: Any = None
        self._head: list[Any] = []
        self._code = DELIVERIES
        self._receivers: list[bytes] = []
        self._identities: dict[str, bytes] = {}  # session id -> encoded identity
        self._end_due = False

    # -- hooks.MessageRecorder -----------------------------------------------------------

    def published(self, client: Any, message: Any, matched_acl: MatchedAcl | None) -> None:
        if self._message is not None:
            self._close()
        if not self._publish or (self._sample and self._sampled_out("on_publish", message)):
            return  # its deliveries, if relayed, make a DELIVERIES record
        payload = message.payload
        head = [
            0,
            _time_ns(),
            0,
            client.client_id,
            "",
            client.username,
            client.session_id,
            message.topic,
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
        self._open(message, PUBLISH_DELIVERIES, head)

    def delivered(self, session: Any, delivery: Any) -> None:
        if not self._deliver or (
            self._sample and self._sampled_out("on_deliver", delivery.message)
        ):
            return
        message = delivery.message
        if message is not self._message:
            if self._message is not None:
                self._close()
            payload = message.payload
            head = [
                0,
                _time_ns(),
                0,
                message.topic,
                len(payload) if self._sizes else None,
                payload if self._full else None,
                message.acl_name,
            ]
            self._open(message, DELIVERIES, head)
        identity = self._identities.get(session.session_id)
        if identity is None:
            identity = self._identity(session)
        flags = _FLAGS[delivery.qos][delivery.retain][delivery.seq >= 0]
        self._receivers += (identity, flags)

    def completed(self, session: Any, delivery: Any) -> None:
        message = delivery.message
        if not self._complete or (
            self._sample and self._sampled_out("on_delivery_complete", message)
        ):
            return
        payload = message.payload
        self.append(
            _ON_DELIVERY_COMPLETE,
            [
                0,
                _time_ns(),
                0,
                session.client_id,
                "",
                session.username,
                session.session_id,
                message.topic,
                delivery.qos,
                delivery.retain,
                len(payload) if self._sizes else None,
                payload if self._full else None,
                message.acl_name,
                delivery.seq >= 0,
            ],
        )

    # -- the other events, and the end of a run ------------------------------------------

    def append(self, code: int, values: list[Any]) -> None:
        """Any other event: the open run is recorded first (the log keeps the order)."""
        if self._message is not None:
            self._close()
        self.log.append(code, values)

    def seal(self) -> None:
        """Record the open run now (before the log is flushed for an acknowledgement)."""
        if self._message is not None:
            self._close()

    def _open(self, message: Any, code: int, head: list[Any]) -> None:
        self._message = message
        self._code = code
        self._head = head
        if not self._end_due:  # a run ends with the loop turn at the latest
            self._end_due = True
            self.schedule(self._turn_ended)

    def _turn_ended(self) -> None:
        self._end_due = False
        if self._message is not None:
            self._close()

    def _close(self) -> None:
        head, receivers, code = self._head, self._receivers, self._code
        self._message = None
        count = len(receivers) >> 1
        if count == 0:  # a publish that reached no one (now): a plain on_publish
            self.log.append(_ON_PUBLISH, head)
            return
        head[0] = self.log.next_seq
        head[2] = code
        head += (count, b"".join(receivers))
        receivers.clear()
        self.log.append_record(code, _pack(head), count + (code == PUBLISH_DELIVERIES))

    def _identity(self, session: Any) -> bytes:
        """A receiver's first four fields, encoded once per connection."""
        identities = self._identities
        if len(identities) >= _IDENTITIES_KEPT:
            identities.clear()
        identity = identities[session.session_id] = b"".join(
            (
                _RECEIVER,
                _pack(session.client_id),
                b"\xa0",
                _pack(session.username),
                _pack(session.session_id),
            )
        )
        return identity

    def _sampled_out(self, hook: str, message: Any) -> bool:
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
