"""LevelDB backend (plyvel).

Layout, one key space with prefixes (client ids cannot contain U+0000 [MQTT-1.5.4-2], so
\\0 ends an id unambiguously; numbers are big-endian so keys sort in order):

    v                              layout version (b"2")
    r/<topic>                      retained message
    s/<client id>                  session record (JSON: expiry, offline_since, subscriptions)
    n/<client id>                  its queue's counters: entries, next sequence number
    q/<client id>\\0<seq:8>         a queue entry (broker/store/records.py)
    f/<client id>\\0<packet id:2>   an entry in flight: seq:8, state:1 (seq INLINE: the
                                   queue entry follows, it has no q/ key of its own)
    i/<client id>\\0<packet id:2>   an inbound QoS 2 packet id awaiting PUBREL
    b/<body id:8>                  a message body referenced by several queue entries
    c/<body id:8>                  how many entries reference it (4 bytes)

Start-up reads the session records and counters only: a queue is read in chunks when its
client connects. Writes go into one WriteBatch committed once per event-loop turn, before
any connection writes to its socket (`sync = true` makes each commit durable with one
fsync for the whole turn). Queue entries are encoded at commit time, so that a message
queued for several sessions in one turn is stored once (a body and a reference count) and
an entry deleted in the turn it was made is never written.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import plyvel

from broker.message import Delivery, Message
from broker.store import records
from broker.store.base import Kind, MessageStore, SessionRecord, StoredEntry, StoreError

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop

log = logging.getLogger("nautilus.store")

LAYOUT = b"2"
VERSION = b"v"
RETAINED = b"r/"
SESSION = b"s/"
COUNTERS = b"n/"
QUEUE = b"q/"
INFLIGHT = b"f/"
RECEIVED = b"i/"
BODY = b"b/"
REFS = b"c/"
INLINE_ENTRY = b"\xff" * 8  # the seq of an in-flight record that carries its entry
SENT = 0  # its state: session.AWAITING_ACK
BODY_CACHE = 4096  # decoded shared bodies kept, so that sessions reading them share one
WRITE_BUFFER = 64 << 20  # bytes of writes kept in memory before a flush to disk


def _id(client_id: str) -> bytes:
    return client_id.encode() + b"\0"


def _seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def _after(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix`."""
    return prefix + b"\xff" * 9


def open_db(path: str) -> plyvel.DB:
    """Open (or create) the database at `path`, or raise StoreError saying why."""
    try:
        os.makedirs(path, exist_ok=True)
        return plyvel.DB(
            os.path.join(path, "messages"), create_if_missing=True, write_buffer_size=WRITE_BUFFER
        )
    except plyvel.IOError as exc:
        if "lock" in str(exc).lower():
            raise StoreError(
                f"store {path!r} is in use by another process (LevelDB lock held)"
            ) from exc
        raise StoreError(f"store {path!r} cannot be opened: {exc}") from exc
    except plyvel.CorruptionError as exc:
        raise StoreError(
            f"store {path!r} is corrupt ({exc}); `nautilus store check --path {path}` "
            "tells more; nothing was changed"
        ) from exc
    except OSError as exc:
        raise StoreError(f"store {path!r} cannot be opened: {exc.strerror or exc}") from exc


