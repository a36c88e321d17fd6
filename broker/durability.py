"""A session's undelivered messages beyond its queue: what the store keeps of what was in
flight, read back after a restart, and everything undelivered handed on when the session
goes elsewhere.

A durable session (persistent store, expiry not 0) keeps each queued message and what is
in flight in the store too, a delivery under its sequence number (Delivery.seq); the
queue's own records are broker/session_queue.py's. After a restart the in-flight window
and the inbound QoS 2 ids stay in the store until first needed (a connection, a drain
from the stored backlog, a handover), then `_read_back_state` reads them at once.

Handing on: to another node (broker/cluster/handover.py, a chunk at a time,
`leaving_chunk` then `forget_sent`), into memory when the session stops outliving its
connection (`make_volatile`), or back to a MultiSession when one of its connections ends
(`take_back`).

`Durability` is a part of the Session (broker/session.py): it works on the session's
state (broker/session_state.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.inflight import AWAITING_ACK, AWAITING_COMP, RELEASED
from broker.session_state import SessionState

if TYPE_CHECKING:
    from broker.message import Delivery


class Durability(SessionState):
    __slots__ = ()

    def restore(self, queued: int, next_seq: int) -> None:
        """A session a previous run stored: its queue stays in the store until it is
        delivered; what was in flight is read back when the client connects."""
        self.queue.restore(queued, next_seq)
        self._restored = True

    def _read_back_state(self) -> None:
        """The messages in flight and the inbound QoS 2 ids a previous run stored."""
        self._restored = False
        store, client_id, queue = self.store, self.subscriber_id, self.queue
        found: list[tuple[int, Delivery, int]] = []
        for packet_id, seq, state, inline in store.load_inflight(client_id):
            if state == AWAITING_COMP:
                found.append((packet_id, RELEASED, AWAITING_COMP))
                continue
            entry = inline or store.get_entry(client_id, seq)
            if entry is None or entry.delivery is None:
                store.delete_inflight(client_id, packet_id)
                continue
            found.append((packet_id, queue.rejoined(entry), AWAITING_ACK))
            if inline is None:
                queue.on_disk -= 1  # it was counted with the queue's entries
        self.window.restore(found)
        received = store.load_received(client_id)
        if received:
            self.window.received = received

    def _inflight_seqs(self) -> list[int]:
        """The store's sequence numbers of what is in flight (reading the queue back from
        the store steps over them); what a previous run had in flight is read back first."""
        if self._restored:
            self._read_back_state()
        return [delivery.seq for delivery, _ in self.window.entries.values()]

    def stored_backlog(self) -> list[Delivery]:
        """Everything only the store holds (when the session ends, for shared groups)."""
        return self.queue.stored(self._inflight_seqs())

    # -- handing on ----------------------------------------------------------------------

    def holds_messages(self) -> bool:
        """Whether anything waits to be delivered: in flight, queued or in the store."""
        queue = self.queue
        return bool(self.window.entries or queue.memory or queue.on_disk or self._restored)

    def leaving_chunk(self, count: int) -> list[Delivery]:
        """The next `count` undelivered messages of a session handed to another node,
        oldest first: in flight and unacknowledged, then queued, then what only the store
        holds (read a chunk at a time). They stay until `forget_sent`."""
        if self._restored:
            self._read_back_state()
        chunk = self.window.unacknowledged()[:count]
        return chunk or self.queue.leaving_chunk(count)

    def forget_sent(self, chunk: list[Delivery]) -> None:
        """A chunk from `leaving_chunk` reached the other node: it is done with here."""
        sent = {id(delivery) for delivery in chunk}
        for packet_id in self.window.remove_sent(sent):
            self.store.delete_inflight(self.subscriber_id, packet_id)
        self.queue.forget_sent(sent)
        for delivery in chunk:
            self.queue.forget(delivery)

    def make_volatile(self) -> None:
        """The session will end with its connection (expiry 0 now): what the store holds
        for it comes back into memory, and the store forgets it (the caller deletes it)."""
        self.queue.extend(self.stored_backlog())  # reads back what was in flight too
        for delivery, _ in self.window.entries.values():
            delivery.seq = -1
        for delivery in self.queue:
            delivery.seq = -1

    def take_back(self) -> list[Delivery]:
        """What this session was given and the client did not acknowledge, oldest first:
        PUBLISHes awaiting PUBACK/PUBREC, deliveries waiting for on_deliver, the queue.
        They leave the session (a MultiSession hands them on)."""
        unacked = self.window.unacknowledged()
        if self.deferred:
            unacked.extend(d for d, packet_id in self.deferred if packet_id is None)
            self.deferred.clear()
        unacked.extend(self.queue)
        self.window.entries.clear()
        self.queue.clear()
        return unacked
