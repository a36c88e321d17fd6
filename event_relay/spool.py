"""The relay's spool: events on disk in LevelDB (plyvel), so they survive a restart and the
sequence goes on from where it was.

LevelDB against an append-only segment file, measured (bench/relay_choices.py, figures in
docs/event-relay.md): the file appends about 3 times faster without fsync and 1.2 times
with it, but LevelDB's rate (1.5M events/s, 260k with fsync per batch) is several times
the relay's, and it gives ordered reads from any sequence number, crash-safe batches (no
torn tail to repair) and trimming, without an index of our own.

Keys: b"e" + the record's (first) sequence number (8 bytes, big-endian: key order is
sequence order) -> the type code (1 byte), for a compact record of several events the
number of its events (4 bytes, big-endian), then the encoded record; b"m/epoch" -> this
spool's epoch (a random id made when it was created: a consumer that sees another epoch
knows the sequence numbers started again); b"m/floor" -> the first sequence number after
events that were lost when the disk was full; b"c/" + consumer name -> the position it
committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Container
from pathlib import Path

import plyvel

from event_relay.schema import DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS

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


def _value(code: int, count: int, data: bytes) -> bytes:
    if code in _COMPACT:
        return bytes((code,)) + count.to_bytes(4, "big") + data
    return bytes((code,)) + data


def _count(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big") if value[0] in _COMPACT else 1


_COMPACT = (DELIVERIES, PUBLISH_DELIVERIES, SESSION_EVENTS)  # records of several events


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
        first = end = None
        with self.db.iterator(prefix=EVENT, include_value=False) as keys:
            for key in keys:
                first = int.from_bytes(key[1:], "big")
                break
        with self.db.iterator(prefix=EVENT, reverse=True) as items:
            for key, value in items:
                end = int.from_bytes(key[1:], "big") + _count(value)
                break
        stored_floor = self.db.get(FLOOR)
        floor = 0 if stored_floor is None else int(stored_floor)
        self.next_seq = max(floor, 1 if end is None else end)
        self.first_seq = max(floor, self.next_seq if first is None else first)
        self._stale = (first, floor) if first is not None and first < floor else None
        self._floor: int | None = None  # a floor to write with the next batch
        self.failed = False
        self.written = 0  # events written since start

    def write(self, records: list[tuple[int, int, int, bytes]], sync: bool = False) -> bool:
        """Write (seq, code, count, record) entries as one batch, dropping the oldest
        records past `max_events`. False when the disk refused (logged once until it works
        again)."""
        batch = self.db.write_batch(sync=sync)
        for seq, code, count, data in records:
            batch.put(_key(seq), _value(code, count, data))
        if not records and self._floor is None and self._stale is None:
            return True  # nothing to write (a floor raised since is written with it)
        next_seq = records[-1][0] + records[-1][2] if records else self.next_seq
        first = max(self.first_seq, next_seq - self.max_events)
        if first > self.first_seq:
            first = self._start_of(first, records)  # the record holding it is kept
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
        self.written += next_seq - (records[0][0] if records else next_seq)
        self._floor = None
        if stale is not None:
            self._stale = (upto, stale[1]) if upto < stale[1] else None
        return True

    def raise_floor(self, seq: int) -> None:
        """Serve nothing below `seq`: events lost to a full disk, or let go of once the
        consumers that trim have committed them. What is on disk below it goes a chunk
        per write."""
        seq = self._start_of(seq, ())
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
        """Up to `limit` records (and about `max_bytes`: at least one) holding the events
        from `start` to `stop` (exclusive), only of the types in `codes` when given;
        returns (records, the position to read from next). As EventLog.read: the first
        record may begin before `start`, the last go past `stop`."""
        if start >= stop:
            return [], start
        out: list[bytes] = []
        size = 0
        position = start
        begin = self._start_of(start, ())
        with self.db.iterator(start=_key(begin), stop=_key(stop)) as items:
            for key, value in items:
                seq = int.from_bytes(key[1:], "big")
                code = value[0]
                if codes is None or code in codes:
                    data = value[5:] if code in _COMPACT else value[1:]
                    if out and size + len(data) > max_bytes:
                        return out, seq
                    out.append(data)
                    size += len(data)
                position = seq + _count(value)
                if len(out) >= limit:
                    return out, position
        return out, max(position, stop)

    def _start_of(self, seq: int, pending: list[tuple[int, int, int, bytes]] | tuple[()]) -> int:
        """The first sequence number of the record holding `seq`, among `pending` (being
        written, in order) or on disk; `seq` itself if no record holds it."""
        if pending and pending[0][0] <= seq:
            for start, _, count, _ in pending:
                if start <= seq < start + count:
                    return start
            return seq
        with self.db.iterator(start=EVENT, stop=_key(seq + 1), reverse=True) as items:
            for key, value in items:
                start = int.from_bytes(key[1:], "big")
                return start if start + _count(value) > seq else seq
        return seq

    def committed(self, name: str) -> int | None:
        value = self.db.get(COMMITTED + name.encode())
        return None if value is None else int(value)

    def commit(self, name: str, seq: int, sync: bool = False) -> None:
        self.db.put(COMMITTED + name.encode(), str(seq).encode(), sync=sync)

    def close(self) -> None:
        self.db.close()