class LevelDBStore(MessageStore):
    persistent = True

    def __init__(self, path: str, clock: AbstractEventLoop, *, sync: bool = True) -> None:
        self.path = path
        self._db = open_db(path)
        self._check_layout()
        self._clock = clock
        self._offset = time.time() - clock.time()
        self._sync = sync
        self._batch: plyvel.WriteBatch | None = None
        self._commit_due = False
        # Queue entries to encode at commit: client id -> seq -> delivery.
        self._pending: dict[str, dict[int, Delivery]] = {}
        # Messages sent in the turn they were routed: in-flight records that carry their
        # entry (one key to write and one to delete, instead of two and two).
        self._flight: dict[bytes, Delivery] = {}
        self._counters: dict[str, list[int]] = {}  # client id -> [entries, next seq]
        self._dirty: set[str] = set()  # client ids whose counters changed this turn
        self._refs: dict[bytes, int] = {}  # entry key -> body id, for entries that refer
        self._body_refs: dict[int, int] = {}  # body id -> references (bodies seen this run)
        self._bodies: dict[int, Message] = {}  # body id -> decoded message (a small cache)
        self._next_body = self._last_body_id() + 1
        self._idents: dict[str, bytes] = {}
        self.failed = False  # the last commit failed (a full disk): connections close
        self.commits = 0  # batches written
        self.write_failures = 0  # batches that could not be written (kept, tried again)

    def _ident(self, client_id: str) -> bytes:
        """The client id as it appears in keys (made once per client)."""
        ident = self._idents.get(client_id)
        if ident is None:
            ident = self._idents[client_id] = _id(client_id)
        return ident

    def _check_layout(self) -> None:
        version = self._db.get(VERSION)
        if version is None:
            if next(self._db.iterator(include_value=False), None) is not None:
                self._db.close()
                raise StoreError(
                    f"store {self.path!r} was written by an older Nautilus (layout 1); "
                    "move it aside to start with an empty store"
                )
            self._db.put(VERSION, LAYOUT, sync=True)
        elif version != LAYOUT:
            self._db.close()
            raise StoreError(f"store {self.path!r} has unknown layout {version!r}")

    def _last_body_id(self) -> int:
        for key in self._db.iterator(prefix=BODY, reverse=True, include_value=False):
            return int.from_bytes(key[len(BODY) :], "big")
        return 0

    def _wall_offset(self) -> float:
        """Wall clock minus loop clock, fixed at start so that expiry times round-trip
        within a run (stored times are wall-clock, so they count on across restarts)."""
        return self._offset

    # -- group commit ------------------------------------------------------------------

    def _writes(self) -> plyvel.WriteBatch:
        batch = self._batch
        if batch is None:
            batch = self._batch = self._db.write_batch(sync=self._sync)
        self._schedule()
        return batch

    def _schedule(self) -> None:
        if not self._commit_due:
            self._commit_due = True
            self._clock.call_soon(self.commit)

    def commit(self) -> None:
        """Write what this turn buffered, as one batch. On failure (a full disk) nothing
        is lost: the batch is kept for the next try and `failed` is set."""
        self._commit_due = True  # what is added below needs no other commit
        if self._pending or self._flight:
            self._encode_pending()
        if self._dirty:
            batch = self._writes()
            for client_id in self._dirty:
                counters = self._counters.get(client_id)
                if counters is not None:
                    batch.put(COUNTERS + client_id.encode(), records.encode_counters(*counters))
            self._dirty.clear()
        self._commit_due = False
        batch = self._batch
        if batch is None:
            return
        try:
            batch.write()
        except (plyvel.IOError, plyvel.Error) as exc:
            self.write_failures += 1
            if not self.failed:
                log.error("store write failed, clients are disconnected until it works: %s", exc)
            self.failed = True
            return
        if self.failed:
            log.warning("store writes work again")
        self.failed = False
        self._batch = None
        self.commits += 1

    def figures(self) -> dict[str, tuple[int, Kind]]:
        return {
            "store_commits": (self.commits, "counter"),
            "store_write_failures": (self.write_failures, "counter"),
            "store_failed": (int(self.failed), "gauge"),
            # Messages queued on disk for persistent sessions.
            "store_queued_messages": (sum(c[0] for c in self._counters.values()), "gauge"),
        }

    def _encode_pending(self) -> None:
        """Encode this turn's queue entries and the in-flight records that carry theirs; a
        message taken by several sessions gets one body and a reference count."""
        pending, self._pending = self._pending, {}
        flight, self._flight = self._flight, {}
        writes: list[tuple[bytes, bytes, Delivery]] = [  # (key, head, delivery)
            (QUEUE + self._ident(client_id) + _seq(seq), b"", delivery)
            for client_id, entries in pending.items()
            for seq, delivery in entries.items()
        ]
        head = INLINE_ENTRY + bytes((SENT,))
        writes += [(key, head, delivery) for key, delivery in flight.items()]
        uses = Counter(id(delivery.message) for _, _, delivery in writes)
        batch = self._writes()
        offset = self._wall_offset()
        bodies: dict[int, int] = {}  # id(message) -> body id
        for key, head, delivery in writes:
            message = delivery.message
            if uses[id(message)] == 1:
                batch.put(key, head + records.encode_entry(delivery, offset))
                continue
            body_id = bodies.get(id(message))
            if body_id is None:
                body_id = bodies[id(message)] = self._next_body
                self._next_body += 1
                batch.put(BODY + _seq(body_id), records.encode_message(message, offset))
                count = uses[id(message)]
                self._body_refs[body_id] = count
                batch.put(REFS + _seq(body_id), count.to_bytes(4, "big"))
            self._refs[key] = body_id
            batch.put(key, head + records.encode_entry(delivery, offset, body_id))

    def close(self) -> None:
        self.commit()
        self._db.close()

    # -- retained ----------------------------------------------------------------------

    def put_retained(self, message: Message) -> None:
        value = records.encode_message(message, self._wall_offset())
        self._writes().put(RETAINED + message.topic.encode(), value)

    def delete_retained(self, topic: str) -> None:
        self._writes().delete(RETAINED + topic.encode())

    def load_retained(self) -> Iterator[Message]:
        offset = self._wall_offset()
        now = self._clock.time()
        for key, value in self._db.iterator(prefix=RETAINED):
            try:
                message = records.decode_message(value, offset)
            except records.RecordError as exc:
                log.error("retained message %r left out: %s", key[len(RETAINED) :], exc)
                continue
            if message.expired(now):
                self._writes().delete(key)
                continue
            yield message

    # -- sessions ----------------------------------------------------------------------

    def put_session(self, record: SessionRecord) -> None:
        self._writes().put(SESSION + record.client_id.encode(), records.encode_session(record))

    def delete_session(self, client_id: str) -> None:
        self.commit()  # so that the iterators below see every entry
        batch = self._writes()
        ident = self._ident(client_id)
        del self._idents[client_id]
        for key, value in self._db.iterator(prefix=QUEUE + ident):
            try:
                body_id = records.Entry(value).body_id
            except records.RecordError:
                body_id = None
            self._refs.pop(key, None)
            if body_id is not None:
                self._unref(body_id)
            batch.delete(key)
        for key, value in self._db.iterator(prefix=INFLIGHT + ident):
            if value[:8] == INLINE_ENTRY and key not in self._refs:
                try:
                    body_id = records.Entry(value[9:]).body_id
                except records.RecordError:
                    body_id = None
                if body_id is not None:
                    self._refs[key] = body_id
            self._forget_ref(key)
            batch.delete(key)
        for key in self._db.iterator(prefix=RECEIVED + ident, include_value=False):
            batch.delete(key)
        batch.delete(SESSION + client_id.encode())
        batch.delete(COUNTERS + client_id.encode())
        self._counters.pop(client_id, None)
        self._dirty.discard(client_id)

    def load_sessions(self) -> Iterator[SessionRecord]:
        self.commit()
        for key, value in self._db.iterator(prefix=SESSION):
            client_id = key[len(SESSION) :].decode()
            try:
                record = records.decode_session(client_id, value)
                counters = self._db.get(COUNTERS + client_id.encode())
                if counters is not None:
                    record.queued, record.next_seq = records.decode_counters(counters)
            except records.RecordError as exc:
                log.error("session %r left out: %s", client_id, exc)
                continue
            self._counters[client_id] = [record.queued, record.next_seq]
            yield record

    # -- queues ------------------------------------------------------------------------

    def _count(self, client_id: str, change: int, seq: int = -1) -> None:
        counters = self._counters.get(client_id)
        if counters is None:
            counters = self._counters[client_id] = [0, 0]
        counters[0] += change
        if seq >= counters[1]:
            counters[1] = seq + 1
        self._dirty.add(client_id)
        self._schedule()

    def put_entry(self, client_id: str, seq: int, delivery: Delivery) -> None:
        entries = self._pending.get(client_id)
        if entries is None:
            entries = self._pending[client_id] = {}
        entries[seq] = delivery
        self._count(client_id, 1, seq)

    def delete_entry(self, client_id: str, seq: int) -> None:
        entries = self._pending.get(client_id)
        if entries is not None and entries.pop(seq, None) is not None:
            self._count(client_id, -1)  # never written
            return
        key = QUEUE + self._ident(client_id) + _seq(seq)
        self._writes().delete(key)
        body_id = self._refs.pop(key, None)
        if body_id is not None:
            self._unref(body_id)
        self._count(client_id, -1)

    def _unref(self, body_id: int) -> None:
        """One reference less to a shared body; the body goes with the last one."""
        count = self._body_refs.get(body_id)
        if count is None:  # a body from an earlier run: its count is in the store
            stored = self._db.get(REFS + _seq(body_id))
            count = int.from_bytes(stored, "big") if stored else 1
        batch = self._writes()
        if count <= 1:
            self._body_refs.pop(body_id, None)
            self._bodies.pop(body_id, None)
            batch.delete(BODY + _seq(body_id))
            batch.delete(REFS + _seq(body_id))
        else:
            self._body_refs[body_id] = count - 1
            batch.put(REFS + _seq(body_id), (count - 1).to_bytes(4, "big"))

    def read_entries(
        self,
        client_id: str,
        count: int,
        skip: Iterable[int] = (),
        newest_first: bool = False,
        after: int = -1,
    ) -> list[StoredEntry]:
        self.commit()
        skipped = set(skip)
        prefix = QUEUE + self._ident(client_id)
        offset = self._wall_offset()
        found: list[StoredEntry] = []
        if after >= 0 and not newest_first:
            # A seek past the deleted head: LevelDB would otherwise step over every
            # tombstone of it (until a compaction), at each read of a draining queue.
            entries = self._db.iterator(start=prefix + _seq(after + 1), stop=_after(prefix))
        else:
            entries = self._db.iterator(prefix=prefix, reverse=newest_first)
        for key, value in entries:
            seq = int.from_bytes(key[len(prefix) :], "big")
            if seq in skipped:
                continue
            found.append(self._entry(key, seq, value, offset))
            if len(found) >= count:
                break
        return found

    def get_entry(self, client_id: str, seq: int) -> StoredEntry | None:
        self.commit()
        key = QUEUE + self._ident(client_id) + _seq(seq)
        value = self._db.get(key)
        return None if value is None else self._entry(key, seq, value, self._wall_offset())

    def _entry(self, key: bytes, seq: int, value: bytes, offset: float) -> StoredEntry:
        try:
            entry = records.Entry(value)
            if entry.body_id is None:
                message = records.decode_message(entry.rest, offset)
            else:
                self._refs[key] = entry.body_id
                found = self._body(entry.body_id, offset)
                if found is None:
                    return StoredEntry(seq, None, entry.share)
                message = found
            return StoredEntry(seq, entry.delivery(message), entry.share)
        except records.RecordError as exc:
            log.error("queue entry %r left out: %s", key, exc)
            return StoredEntry(seq, None, None)

    def _body(self, body_id: int, offset: float) -> Message | None:
        message = self._bodies.get(body_id)
        if message is None:
            data = self._db.get(BODY + _seq(body_id))
            if data is None:
                log.error("message body %d is missing from the store", body_id)
                return None
            message = records.decode_message(data, offset)
            if len(self._bodies) >= BODY_CACHE:
                self._bodies.clear()
            self._bodies[body_id] = message
        return message

    # -- in flight, and inbound QoS 2 ----------------------------------------------------

    def put_inflight(self, client_id: str, packet_id: int, seq: int, state: int) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        if self._flight.pop(key, None) is None:
            self._forget_ref(key)  # a record that carried a shared body no longer does
        self._writes().put(key, _seq(seq) + bytes((state,)))

    def put_inflight_entry(self, client_id: str, packet_id: int, delivery: Delivery) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        self._flight[key] = delivery
        self._schedule()

    def delete_inflight(self, client_id: str, packet_id: int) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        if self._flight.pop(key, None) is None:
            self._forget_ref(key)
            self._writes().delete(key)

    def _forget_ref(self, key: bytes) -> None:
        """The record at `key` goes: one reference less to the body it shared, if any.
        (A record of an earlier run is known once read: at attach, or by delete_session.)"""
        body_id = self._refs.pop(key, None)
        if body_id is not None:
            self._unref(body_id)

    def load_inflight(self, client_id: str) -> list[tuple[int, int, int, StoredEntry | None]]:
        self.commit()
        prefix = INFLIGHT + self._ident(client_id)
        offset = self._wall_offset()
        found: list[tuple[int, int, int, StoredEntry | None]] = []
        for key, value in self._db.iterator(prefix=prefix):
            if len(value) < 9:
                continue
            packet_id = int.from_bytes(key[len(prefix) :], "big")
            seq, state = int.from_bytes(value[:8], "big"), value[8]
            inline = None
            if value[:8] == INLINE_ENTRY:
                inline = self._entry(key, -1, value[9:], offset)
            found.append((packet_id, seq, state, inline))
        return found

    def put_received(self, client_id: str, packet_id: int) -> None:
        self._writes().put(RECEIVED + self._ident(client_id) + packet_id.to_bytes(2, "big"), b"")

    def delete_received(self, client_id: str, packet_id: int) -> None:
        self._writes().delete(RECEIVED + self._ident(client_id) + packet_id.to_bytes(2, "big"))

    def load_received(self, client_id: str) -> set[int]:
        self.commit()
        prefix = RECEIVED + self._ident(client_id)
        return {
            int.from_bytes(key[len(prefix) :], "big")
            for key in self._db.iterator(prefix=prefix, include_value=False)
        }
