"""A session's queue: the messages routed to it and not yet sent, in memory and, for a
durable session, in the store too.

The queue is bounded (`limit`: max_online_messages while connected, max_offline_messages
while not; -1: none). When it is full, messages whose MQTT 5 expiry passed go first; if
it is still full a fifo queue drops the new message, a lifo queue the oldest. A durable
session's messages are written to the store as they arrive, each under its sequence
number (Delivery.seq); while offline, or behind a backlog only the store holds
(`on_disk`), they are in the store alone and read back a chunk at a time as the queue
drains, so a queue of millions neither fills memory nor blocks the loop.

The queue does no delivering: the session (broker/session.py) takes messages from
`memory`, and tells the queue what the in-flight window holds (`skip`: their sequence
numbers, which reading the store steps over).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from broker.message import Delivery

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.metrics import Metrics
    from broker.store import MessageStore, StoredEntry
    from broker.subscription_trie import SharedGroup


# An empty queue in memory, shared: most sessions never queue anything, and a deque of
# their own would cost 600 bytes each (an empty deque allocates its first block), a
# seventh of an idle connection's memory. A session's own deque is made on first use.
NOTHING_QUEUED: tuple[()] = ()


class DropListener(Protocol):
    """Who is told of a message the queue lets go, and why (the session: on_message_drop)."""

    def message_dropped(self, delivery: Delivery, reason: str) -> None: ...


class SessionQueue:
    __slots__ = (
        "_next_seq",
        "_purge_due",
        "_read_after",
        "clock",
        "dropped",
        "durable",
        "find_group",
        "lifo",
        "memory",
        "metrics",
        "on_disk",
        "store",
        "subscriber_id",
    )

    def __init__(
        self,
        subscriber_id: str,
        store: MessageStore,
        metrics: Metrics,
        clock: Clock,
        dropped: DropListener,
        lifo: bool = False,
        find_group: Callable[[str], SharedGroup | None] = lambda share: None,
    ) -> None:
        self.subscriber_id = subscriber_id
        self.store = store
        self.metrics = metrics
        self.clock = clock
        # Told of a message dropped (the object, not a bound method: one object less).
        self.dropped = dropped
        self.lifo = lifo  # newest first, and a full queue drops the oldest
        self.find_group = find_group  # `$share/...` -> its group, for entries read back
        self.durable = False  # the store keeps these messages (set by the session)
        self.memory: deque[Delivery] | tuple[()] = NOTHING_QUEUED
        self.on_disk = 0  # entries only in the store (not in memory, not in flight)
        self._next_seq = 0
        self._read_after = -1  # the stored queue was read up to here (fifo)
        self._purge_due = 0.0  # when a queued message may first have expired

    def __len__(self) -> int:
        """The messages in memory."""
        return len(self.memory)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(self.memory)

    def clear(self) -> None:
        """Forget what is in memory (the store keeps its copies)."""
        self.memory = NOTHING_QUEUED

    def _deque(self) -> deque[Delivery]:
        """The queue in memory, to add to: made on first use."""
        memory = self.memory
        if type(memory) is tuple:
            memory = self.memory = deque()
        return memory  # type: ignore[return-value]  # a deque once not the empty tuple

    def extend(self, deliveries: list[Delivery]) -> None:
        """Queue these deliveries in memory, after what is there (none is stored anew)."""
        if deliveries:
            self._deque().extend(deliveries)

    # -- the store's copies ---------------------------------------------------------------

    def keep(self, delivery: Delivery) -> None:
        """Write a delivery to the store under the next sequence number."""
        seq = self._next_seq
        self._next_seq = seq + 1
        delivery.seq = seq
        self.store.put_entry(self.subscriber_id, seq, delivery)

    def forget(self, delivery: Delivery) -> None:
        """The delivery is done with (acknowledged, sent at QoS 0, or dropped)."""
        if delivery.seq >= 0:
            self.store.delete_entry(self.subscriber_id, delivery.seq)
            delivery.seq = -1

    def restore(self, queued: int, next_seq: int) -> None:
        """What a previous run stored: `queued` entries, the next sequence number."""
        self.on_disk = queued
        self._next_seq = next_seq

    def rejoined(self, entry: StoredEntry) -> Delivery:
        """A delivery read back from the store, with its sequence number and the shared
        group it came through (so that it can go to another member if the session ends)."""
        delivery = entry.delivery
        assert delivery is not None
        delivery.seq = entry.seq
        if entry.share is not None:
            delivery.group = self.find_group(entry.share)
        return delivery

    def read_chunk(self, step: int, skip: list[int]) -> None:
        """Move the next `step` entries of the stored backlog into memory (empty now)."""
        store = self.store
        if self.lifo:
            entries = store.read_entries(self.subscriber_id, step, skip, newest_first=True)
        else:
            # Everything up to the last entry read is in flight (skipped) or done with.
            entries = store.read_entries(self.subscriber_id, step, skip, after=self._read_after)
            if entries:
                self._read_after = entries[-1].seq
        if len(entries) < step:
            self.on_disk = 0  # that was all of it
        else:
            self.on_disk = max(self.on_disk - len(entries), 1)
        memory = self._deque()
        for entry in reversed(entries) if self.lifo else entries:
            if entry.delivery is None:  # a record that no longer decodes: logged by the store
                store.delete_entry(self.subscriber_id, entry.seq)
                self.metrics.queue_message_drop += 1
                continue
            memory.append(self.rejoined(entry))

    def stored(self, skip: list[int]) -> list[Delivery]:
        """Everything only the store holds, read back at once; it is no longer counted
        as on disk (the caller queues it, or lets it go)."""
        if not self.on_disk:
            return []
        entries = self.store.read_entries(self.subscriber_id, self.on_disk + len(skip) + 1, skip)
        self.on_disk = 0
        return [self.rejoined(entry) for entry in entries if entry.delivery is not None]

    # -- leaving for another node (broker/cluster) ----------------------------------------

    def leaving_chunk(self, count: int) -> list[Delivery]:
        """The next `count` queued messages, oldest first: from memory, then from the
        store (read a chunk at a time). They stay until `forget_sent`."""
        memory = self.memory
        if memory:
            return [memory[i] for i in range(min(count, len(memory)))]
        if not self.on_disk:
            return []
        entries = self.store.read_entries(self.subscriber_id, count, after=self._read_after)
        if entries:
            self._read_after = entries[-1].seq
        if len(entries) < count:
            self.on_disk = 0  # that was all of it
        return [self.rejoined(entry) for entry in entries if entry.delivery is not None]

    def forget_sent(self, sent: set[int]) -> None:
        """The deliveries whose id() is in `sent` reached another node: out of memory."""
        memory = self.memory
        while memory and id(memory[0]) in sent:
            self._deque().popleft()

    # -- a message arrives ----------------------------------------------------------------

    def put(self, delivery: Delivery, limit: int) -> bool:
        """Queue a delivery in memory (and in the store if durable) up to `limit`; False
        when the queue was full and a message was dropped."""
        expires_at = delivery.message.expires_at
        if expires_at is not None and expires_at < self._purge_due:
            self._purge_due = expires_at
        if 0 <= limit <= len(self.memory) and self._purge_due <= self.clock.time():
            self._drop_expired()
        memory = self._deque()
        if 0 <= limit <= len(memory):
            self.metrics.queue_message_drop += 1
            if not self.lifo or not memory:
                self.dropped.message_dropped(delivery, "queue_full")
                return False  # fifo: tail drop, the new message is lost
            oldest = memory.popleft()  # lifo: the oldest goes
            self.forget(oldest)
            self.dropped.message_dropped(oldest, "queue_full")
            memory.append(delivery)
            if self.durable:
                self.keep(delivery)
            self.metrics.queue_message_in += 1
            return False
        memory.append(delivery)
        if self.durable:
            self.keep(delivery)
        self.metrics.queue_message_in += 1
        return True

    def put_stored(self, delivery: Delivery, limit: int, skip: Callable[[], list[int]]) -> None:
        """Queue a delivery in the store only (offline, or behind a stored backlog), up to
        `limit`: then fifo drops the new message, lifo the oldest."""
        expires_at = delivery.message.expires_at
        if expires_at is not None and expires_at < self._purge_due:
            self._purge_due = expires_at
        if 0 <= limit <= self.on_disk + len(self.memory) and self._purge_due <= self.clock.time():
            self._drop_expired()
            self._drop_stored_expired(skip())
        if 0 <= limit <= self.on_disk + len(self.memory):
            self.metrics.queue_message_drop += 1
            oldest = self.store.read_entries(self.subscriber_id, 1, skip()) if self.lifo else []
            if not oldest or oldest[0].delivery is None:
                return self.dropped.message_dropped(delivery, "queue_full")
            self.store.delete_entry(self.subscriber_id, oldest[0].seq)
            self.dropped.message_dropped(oldest[0].delivery, "queue_full")
        else:
            self.on_disk += 1
        self.keep(delivery)
        self.metrics.queue_message_in += 1

    def _drop_expired(self) -> None:
        """A full queue first lets go of the messages whose expiry passed [MQTT-3.3.2-5],
        so that they do not push out live ones. Scans only once something may have expired
        (`_purge_due`: the earliest expiry time among the queued messages)."""
        now = self.clock.time()
        queued = list(self.memory)
        memory = self.memory = deque()
        self._purge_due = math.inf
        for delivery in queued:
            expires_at = delivery.message.expires_at
            if expires_at is not None and expires_at <= now:
                self.metrics.queue_message_expired += 1
                self.forget(delivery)
                self.dropped.message_dropped(delivery, "expired")
                continue
            if expires_at is not None and expires_at < self._purge_due:
                self._purge_due = expires_at
            memory.append(delivery)

    def _drop_stored_expired(self, skip: list[int]) -> None:
        """_drop_expired for the stored backlog: one pass over it, only when the queue is
        full and something in it may have expired."""
        now = self.clock.time()
        for delivery in self.stored(skip):
            self.on_disk += 1
            expires_at = delivery.message.expires_at
            if expires_at is not None and expires_at <= now:
                self.on_disk -= 1
                self.metrics.queue_message_expired += 1
                self.forget(delivery)
                self.dropped.message_dropped(delivery, "expired")
            elif expires_at is not None and expires_at < self._purge_due:
                self._purge_due = expires_at
