"""A session's in-flight window: its outbound QoS 1/2 messages under their packet ids until
the client acknowledges them, which of them are due to be sent again (retry_interval),
and the ids of inbound QoS 2 messages awaiting PUBREL.

Pure state (no I/O, no clock, no store): the session writes, times and stores beside it.
At most `size` outbound messages are in flight [MQTT-4.9.0-2]: max_inflight_messages, or
less when the client's Receive Maximum says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from broker.message import Delivery, Message

AWAITING_ACK = 0  # PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAITING_COMP = 1  # PUBREL sent; waiting for PUBCOMP
NO_IDS: AbstractSet[int] = frozenset()  # shared by the windows that have none
# In flight awaiting PUBCOMP after a restart: the message itself is no longer kept.
RELEASED = Delivery(Message("", b"", 2), 2, False)
MAX_PACKET_ID = 65535
# Nothing in flight: one empty dict shared by the windows that never had anything in
# flight (most: a subscriber at QoS 0, an idle client), which a dict of their own would
# cost 64 bytes each. Never written to: `add` and `restore` give a window its own first
# (and every other change removes an entry, which an empty dict has not).
_NONE_IN_FLIGHT: dict[int, list[Any]] = {}


class InflightWindow:
    __slots__ = ("_marked", "_next_id", "entries", "limit", "received", "size")

    def __init__(self, limit: int) -> None:
        self.entries = _NONE_IN_FLIGHT  # packet id -> [Delivery, state]
        self.limit = limit or MAX_PACKET_ID  # max_inflight_messages; 0 means no limit
        self.size = self.limit  # the window of the connection attached
        # Inbound QoS 2 ids awaiting PUBREL (a set of its own from the first one on).
        self.received: AbstractSet[int] = NO_IDS
        self._next_id = 1
        self._marked: AbstractSet[int] = NO_IDS  # in flight at the last retry tick

    def open(self, receive_maximum: int) -> None:
        """A connection is attached: its window is ours or its Receive Maximum."""
        self.size = min(self.limit, receive_maximum)

    # -- outbound ------------------------------------------------------------------------

    def add(self, delivery: Delivery) -> int:
        """Put a delivery in flight under a new packet id, which is returned."""
        packet_id = self._next_id
        entries = self.entries
        if entries is _NONE_IN_FLIGHT:
            entries = self.entries = {}
        while packet_id in entries:
            packet_id = packet_id % MAX_PACKET_ID + 1
        self._next_id = packet_id % MAX_PACKET_ID + 1
        entries[packet_id] = [delivery, AWAITING_ACK]
        return packet_id

    def unacknowledged(self) -> list[Delivery]:
        """The deliveries whose PUBLISH is unanswered, oldest first."""
        return [delivery for delivery, state in self.entries.values() if state == AWAITING_ACK]

    def puback(self, packet_id: int) -> Delivery | None:
        """PUBACK: the QoS 1 delivery it completes, out of the window (None: no such)."""
        entry = self.entries.get(packet_id)
        if entry is None or entry[0].qos != 1:
            return None
        del self.entries[packet_id]
        return entry[0]

    def pubrec(self, packet_id: int) -> Delivery | None:
        """PUBREC: the QoS 2 delivery it answers, now awaiting PUBCOMP (None: no such)."""
        entry = self.entries.get(packet_id)
        if entry is None or entry[0].qos != 2:
            return None
        entry[1] = AWAITING_COMP
        return entry[0]

    def pubcomp(self, packet_id: int) -> bool:
        """PUBCOMP: whether it ended an exchange in the window."""
        entry = self.entries.get(packet_id)
        if entry is None or entry[1] != AWAITING_COMP:
            return False
        del self.entries[packet_id]
        return True

    def mark_for_retry(self) -> None:
        """A retry interval starts: what is in flight now is due at its end."""
        self._marked = set(self.entries)

    def due_for_retry(self) -> list[int]:
        """What was in flight at the last mark and still is (unacknowledged for between
        one and two retry intervals), in packet id order."""
        return sorted(self._marked & self.entries.keys())

    def remove(self, packet_id: int) -> None:
        del self.entries[packet_id]

    def remove_sent(self, sent: AbstractSet[int]) -> list[int]:
        """Take out the deliveries whose id() is in `sent` (they went to another node);
        returns their packet ids."""
        gone = [pid for pid, (delivery, _) in self.entries.items() if id(delivery) in sent]
        for packet_id in gone:
            del self.entries[packet_id]
        return gone

    def restore(self, entries: Iterable[tuple[int, Delivery, int]]) -> None:
        """What a previous run had in flight: (packet id, delivery, state)."""
        if self.entries is _NONE_IN_FLIGHT:
            self.entries = {}
        for packet_id, delivery, state in entries:
            self.entries[packet_id] = [delivery, state]
        if self.entries:
            self._next_id = max(self.entries) % MAX_PACKET_ID + 1

    # -- inbound QoS 2 -------------------------------------------------------------------

    def receive_qos2(self, packet_id: int) -> None:
        """An inbound QoS 2 PUBLISH was routed: a resend of it must not be [MQTT-4.3.3]."""
        received = self.received
        if not isinstance(received, set):  # the first: the window gets a set of its own
            received = self.received = set()
        received.add(packet_id)

    def release_qos2(self, packet_id: int) -> bool:
        """PUBREL: False when the packet id was not awaiting one."""
        received = self.received
        if not (isinstance(received, set) and packet_id in received):
            return False
        received.remove(packet_id)
        return True
