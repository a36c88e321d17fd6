"""The MessageStore interface shared by the backends.

A persistent session's queue lives in the store as entries numbered by a per-session
sequence (`seq`), oldest first. An entry is written when a QoS 1/2 message is queued for
the session (or sent to it at once), and deleted when the client acknowledged it (PUBACK,
or PUBREC for QoS 2), when it was dropped, or when the session ended. Which entries are in
flight is kept apart (`put_inflight`): packet id -> (seq, state), so that a session resumed
after a restart resends them with their packet ids. Inbound QoS 2 packet ids awaiting
PUBREL are kept too, so that a resent PUBLISH is not routed twice across a restart.

Writes are buffered and committed together once per event-loop turn (group commit), and
`commit()` runs before any connection writes to its socket, so a PUBACK never leaves before
what it acknowledges is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from broker.message import Delivery, Message
from broker.subscription_trie import SubOptions


class StoreError(Exception):
    """The store cannot be opened or written (the message says why, in one line)."""


@dataclass(slots=True)
class SessionRecord:
    """What a persistent session needs to come back after a restart (its queue stays in
    the store until the client connects)."""

    client_id: str
    expiry: int | None  # seconds after going offline; None: never
    offline_since: float  # wall-clock time the session went offline; 0: it was online
    subscriptions: dict[str, SubOptions] = field(default_factory=dict)
    queued: int = 0  # entries in its queue, in flight included
    next_seq: int = 0  # the sequence number its next entry gets


@dataclass(slots=True)
class StoredEntry:
    """One entry of a session's queue read back from the store."""

    seq: int
    delivery: Delivery | None  # None: the message expired, or its body is missing
    share: str | None  # the `$share/<group>/<filter>` it came through, if any


Kind = Literal["counter", "gauge"]


class MessageStore:
    """The interface; this base keeps nothing (the memory backend)."""

    persistent = False  # False: nothing is kept, callers may skip building records
    failed = False  # the last commit failed: nothing may be acknowledged until one works

    def commit(self) -> None:
        """Write what this loop turn buffered (called before any socket write)."""

    def close(self) -> None: ...

    def figures(self) -> dict[str, tuple[int, Kind]]:
        """For /metrics: name -> (value, "counter" or "gauge"); none without a disk."""
        return {}

    # -- retained ----------------------------------------------------------------------

    def put_retained(self, message: Message) -> None: ...

    def delete_retained(self, topic: str) -> None: ...

    def load_retained(self) -> Iterable[Message]:
        """The retained messages, expired ones left out (and deleted)."""
        return ()

    # -- sessions ----------------------------------------------------------------------

    def put_session(self, record: SessionRecord) -> None:
        """Store a session's metadata (subscriptions, expiry); its queue is kept apart."""

    def delete_session(self, client_id: str) -> None:
        """Forget the session and everything kept for it."""

    def load_sessions(self) -> Iterable[SessionRecord]:
        """Every stored session with its queue's counters, without reading the queue."""
        return ()

    # -- queues ------------------------------------------------------------------------

    def put_entry(self, client_id: str, seq: int, delivery: Delivery) -> None:
        """Keep one delivery queued for the session under `seq` (larger than any before)."""

    def delete_entry(self, client_id: str, seq: int) -> None: ...

    def read_entries(
        self,
        client_id: str,
        count: int,
        skip: Iterable[int] = (),
        newest_first: bool = False,
        after: int = -1,
    ) -> list[StoredEntry]:
        """Up to `count` entries from the head of the queue (or its tail), leaving out
        the sequence numbers in `skip` (entries in flight); from the head, only those
        after sequence number `after` (a reader that went through the queue up to there
        does not wade through what was deleted behind it)."""
        return []

    def get_entry(self, client_id: str, seq: int) -> StoredEntry | None:
        return None

    def put_inflight(self, client_id: str, packet_id: int, seq: int, state: int) -> None:
        """The entry `seq` went out with `packet_id` (state: session.AWAITING_ACK or
        AWAITING_COMP; an entry awaiting PUBCOMP needs no body any more)."""

    def put_inflight_entry(self, client_id: str, packet_id: int, delivery: Delivery) -> None:
        """A delivery sent at once, never queued: one in-flight record carries it (state
        AWAITING_ACK), with no queue entry of its own."""

    def delete_inflight(self, client_id: str, packet_id: int) -> None: ...

    def load_inflight(self, client_id: str) -> list[tuple[int, int, int, StoredEntry | None]]:
        """(packet id, seq, state, the entry itself if the record carries it) of the
        session's messages in flight."""
        return []

    def put_received(self, client_id: str, packet_id: int) -> None:
        """An inbound QoS 2 PUBLISH was routed and awaits its PUBREL."""

    def delete_received(self, client_id: str, packet_id: int) -> None: ...

    def load_received(self, client_id: str) -> set[int]:
        return set()

    # -- messages between nodes (broker/cluster/forwarding.py) -------------------------

    def put_cluster(self, key: bytes, value: bytes) -> None:
        """Keep a record of the cluster's at-least-once forwarding (written with the
        turn's batch, like the queue entries)."""

    def delete_cluster(self, key: bytes) -> None: ...

    def load_cluster(self, prefix: bytes) -> Iterable[tuple[bytes, bytes]]:
        """The records whose key starts with `prefix` (the prefix left out), in key order."""
        return ()
