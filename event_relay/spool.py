"""The relay's spool: events on disk in LevelDB (plyvel), so they survive a restart and the
sequence goes on from where it was.

LevelDB against an append-only segment file, measured (bench/relay_choices.py, figures in
docs/event-relay.md): the file appends about 3 times faster without fsync and 1.2 times
with it, but LevelDB's rate (1.5M events/s, 260k with fsync per batch) is several times
the relay's, and it gives ordered reads from any sequence number, crash-safe batches (no
torn tail to repair) and trimming, without an index of our own.

Keys: b"e" + the sequence number (8 bytes, big-endian: key order is sequence order) ->
the type code (1 byte) + the encoded event; b"m/epoch" -> this spool's epoch (a random id
made when it was created: a consumer that sees another epoch knows the sequence numbers
started again); b"m/floor" -> the first sequence number after events that were lost when
the disk was full; b"c/" + consumer name -> the position it committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Container, Iterable
from pathlib import Path

import plyvel

log = logging.getLogger("nautilus.event_relay")

EVENT = b"e"
EPOCH = b"m/epoch"
FLOOR = b"m/floor"  # events below it were lost (a full disk): never served
COMMITTED = b"c/"
STALE_PER_WRITE = 10_000  # events below the floor deleted per write


class SpoolError(Exception):
    """The spool cannot be opened (locked by another broker, or not a spool)."""


def _key(seq: int) -> bytes:
    return EVENT + seq.to_bytes(8, "big")


class Spool:
    def __init__(self, path: str, max_events: int) -> None:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"event spool {path}: cannot create it: {exc.strerror}") from None
        try:
            self.db = plyvel.DB(path, create_if_missing=True)
        except plyvel.IOError as exc:
            raise SpoolError(f"event spool {path}: cannot open it: {exc}") from None
        except plyvel.Error as exc:
            raise SpoolError(f"event spool {path}: not a usable LevelDB: {exc}") from None
        self.path = path
        self.max_events = max_events
        epoch = self.db.get(EPOCH)
        if epoch is None:
            epoch = uuid.uuid4().hex.encode()
            self.db.put(EPOCH, epoch, sync=True)
        self.epoch = epoch.decode()
        first = last = None
        with self.db.iterator(prefix=EVENT, include_value=False) as keys:
            for key in keys:
                first = int.from_bytes(key[1:], "big")
                break
        with self.db.iterator(prefix=EVENT, include_value=False, reverse=True) as keys:
            for key in keys:
                last = int.from_bytes(key[1:], "big")
                break
        stored_floor = self.db.get(FLOOR)
        floor = 0 if stored_floor is None else int(stored_floor)
        self.next_seq = max(floor, 1 if last is None else last + 1)
        self.first_seq = max(floor, self.next_seq if first is None else first)
        self._stale = (first, floor) if first is not None and first < floor else None
        self._floor: int | None = None  # a floor to write with the next batch
        self.failed = False
        self.written = 0  # events written since start

    def write(self, events: Iterable[tuple[int, int, bytes]], sync: bool = False) -> bool:
        """Write (seq, code, event) triples as one batch, dropping the oldest events past
        `max_events`. False when the disk refused (logged once until it works again)."""
        batch = self.db.write_batch(sync=sync)
        last = None
        count = 0
        for seq, code, data in events:
            batch.put(_key(seq), bytes((code,)) + data)
            last = seq
            count += 1
        if last is None and self._floor is None and self._stale is None:
            return True  # nothing to write (a floor raised since is written with it)
        next_seq = self.next_seq if last is None else last + 1
        first = max(self.first_seq, next_seq - self.max_events)
        for seq in range(self.first_seq, first):
            batch.delete(_key(seq))
        if self._floor is not None:
            batch.put(FLOOR, str(self._floor).encode())
        stale = self._stale
        if stale is not None:  # below the floor: unreachable, deleted a chunk at a time
            upto = min(stale[1], stale[0] + STALE_PER_WRITE)
            for seq in range(stale[0], upto):
                batch.delete(_key(seq))
        try:
            batch.write()
        except (plyvel.IOError, plyvel.Error) as exc:
            if not self.failed:
                log.error("event spool write failed: %s", exc)
            self.failed = True
            return False
        if self.failed:
            log.warning("event spool writes work again")
        self.failed = False
        self.first_seq = first
        self.next_seq = next_seq
        self.written += count
        self._floor = None
        if stale is not None:
            self._stale = (upto, stale[1]) if upto < stale[1] else None
        return True

    def raise_floor(self, seq: int) -> None:
        """Serve nothing below `seq`: events lost to a full disk, or let go of once the
        consumers that trim have committed them. What is on disk below it goes a chunk
        per write."""
        if seq <= self.first_seq:
            return
        self._stale = (self.first_seq, seq) if self._stale is None else (self._stale[0], seq)
        self.first_seq = seq
        self._floor = seq

    def read(
        self,
        start: int,
        stop: int,
        limit: int,
        codes: Container[int] | None = None,
        max_bytes: int = 1 << 62,
    ) -> tuple[list[bytes], int]:
        """Up to `limit` events (and about `max_bytes`: at least one) from `start` to
        `stop` (exclusive), only of the types in `codes` when given; returns (events,
        the position to read from next)."""
        out: list[bytes] = []
        size = 0
        with self.db.iterator(start=_key(start), stop=_key(stop)) as items:
            for key, value in items:
                seq = int.from_bytes(key[1:], "big")
                if codes is None or value[0] in codes:
                    if out and size + len(value) - 1 > max_bytes:
                        return out, seq
                    out.append(value[1:])
                    size += len(value) - 1
                    if len(out) >= limit:
                        return out, seq + 1
        return out, stop

    def committed(self, name: str) -> int | None:
        value = self.db.get(COMMITTED + name.encode())
        return None if value is None else int(value)

    def commit(self, name: str, seq: int, sync: bool = False) -> None:
        self.db.put(COMMITTED + name.encode(), str(seq).encode(), sync=sync)

    def close(self) -> None:
        self.db.close()
