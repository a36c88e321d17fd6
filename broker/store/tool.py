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
    COUNTERS,
    INFLIGHT,
    INLINE_ENTRY,
    QUEUE,
    RECEIVED,
    REFS,
    RETAINED,
    SESSION,
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
    counters: dict[str, int] = {}
    ref_counts: dict[int, int] = {}
    bodies: set[int] = set()
    inflight_clients: set[str] = set()
    for key, value in db.iterator():
        if key.startswith(SESSION):
            sessions.add(key[len(SESSION) :].decode(errors="replace"))
        elif key.startswith(RETAINED):
            found.retained += 1
        elif key.startswith(COUNTERS):
            try:
                counters[key[len(COUNTERS) :].decode()] = records.decode_counters(value)[0]
            except records.RecordError as exc:
                found.problems.append(f"counters {key!r}: {exc}")
        elif key.startswith(QUEUE):
            found.entries[_client(key, QUEUE)] += 1
            _count_reference(found, f"queue entry {key!r}", value)
        elif key.startswith(INFLIGHT):
            found.inflight += 1
            inflight_clients.add(_client(key, INFLIGHT))
            if value[:8] == INLINE_ENTRY:  # it carries its entry, perhaps a reference
                _count_reference(found, f"in-flight record {key!r}", value[9:])
        elif key.startswith(RECEIVED):
            found.received += 1
        elif key.startswith(BODY):
            bodies.add(int.from_bytes(key[len(BODY) :], "big"))
        elif key.startswith(REFS):
            ref_counts[int.from_bytes(key[len(REFS) :], "big")] = int.from_bytes(value, "big")
    found.sessions = len(sessions)
    for client in sorted(inflight_clients - sessions):  # f/ keys sort before s/ ones
        if client not in sessions:
            found.problems.append(f"in-flight records of {client!r}, which has no session")
    found.bodies = len(bodies)
    for client, count in sorted(found.entries.items()):
        if client not in sessions:
            found.problems.append(f"{count} queue entries of {client!r}, which has no session")
        elif counters.get(client, 0) != count:
            found.problems.append(
                f"{client!r}: counter says {counters.get(client, 0)} entries, found {count}"
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
