"""The ACLs of the connected clients, by (mountpoint, client_id): loaded when a client
connects, read by every PUBLISH and SUBSCRIBE of it, dropped when its session ends
(vmq_diversity's cache), re-read on demand (`invalidate`) or when older than cache_ttl.

An entry remembers which connection loaded it (`session_id`): on a takeover the old
connection's end comes after the new one's CONNECT, and must not drop the new entry
(VerneMQ's issue 996).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from plugins.auth_db.acl import Acls

Key = tuple[str, str]  # (mountpoint, client_id)


@dataclass(slots=True)
class Entry:
    username: str
    row_client_id: str  # the row it came from: the client's own, or "*"
    session_id: str
    acls: Acls
    loaded_at: float  # time.monotonic()


class AclCache:
    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Entry | None:
        return self._entries.get(key)

    def put(self, key: Key, entry: Entry) -> None:
        self._entries[key] = entry

    def drop(self, key: Key, session_id: str) -> None:
        """The connection `session_id` ended: its entry goes, a newer one stays."""
        entry = self._entries.get(key)
        if entry is not None and entry.session_id == session_id:
            del self._entries[key]

    def select(
        self, client_id: str | None = None, username: str | None = None
    ) -> Iterator[tuple[Key, Entry]]:
        """The entries of a client id and/or a username (all when neither is given)."""
        for key, entry in list(self._entries.items()):
            if client_id is not None and key[1] != client_id:
                continue
            if username is not None and entry.username != username:
                continue
            yield key, entry

    def older_than(self, moment: float) -> list[tuple[Key, Entry]]:
        return [(k, e) for k, e in self._entries.items() if e.loaded_at < moment]
