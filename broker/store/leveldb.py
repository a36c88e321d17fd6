"""LevelDB backend (plyvel).

Layout, one key space with prefixes (client ids cannot contain U+0000 [MQTT-1.5.4-2], so
\\0 ends an id unambiguously; numbers are big-endian so keys sort in order):

    v                              layout version (b"3"; a b"2" store is upgraded)
    r/<topic>                      retained message
    s/<client id>                  session record (JSON: expiry, offline_since, subscriptions)
    n/<client id>                  its queue's counters: entries, next sequence number, floor
                                   (no entry below it), flags (f/ or i/ keys may exist)
    q/<client id>\\0<seq:8>         a queue entry (broker/store/records.py); a session on a
                                   mountpoint m: q/\\0m\\0<client id>\\0<seq:8>, and so
                                   for f/ and i/
    f/<client id>\\0<packet id:2>   an entry in flight: seq:8, state:1 (seq INLINE: the
                                   queue entry follows, it has no q/ key of its own)
    i/<client id>\\0<packet id:2>   an inbound QoS 2 packet id awaiting PUBREL
    b/<body id:8>                  a message body referenced by several queue entries
    c/<body id:8>                  how many entries reference it (4 bytes)
    B                              body ids given out are below this one (8 bytes)
    x/...                          the cluster's at-least-once forwarding: messages sent to
                                   other nodes and not acknowledged, what was queued from
                                   them (broker/cluster/forwarding.py)

Start-up reads the session records and counters only: a queue is read in chunks when its
client connects. Writes go into one WriteBatch committed once per event-loop turn, before
any connection writes to its socket (`sync = true` makes each commit durable with one
fsync for the whole turn). Queue entries are encoded at commit time, so that a message
queued for several sessions in one turn is stored once (a body and a reference count) and
an entry deleted in the turn it was made is never written.

Deleted keys stay in LevelDB as tombstones until a compaction reaches them, and an iterator
steps over every tombstone between its seek target and the next live key, whoever it
belonged to. So nothing on a connection's path seeks where it does not know there is
something to find: the store keeps in memory which client ids have anything stored (a
clean session has nothing, and its CONNECT touches no key), each queue's floor and
counters (reads start at the first live entry and stop at the last), and which packet ids
have in-flight records (deleting a session deletes those keys without a scan); the floor
and whether in-flight / inbound QoS 2 records may exist are kept in the counters record so
that they hold across restarts. Tombstones go when LevelDB's own compactions merge them
into the lowest level that holds their range (`nautilus store compact` forces it offline).
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

LAYOUT = b"3"
UPGRADED_LAYOUT = b"2"  # read as it is; load_sessions rewrites its counters and the version
VERSION = b"v"
RETAINED = b"r/"
SESSION = b"s/"
COUNTERS = b"n/"
QUEUE = b"q/"
INFLIGHT = b"f/"
RECEIVED = b"i/"
BODY = b"b/"
REFS = b"c/"
BODY_IDS = b"B"
CLUSTER = b"x/"  # the cluster's forwarding records (broker/cluster/forwarding.py)
INLINE_ENTRY = b"\xff" * 8  # the seq of an in-flight record that carries its entry
SENT = 0  # its state: session.AWAITING_ACK
BODY_CACHE = 4096  # decoded shared bodies kept, so that sessions reading them share one
WRITE_BUFFER = 64 << 20  # bytes of writes kept in memory before a flush to disk
BODY_BLOCK = 1 << 16  # body ids reserved by one write of BODY_IDS
GAPS_KEPT = 4096  # entries deleted out of order remembered per queue, to move its floor on

# A client's counters (`LevelDBStore._counters`): the first two are also the session
# record's `queued` and `next_seq`; FLOOR: no queue entry has a smaller seq; FLAGS:
# records.HAS_INFLIGHT / HAS_RECEIVED, set while such records may be in the store.
ENTRIES, NEXT, FLOOR, FLAGS = range(4)


def _id(client_id: str) -> bytes:
    """A session's key as queue, in-flight and inbound keys start with it: no id's is the
    beginning of another's, so a prefix scan reads one session's keys only. A mountpoint's
    session, "<mountpoint>\\0<client id>" (broker/mountpoints.py), is \\0-framed: its
    bare form would begin with the id of the default tree's client "<mountpoint>"."""
    if "\0" in client_id:
        return b"\0" + client_id.encode() + b"\0"
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
        # Whether every client id with keys in the store is in _counters (or _unknown):
        # from the start for a new store, once load_sessions has run for another.
        self._all_known = False
        self._layout = self._check_layout()
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
        # Client id -> [entries, next seq, floor, flags] (ENTRIES, NEXT, FLOOR, FLAGS), for
        # every client id that may have something stored.
        self._counters: dict[str, list[int]] = {}
        self._dirty: set[str] = set()  # client ids whose counters changed this turn
        # Client ids whose keys are not known: a session record that did not decode, or a
        # client first seen before load_sessions. Reads and deletes scan them in full.
        self._unknown: set[str] = set()
        # Client id -> the packet ids of its in-flight records / inbound QoS 2 ids; absent
        # while not known (a session of an earlier run whose flag is set, not read yet).
        # Not empty: the client's flag (HAS_INFLIGHT / HAS_RECEIVED) is set.
        self._flight_ids: dict[str, set[int]] = {}
        self._received_ids: dict[str, set[int]] = {}
        self._gaps: dict[str, set[int]] = {}  # seqs deleted above a queue's floor
        self._refs: dict[bytes, int] = {}  # entry key -> body id, for entries that refer
        self._body_refs: dict[int, int] = {}  # body id -> references (bodies seen this run)
        self._bodies: dict[int, Message] = {}  # body id -> decoded message (a small cache)
        self._next_body, self._body_limit = self._body_ids()
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

    def _check_layout(self) -> int:
        """The store's layout (3, or 2 until load_sessions upgrades it)."""
        version = self._db.get(VERSION)
        if version is None:
            if next(self._db.iterator(include_value=False), None) is not None:
                self._db.close()
                raise StoreError(
                    f"store {self.path!r} was written by an older Nautilus (layout 1); "
                    "move it aside to start with an empty store"
                )
            self._db.put(VERSION, LAYOUT, sync=True)
            self._all_known = True  # a new store: nothing in it yet
            return 3
        if version == UPGRADED_LAYOUT:
            return 2
        if version != LAYOUT:
            self._db.close()
            raise StoreError(f"store {self.path!r} has unknown layout {version!r}")
        return 3

    def _body_ids(self) -> tuple[int, int]:
        """The next body id, and the bound below which ids are reserved in the store."""
        stored = self._db.get(BODY_IDS)
        if stored is not None:
            limit = int.from_bytes(stored, "big")
            return limit, limit
        if self._layout == 3:  # layout 3 writes the bound with its first body: none yet
            return 1, 0
        # A store of layout 2: its last body, found once (load_sessions writes the bound).
        # The seek steps over every deleted key after the bodies: not at every start.
        for key in self._db.iterator(prefix=BODY, reverse=True, include_value=False):
            return int.from_bytes(key[len(BODY) :], "big") + 1, 0
        return 1, 0

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
            layout_3 = self._layout == 3
            for client_id in self._dirty:
                counters = self._counters.get(client_id)
                if counters is not None:
                    entries, next_seq, floor, flags = counters
                    value = (
                        records.encode_counters(entries, next_seq, floor, flags)
                        if layout_3
                        else records.encode_counters(entries, next_seq)
                    )
                    batch.put(COUNTERS + client_id.encode(), value)
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
                if self._next_body > self._body_limit:  # reserve the next ones with it
                    self._body_limit = self._next_body + BODY_BLOCK
                    batch.put(BODY_IDS, _seq(self._body_limit))
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
            # The record holds the topic its clients know; the key, the broker's name of
            # it, with its mountpoint (broker/mountpoints.py).
            message.topic = key[len(RETAINED) :].decode()
            yield message

    # -- what is known of a client id -----------------------------------------------

    def _client(self, client_id: str) -> list[int]:
        """The counters of a client id first seen in this run (its first write)."""
        counters = self._counters[client_id] = [0, 0, 0, 0]
        if self._all_known:  # nothing of it is stored: what it gets is known from here on
            self._flight_ids[client_id] = set()
            self._received_ids[client_id] = set()
        else:  # there may be keys of an earlier run that nothing has read
            counters[FLAGS] = records.MAY_HAVE_ANY
            self._unknown.add(client_id)
        return counters

    def _nothing_stored(self, client_id: str) -> bool:
        """Known to have no key at all (a clean session: the common CONNECT)."""
        return (
            self._all_known and client_id not in self._counters and client_id not in self._unknown
        )

    def _changed(self, client_id: str) -> None:
        self._dirty.add(client_id)
        self._schedule()

    # -- sessions ----------------------------------------------------------------------

    def put_session(self, record: SessionRecord) -> None:
        client_id = record.client_id
        self._writes().put(SESSION + client_id.encode(), records.encode_session(record))
        counters = self._counters.get(client_id) or self._client(client_id)
        flags = counters[FLAGS]
        if flags:  # clear what is known to be gone (at most once per connect, disconnect)
            if flags & records.HAS_INFLIGHT and self._flight_ids.get(client_id) == set():
                flags &= ~records.HAS_INFLIGHT
            if flags & records.HAS_RECEIVED and self._received_ids.get(client_id) == set():
                flags &= ~records.HAS_RECEIVED
            if flags != counters[FLAGS]:
                counters[FLAGS] = flags
                self._dirty.add(client_id)

    def delete_session(self, client_id: str) -> None:
        counters = self._counters.pop(client_id, None)
        unknown = client_id in self._unknown
        if counters is None and not unknown and self._all_known:
            return  # nothing of it was ever stored: no key to delete, nothing to write
        self._unknown.discard(client_id)
        self._dirty.discard(client_id)
        self._gaps.pop(client_id, None)
        ident = self._idents.pop(client_id, None) or _id(client_id)
        pending = self._pending.pop(client_id, None)  # queue entries never written
        flight = self._flight_ids.pop(client_id, None)
        received = self._received_ids.pop(client_id, None)
        fprefix = INFLIGHT + ident
        unwritten: set[bytes] = set()  # in-flight records of this turn, never written
        if flight is not None:
            for packet_id in flight:
                key = fprefix + packet_id.to_bytes(2, "big")
                if self._flight.pop(key, None) is not None:
                    unwritten.add(key)
        else:
            for key in [key for key in self._flight if key.startswith(fprefix)]:
                del self._flight[key]
        bounded = counters is not None and not unknown
        # Queue entries in the store: known exactly by the counters (-1: not known).
        stored = counters[ENTRIES] - len(pending or ()) if counters and bounded else -1
        if stored or flight is None or received is None:
            self.commit()  # so that the iterators below see every entry
        batch = self._writes()
        if stored:
            prefix = QUEUE + ident
            if counters is not None and bounded:  # from the floor, up to the last live one
                entries = self._db.iterator(
                    start=prefix + _seq(counters[FLOOR]), stop=prefix + _seq(counters[NEXT])
                )
            else:
                entries = self._db.iterator(prefix=prefix)
            for key, value in entries:
                try:
                    body_id = records.Entry(value).body_id
                except records.RecordError:
                    body_id = None
                self._refs.pop(key, None)
                if body_id is not None:
                    self._unref(body_id)
                batch.delete(key)
                stored -= 1
                if stored == 0:
                    break  # the last one: do not step over what lies beyond
        if flight is None:
            for key, value in self._db.iterator(prefix=fprefix):
                if value[:8] == INLINE_ENTRY and key not in self._refs:
                    try:
                        body_id = records.Entry(value[9:]).body_id
                    except records.RecordError:
                        body_id = None
                    if body_id is not None:
                        self._refs[key] = body_id
                self._forget_ref(key)
                batch.delete(key)
        else:
            for packet_id in flight:
                key = fprefix + packet_id.to_bytes(2, "big")
                if key not in unwritten:
                    self._forget_ref(key)
                    batch.delete(key)
        rprefix = RECEIVED + ident
        if received is None:
            for key in self._db.iterator(prefix=rprefix, include_value=False):
                batch.delete(key)
        else:
            for packet_id in received:
                batch.delete(rprefix + packet_id.to_bytes(2, "big"))
        batch.delete(SESSION + client_id.encode())
        batch.delete(COUNTERS + client_id.encode())

    def load_sessions(self) -> Iterator[SessionRecord]:
        self.commit()
        upgrade = self._layout == 2  # no floors nor flags: every session may have anything
        for key, value in self._db.iterator(prefix=SESSION):
            client_id = key[len(SESSION) :].decode()
            try:
                record = records.decode_session(client_id, value)
                stored = self._db.get(COUNTERS + client_id.encode())
                if stored is not None:
                    queued, next_seq, floor, flags = records.decode_counters(stored)
                else:  # layout 3 writes counters for every session with more than a record
                    queued = next_seq = floor = 0
                    flags = records.MAY_HAVE_ANY if upgrade else 0
            except records.RecordError as exc:
                log.error("session %r left out: %s", client_id, exc)
                self._unknown.add(client_id)  # deleted in full if its client id comes back
                continue
            record.queued, record.next_seq = queued, next_seq
            self._counters[client_id] = [queued, next_seq, min(floor, next_seq), flags]
            if not flags & records.HAS_INFLIGHT:
                self._flight_ids[client_id] = set()
            if not flags & records.HAS_RECEIVED:
                self._received_ids[client_id] = set()
            if upgrade:
                self._dirty.add(client_id)  # rewritten in the layout-3 form below
            yield record
        self._all_known = True
        if upgrade:
            self._layout = 3
            batch = self._writes()  # with every counters record, in one batch
            if self._body_limit < self._next_body:
                self._body_limit = self._next_body
                batch.put(BODY_IDS, _seq(self._body_limit))
            batch.put(VERSION, LAYOUT)
            self.commit()

    # -- queues ------------------------------------------------------------------------

    def put_entry(self, client_id: str, seq: int, delivery: Delivery) -> None:
        entries = self._pending.get(client_id)
        if entries is None:
            entries = self._pending[client_id] = {}
        entries[seq] = delivery
        counters = self._counters.get(client_id) or self._client(client_id)
        counters[ENTRIES] += 1
        if seq >= counters[NEXT]:
            counters[NEXT] = seq + 1
        if seq < counters[FLOOR]:
            counters[FLOOR] = seq
        self._changed(client_id)

    def delete_entry(self, client_id: str, seq: int) -> None:
        counters = self._counters.get(client_id) or self._client(client_id)
        entries = self._pending.get(client_id)
        if entries is None or entries.pop(seq, None) is None:  # written: delete it
            key = QUEUE + self._ident(client_id) + _seq(seq)
            self._writes().delete(key)
            body_id = self._refs.pop(key, None)
            if body_id is not None:
                self._unref(body_id)
        counters[ENTRIES] -= 1
        floor = counters[FLOOR]
        if counters[ENTRIES] == 0:  # empty: every seq so far is gone
            counters[FLOOR] = counters[NEXT]
            self._gaps.pop(client_id, None)
        elif seq == floor:  # the head went: the floor moves past what went before it
            floor += 1
            gaps = self._gaps.get(client_id)
            if gaps:
                while floor in gaps:
                    gaps.remove(floor)
                    floor += 1
            counters[FLOOR] = floor
        elif seq > floor:  # one behind the head went first (acknowledged out of order)
            gaps = self._gaps.get(client_id)
            if gaps is None:
                gaps = self._gaps[client_id] = set()
            elif len(gaps) >= GAPS_KEPT:
                gaps.clear()  # the floor stays where it is (lower: still true)
            gaps.add(seq)
        self._changed(client_id)

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
        counters = self._counters.get(client_id)
        if counters is not None and (client_id in self._unknown or counters[ENTRIES] < 0):
            counters = None  # not to be trusted: the whole range is read
        if (counters is not None and counters[ENTRIES] == 0) or self._nothing_stored(client_id):
            return []  # nothing queued: no seek (it would step over every tombstone after)
        self.commit()
        skipped = set(skip)
        prefix = QUEUE + self._ident(client_id)
        offset = self._wall_offset()
        found: list[StoredEntry] = []
        if counters is None:  # not known: the whole range
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
        # Every entry lies between the floor and the last seq given, and there are
        # counters[ENTRIES] of them: the read starts at the first that can be there and
        # stops at the last one, never stepping on into the tombstones beyond.
        floor, last = counters[FLOOR], counters[NEXT] - 1
        first = floor if newest_first else max(after + 1, floor)
        if first > last:
            return []
        entries = self._db.iterator(
            start=prefix + _seq(first),
            stop=prefix + _seq(last),
            include_stop=True,
            reverse=newest_first,
        )
        remaining = counters[ENTRIES]
        from_floor = first == floor and not newest_first
        for key, value in entries:
            seq = int.from_bytes(key[len(prefix) :], "big")
            if from_floor:  # the first entry from the floor: nothing lies below it
                from_floor = False
                if seq > floor:
                    self._raise_floor(client_id, counters, seq)
            remaining -= 1
            if seq not in skipped:
                found.append(self._entry(key, seq, value, offset))
            if len(found) >= count or remaining <= 0 or (seq >= last and not newest_first):
                break
        return found

    def _raise_floor(self, client_id: str, counters: list[int], seq: int) -> None:
        """A read from the floor found its first entry at `seq`: the floor moves up to it
        (a store of an earlier release, or gaps forgotten past GAPS_KEPT)."""
        counters[FLOOR] = seq
        gaps = self._gaps.get(client_id)
        if gaps:
            gaps.difference_update([g for g in gaps if g <= seq])
        self._changed(client_id)

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

    def _flying(self, client_id: str, packet_id: int) -> None:
        """The first in-flight record of a client that has none (or whose records are
        not known): its flag is set, in the batch with the record."""
        counters = self._counters.get(client_id) or self._client(client_id)
        ids = self._flight_ids.get(client_id)
        if ids is not None:
            ids.add(packet_id)
        if not counters[FLAGS] & records.HAS_INFLIGHT:
            counters[FLAGS] |= records.HAS_INFLIGHT
            self._changed(client_id)

    def put_inflight(self, client_id: str, packet_id: int, seq: int, state: int) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        if self._flight.pop(key, None) is None:
            self._forget_ref(key)  # a record that carried a shared body no longer does
        self._writes().put(key, _seq(seq) + bytes((state,)))
        ids = self._flight_ids.get(client_id)
        if ids:  # it has some already: its flag is set
            ids.add(packet_id)
        else:
            self._flying(client_id, packet_id)

    def put_inflight_entry(self, client_id: str, packet_id: int, delivery: Delivery) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        self._flight[key] = delivery
        ids = self._flight_ids.get(client_id)
        if ids:  # it has some already: its flag is set
            ids.add(packet_id)
        else:
            self._flying(client_id, packet_id)
        self._schedule()

    def delete_inflight(self, client_id: str, packet_id: int) -> None:
        key = INFLIGHT + self._ident(client_id) + packet_id.to_bytes(2, "big")
        if self._flight.pop(key, None) is None:
            self._forget_ref(key)
            self._writes().delete(key)
        ids = self._flight_ids.get(client_id)
        if ids is not None:
            ids.discard(packet_id)

    def _forget_ref(self, key: bytes) -> None:
        """The record at `key` goes: one reference less to the body it shared, if any.
        (A record of an earlier run is known once read: at attach, or by delete_session.)"""
        body_id = self._refs.pop(key, None)
        if body_id is not None:
            self._unref(body_id)

    def load_inflight(self, client_id: str) -> list[tuple[int, int, int, StoredEntry | None]]:
        ids = self._flight_ids.get(client_id)
        if (ids is not None and not ids) or self._nothing_stored(client_id):
            return []  # known to have none: no seek
        self.commit()
        prefix = INFLIGHT + self._ident(client_id)
        offset = self._wall_offset()
        found: list[tuple[int, int, int, StoredEntry | None]] = []
        seen: set[int] = set()
        for key, value in self._db.iterator(prefix=prefix):
            packet_id = int.from_bytes(key[len(prefix) :], "big")
            seen.add(packet_id)
            if len(value) >= 9:
                seq, state = int.from_bytes(value[:8], "big"), value[8]
                inline = None
                if value[:8] == INLINE_ENTRY:
                    inline = self._entry(key, -1, value[9:], offset)
                found.append((packet_id, seq, state, inline))
            if ids is not None and len(seen) >= len(ids):
                break  # that was every one of them
        if client_id in self._counters and client_id not in self._unknown:
            self._flight_ids[client_id] = seen  # known from here on
        return found

    def put_received(self, client_id: str, packet_id: int) -> None:
        self._writes().put(RECEIVED + self._ident(client_id) + packet_id.to_bytes(2, "big"), b"")
        counters = self._counters.get(client_id) or self._client(client_id)
        ids = self._received_ids.get(client_id)
        if ids is not None:
            ids.add(packet_id)
        if not counters[FLAGS] & records.HAS_RECEIVED:
            counters[FLAGS] |= records.HAS_RECEIVED
            self._changed(client_id)

    def delete_received(self, client_id: str, packet_id: int) -> None:
        self._writes().delete(RECEIVED + self._ident(client_id) + packet_id.to_bytes(2, "big"))
        ids = self._received_ids.get(client_id)
        if ids is not None:
            ids.discard(packet_id)

    def load_received(self, client_id: str) -> set[int]:
        ids = self._received_ids.get(client_id)
        if (ids is not None and not ids) or self._nothing_stored(client_id):
            return set()
        self.commit()
        prefix = RECEIVED + self._ident(client_id)
        found: set[int] = set()
        for key in self._db.iterator(prefix=prefix, include_value=False):
            found.add(int.from_bytes(key[len(prefix) :], "big"))
            if ids is not None and len(found) >= len(ids):
                break
        if client_id in self._counters and client_id not in self._unknown:
            self._received_ids[client_id] = set(found)
        return found

    # -- messages between nodes --------------------------------------------------------

    def put_cluster(self, key: bytes, value: bytes) -> None:
        self._writes().put(CLUSTER + key, value)

    def delete_cluster(self, key: bytes) -> None:
        self._writes().delete(CLUSTER + key)

    def load_cluster(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        start = len(prefix)
        for key, value in self._db.iterator(prefix=CLUSTER + prefix):
            yield key[len(CLUSTER) + start :], value
