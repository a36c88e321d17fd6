"""At least once between nodes, the bookkeeping alone (sans I/O; broker/cluster/forwarding.py
does the sending, the storing and the acknowledging).

A QoS 1/2 message forwarded to another node gets a sequence number in the sending node's
stream to that node. The sender keeps it (`Outbox`) until the receiver says it has queued
every message up to some number (a cumulative acknowledgement), and sends again what is
not acknowledged whenever the link comes back. The receiver remembers what it queued
(`Inbox`), so that what comes again is dropped, not queued twice.

A stream is named by its epoch: the sender's store's (kept across its restarts, so that
what it kept is resent under the numbers it had), or its run's when it keeps nothing. A
new epoch starts the numbering again, and the receiver forgets the old one's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Numbers above the highest contiguous one that an Inbox remembers. Gaps come only from
# frames that waited in a link's buffer across a reconnect, arriving after those sent
# again, so they are short; past this the oldest gap is given up (what fills it later is
# taken for a duplicate).
WINDOW = 4096


class Outbox:
    """The sending side of one stream: the messages sent and not acknowledged, oldest
    first, each as its frame, within `limit` bytes."""

    def __init__(self, epoch: str, limit: int, acked: int = 0) -> None:
        self.epoch = epoch
        self.limit = limit
        self.acked = acked  # every number up to here is acknowledged
        self.last = acked  # the last number given
        self.sent = acked  # the last number handed to the current link
        self.bytes = 0
        self._unacked: dict[int, bytes] = {}  # insertion order is number order

    def __len__(self) -> int:
        return len(self._unacked)

    def add(self, frame_of: Any) -> tuple[int, bytes] | None:
        """Number a message and keep its frame (`frame_of(seq)` builds it); None when it
        does not fit in `limit` (it is dropped: the caller counts it)."""
        seq = self.last + 1
        frame: bytes = frame_of(seq)
        if self.bytes + len(frame) > self.limit:
            return None
        self.last = seq
        self._unacked[seq] = frame
        self.bytes += len(frame)
        return seq, frame

    def restore(self, seq: int, frame: bytes) -> None:
        """A message kept by an earlier run (numbers in increasing order, above `acked`)."""
        self._unacked[seq] = frame
        self.bytes += len(frame)
        self.last = max(self.last, seq)

    def ack(self, upto: int) -> list[int]:
        """The receiver queued everything up to `upto`: the numbers released."""
        upto = min(upto, self.last)
        if upto <= self.acked:
            return []
        released = []
        unacked = self._unacked
        for seq in range(self.acked + 1, upto + 1):  # (numbers are contiguous)
            frame = unacked.pop(seq, None)
            if frame is not None:
                self.bytes -= len(frame)
                released.append(seq)
        self.acked = upto
        self.sent = max(self.sent, upto)
        return released

    def give_up(self) -> list[tuple[int, bytes]]:
        """Release every message as if acknowledged (their receiver is gone: another node
        took its sessions); the numbering goes on (STREAM tells the receiver where)."""
        released = list(self._unacked.items())
        self._unacked.clear()
        self.bytes = 0
        self.acked = self.sent = self.last
        return released

    def relinked(self) -> None:
        """A new link: everything not acknowledged goes out again."""
        self.sent = self.acked

    def unsent(self) -> Iterator[tuple[int, bytes]]:
        """What the current link has not taken yet, in order (`mark_sent` each one it
        takes; stop at the first it refuses)."""
        unacked = self._unacked
        for seq in range(self.sent + 1, self.last + 1):
            frame = unacked.get(seq)
            if frame is not None:
                yield seq, frame

    def mark_sent(self, seq: int) -> None:
        self.sent = seq

    @property
    def caught_up(self) -> bool:
        """The link has taken every message (a new one may go straight to it)."""
        return self.sent >= self.last


class Inbox:
    """The receiving side of one origin's stream: which numbers were queued already."""

    def __init__(self, epoch: str = "", high: int = 0, window: set[int] | None = None) -> None:
        self.epoch = epoch
        self.high = high  # every number up to here was queued
        self.window = window if window is not None else set()  # queued, above `high`

    def stream(self, epoch: str, settled: int) -> None:
        """The origin's frames are numbered in `epoch` from now on, and it waits for no
        number up to `settled` (acknowledged, or given up). Another epoch than the one
        remembered starts from nothing (the origin lost what it kept)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.high = 0
            self.window = set()
        if settled > self.high:
            self.high = settled
            self.window = {seq for seq in self.window if seq > settled}
            while self.high + 1 in self.window:
                self.high += 1
                self.window.discard(self.high)

    def fresh(self, seq: int) -> bool:
        """Whether `seq` was never queued (False: a duplicate, to drop)."""
        return seq > self.high and seq not in self.window

    def queued(self, seq: int) -> None:
        """`seq` is in its subscribers' queues now."""
        if seq != self.high + 1:
            self.window.add(seq)
            if len(self.window) > WINDOW:  # give up the oldest gap
                self.high = min(self.window) - 1
            else:
                return
        else:
            self.high = seq
        window = self.window
        while self.high + 1 in window:
            self.high += 1
            window.discard(self.high)

    def state(self) -> list[Any]:
        """What is stored, to be `Inbox.of(state)` after a restart."""
        return [self.epoch, self.high, sorted(self.window)]

    @classmethod
    def of(cls, state: list[Any]) -> Inbox:
        epoch, high, window = state
        return cls(epoch, high, set(window))
