"""Message stores: where retained messages and persistent sessions outlive the process.

`open_store(settings, loop)` returns the backend named by `[store] backend`:
- "memory": nothing is written; a restart starts empty.
- "leveldb": retained messages, persistent sessions (their subscriptions and expiry), the
  QoS 1/2 messages queued for them (online or offline) and what is in flight are kept in
  LevelDB under `[store] path` (docs/storage.md).
"""

from __future__ import annotations

import asyncio

from broker import optional
from broker.config import StoreSettings
from broker.store.base import MessageStore, SessionRecord, StoredEntry, StoreError
from broker.store.memory import MemoryStore


def open_store(settings: StoreSettings, loop: asyncio.AbstractEventLoop) -> MessageStore:
    """The configured store; StoreError (one line) when it cannot be opened, also when
    the library it needs cannot be imported (the broker does not start without it)."""
    if settings.backend == "memory":
        return MemoryStore()
    try:
        optional.load("broker.store.leveldb", "[store] backend = leveldb cannot open")
    except optional.MissingLibrary as exc:
        raise StoreError(str(exc)) from None
    from broker.store.leveldb import LevelDBStore

    return LevelDBStore(settings.path, loop, sync=settings.sync)


__all__ = [
    "MemoryStore",
    "MessageStore",
    "SessionRecord",
    "StoreError",
    "StoredEntry",
    "open_store",
]
