"""The MessageStore interface shared by the backends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.message import Delivery, Message
from broker.router import SubOptions


@dataclass(slots=True)
class SessionRecord:
    """What a persistent session needs to come back after a restart."""

    client_id: str
    expiry: int | None  # seconds after going offline; None: never
    offline_since: float  # wall-clock time the session went offline
    subscriptions: dict[str, SubOptions] = field(default_factory=dict)
    # (seq, delivery, the `$share/...` filter it came through or None), oldest first
    queue: list[tuple[int, Delivery, str | None]] = field(default_factory=list)


class MessageStore:
    """Writes are buffered and committed once per event-loop turn (group commit)."""

    persistent = True  # False: nothing is kept, callers may skip building records

    def put_retained(self, message: Message) -> None: ...

    def delete_retained(self, topic: str) -> None: ...

    def load_retained(self) -> Iterable[Message]:
        return ()

    def put_session(self, record: SessionRecord) -> None:
        """Store a session's metadata (subscriptions, expiry); its queue is kept apart."""

    def delete_session(self, client_id: str) -> None:
        """Forget the session and every message queued for it."""

    def load_sessions(self) -> Iterable[SessionRecord]:
        return ()

    def enqueue(self, client_id: str, seq: int, delivery: Delivery) -> None:
        """Keep one message queued for an offline session, under its sequence number."""

    def dequeue(self, client_id: str, seq: int) -> None: ...

    def clear_queue(self, client_id: str) -> None:
        """The session is back online: its queue lives in memory again."""

    def close(self) -> None: ...
