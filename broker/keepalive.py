"""The keepalive watch of every connection: one timer for the broker, not one per client.

A timer of the event loop per connection costs about 600 bytes (uvloop's handle, its
libuv timer and the callback), most of what an idle connection would cost beside its
socket. Here the connections due in the same second share one set (a bucket, by the
second their keepalive runs out), and the loop has one timer, for the earliest bucket.
When a bucket is due, each of its connections checks the time its client last sent
something (`keepalive_due`), and either closes or is watched again for the time left:
nothing is done per packet. A silent client is closed at most a second after its 1.5
keepalive periods [MQTT-3.1.2-22].
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.clock import Clock, Timer


class Watched(Protocol):
    """A connection whose client must send something every keepalive period."""

    def keepalive_due(self) -> None:
        """Its time is up: close it, or watch it again for the time left."""


Bucket = set[Watched]  # the connections due in one second


class KeepaliveWatch:
    __slots__ = ("_buckets", "_clock", "_due", "_ticking", "_timer")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._buckets: dict[int, Bucket] = {}  # second -> the connections due then
        self._timer: Timer | None = None
        self._due = 0  # the second the timer is set for
        self._ticking = False  # due buckets are being handled (the timer is set after)

    def watch(self, watched: Watched, deadline: float) -> Bucket:
        """Call `watched.keepalive_due()` once the loop's time is past `deadline` (within
        the second after it). Returns the bucket, which `forget` takes."""
        second = math.ceil(deadline)
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = set()
            if not self._ticking and (self._timer is None or second < self._due):
                self._set_timer(second)
        bucket.add(watched)
        return bucket

    @staticmethod
    def forget(watched: Watched, bucket: Bucket) -> None:
        """Stop watching (the connection is gone)."""
        bucket.discard(watched)

    def _set_timer(self, second: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._due = second
        self._timer = self._clock.call_later(second - self._clock.time(), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._ticking = True
        now = self._clock.time()
        buckets = self._buckets
        try:
            for second in sorted(second for second in buckets if second <= now):
                for watched in buckets.pop(second):  # watched again: in a later bucket
                    watched.keepalive_due()
        finally:
            self._ticking = False
            if buckets:
                self._set_timer(min(buckets))
