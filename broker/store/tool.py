"""`nautilus store stats|check|compact --path DIR`: look into a LevelDB store offline.

The broker must not be running on the store (LevelDB allows one process at a time).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import plyvel

from broker.store import records
from broker.store.base import StoreError
from broker.store.leveldb import (
    BODY,
    BODY_IDS,
    COUNTERS,
    INFLIGHT,
    INLINE_ENTRY,
    QUEUE,
    RECEIVED,
    REFS,
    RETAINED,
    SESSION,
    VERSION,
    open_db,
)


@dataclass
class Survey:
    """What one pass over the store found."""

    sessions: int = 0
    retained: int = 0
    bodies: int = 0
    inflight: int = 0
    received: int = 0
    entries: Counter[str] = field(default_factory=Counter)  # client id -> queue entries
    references: Counter[int] = field(default_factory=Counter)  # body id -> entries
    problems: list[str] = field(default_factory=list)


def _client(key: bytes, prefix: bytes) -> str:
    return key[len(prefix) :].split(b"\0", 1)[0].decode(errors="replace")


def _count_reference(found: Survey, what: str, entry: bytes) -> None:
    """A queue entry: the shared body it references, if any, or why it does not decode."""
    try:
        body_id = records.Entry(entry).body_id
    except records.RecordError as exc:
        found.problems.append(f"{what}: {exc}")
        return
    if body_id is not None:
        found.references[body_id] += 1


def survey(db: plyvel.DB) -> Survey:
    found = Survey()
    sessions: set[str] = set()
    counters: dict[str, tuple[int, int, int, int]] = {}  # entries, next seq, floor, flags
    ref_counts: dict[int, int] = {}
    bodies: set[int] = set()
    inflight_clients: set[str] = set()
    received_clients: set[str] = set()
    seqs: dict[str, list[int]] = {}  # client id -> [lowest, highest] queue entry seq
    layout_3 = db.get(VERSION) == b"3"  # counters with floors and flags
    for key, value in db.iterator():
        if key.startswith(SESSION):
            sessions.add(key[len(SESSION) :].decode(errors="replace"))
        elif key.startswith(RETAINED):
            found.retained += 1
        elif key.startswith(COUNTERS):
            try:
                counters[key[len(COUNTERS) :].decode()] = records.decode_counters(value)
            except records.RecordError as exc:
                found.problems.append(f"counters {key!r}: {exc}")
        elif key.startswith(QUEUE):
            client = _client(key, QUEUE)
            found.entries[client] += 1
            seq = int.from_bytes(key[-8:], "big")
            span = seqs.get(client)
            if span is None:
                seqs[client] = [seq, seq]
            else:
                span[1] = seq
            _count_reference(found, f"queue entry {key!r}", value)
        elif key.startswith(INFLIGHT):
            found.inflight += 1
            inflight_clients.add(_client(key, INFLIGHT))
            if value[:8] == INLINE_ENTRY:  # it carries its entry, perhaps a reference
                _count_reference(found, f"in-flight record {key!r}", value[9:])
        elif key.startswith(RECEIVED):
            found.received += 1
            received_clients.add(_client(key, RECEIVED))
        elif key.startswith(BODY):
            bodies.add(int.from_bytes(key[len(BODY) :], "big"))
        elif key.startswith(REFS):
            ref_counts[int.from_bytes(key[len(REFS) :], "big")] = int.from_bytes(value, "big")
    found.sessions = len(sessions)
    for client in sorted(inflight_clients - sessions):  # f/ keys sort before s/ ones
        found.problems.append(f"in-flight records of {client!r}, which has no session")
    if layout_3:  # the flags say where records may be: a clear one must be true
        none = (0, 0, 0, 0)
        for client in sorted(inflight_clients & sessions):
            if not counters.get(client, none)[3] & records.HAS_INFLIGHT:
                found.problems.append(f"{client!r}: in-flight records, its counters say none")
        for client in sorted(received_clients & sessions):
            if not counters.get(client, none)[3] & records.HAS_RECEIVED:
                found.problems.append(f"{client!r}: inbound QoS 2 ids, its counters say none")
    found.bodies = len(bodies)
    for client, count in sorted(found.entries.items()):
        if client not in sessions:
            found.problems.append(f"{count} queue entries of {client!r}, which has no session")
            continue
        entries, next_seq, floor, _ = counters.get(client, (0, 0, 0, 0))
        if entries != count:
            found.problems.append(f"{client!r}: counter says {entries} entries, found {count}")
        lowest, highest = seqs[client]
        if client in counters and (lowest < floor or highest >= next_seq):
            found.problems.append(
                f"{client!r}: entries {lowest}..{highest} lie outside {floor}..{next_seq - 1}"
            )
    for body_id, count in found.references.items():
        if body_id not in bodies:
            found.problems.append(f"body {body_id} is referenced {count} times but missing")
        elif ref_counts.get(body_id) != count:
            found.problems.append(
                f"body {body_id}: count says {ref_counts.get(body_id)}, referenced {count} times"
            )
    for body_id in bodies - found.references.keys():
        found.problems.append(f"body {body_id} is referenced by no entry (orphan)")
    bound = db.get(BODY_IDS)
    if bound is not None and bodies and max(bodies) >= int.from_bytes(bound, "big"):
        found.problems.append(
            f"body {max(bodies)} is not below the bound of body ids given out, "
            f"{int.from_bytes(bound, 'big')}"
        )
    return found


def _size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nautilus store",
        description="Inspect, check or compact a LevelDB store (with the broker stopped).",
    )
    parser.add_argument("action", choices=["stats", "check", "compact"])
    parser.add_argument("--path", required=True, help="the [store] path of the broker")
    parser.add_argument("--top", type=int, default=10, help="stats: the largest queues shown")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.path, "messages")):
        print(f"nautilus store: no store at {args.path!r}", file=sys.stderr)
        return 2
    try:
        db = open_db(args.path)
    except StoreError as exc:
        print(f"nautilus store: {exc} (stop the broker first)", file=sys.stderr)
        return 1
    try:
        if args.action == "compact":
            before = _size(args.path)
            db.compact_range()
            print(f"compacted: {before:,} -> {_size(args.path):,} bytes")
            return 0
        found = survey(db)
    finally:
        db.close()
    if args.action == "stats":
        print(f"sessions          {found.sessions:,}")
        print(f"queued messages   {sum(found.entries.values()):,}")
        print(f"in flight         {found.inflight:,}")
        print(f"shared bodies     {found.bodies:,}")
        print(f"retained messages {found.retained:,}")
        print(f"inbound QoS 2 ids {found.received:,}")
        print(f"size on disk      {_size(args.path):,} bytes")
        print(f"problems          {len(found.problems):,} (`check` lists them)")
        if found.entries:
            print(f"largest queues (top {args.top}):")
            for client, count in found.entries.most_common(args.top):
                print(f"  {count:>12,}  {client}")
        return 0
    for problem in found.problems:
        print(problem)
    print(f"{len(found.problems)} problems" if found.problems else "ok: no problems found")
    return 1 if found.problems else 0
