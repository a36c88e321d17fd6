"""The auth_on_* result cache (vmq_webhooks_cache): an endpoint that answers ok with
`cache-control: max-age=N` is not asked the same question again for N seconds.

The key is (endpoint, hook, the request body without `payload` and `peer_port`), so a
client reconnecting from another port, or publishing another payload to the same topic,
hits the entry. The value is the modifiers minus any `payload` modifier. As in VerneMQ an
expired entry is removed when it is looked up; unlike VerneMQ the cache is bounded: when
full, the oldest entry goes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

_NOT_IN_KEY = ("payload", "peer_port")


def request_key(url: str, hook: str, body: Mapping[str, Any]) -> str:
    """The cache key of one request (the body as built by payloads.request_body)."""
    args = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
    return json.dumps((url, hook, args), separators=(",", ":"))


class ResultCache:
    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries  # 0: nothing is cached
        self.clock = clock
        self._entries: dict[str, tuple[float, Mapping[str, Any]]] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> tuple[Mapping[str, Any], float] | None:
        """The cached modifiers of a live entry and the seconds it has left, else None."""
        entry = self._entries.get(key)
        if entry is not None:
            left = entry[0] - self.clock()
            if left > 0:
                self.hits += 1
                return entry[1], left
            del self._entries[key]
        self.misses += 1
        return None

    def put(self, key: str, modifiers: Mapping[str, Any], max_age: int) -> None:
        if self.max_entries <= 0 or max_age <= 0:
            return
        entries = self._entries
        entries.pop(key, None)  # re-inserted last: its age restarts
        if len(entries) >= self.max_entries:
            del entries[next(iter(entries))]
            self.evictions += 1
        kept = {k: v for k, v in modifiers.items() if k != "payload"}
        entries[key] = (self.clock() + max_age, kept)
