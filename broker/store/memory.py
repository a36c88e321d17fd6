"""Memory-only mode: the broker's own data structures are the only copy."""

from __future__ import annotations

from broker.store.base import MessageStore


class MemoryStore(MessageStore):
    persistent = False
