"""The metadata as the broker reads and writes it: keys spread over groups, values
resolved last-writer-wins.

Keys are sharded into `count` groups by a stable hash (CRC-32 of the key's msgpack
bytes: the same on every node and every run), each group its own replica with its own
clock, watermark and dot-key map, as VerneMQ's `meta1`..`metaN`. Groups are for
parallel exchanges and smaller clocks, not for sharding: every node holds every group.

A value is written as (timestamp ns, writer, value). Concurrent writes keep siblings
until somebody reads them: `get` then picks the latest (ties by writer name, so that
every node picks the same) and, where siblings were, writes that choice back with their
context so the key settles, as VerneMQ's `metadata_get` does. A delete reads as absent.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from broker.cluster.swc.dcc import Dcc
from broker.cluster.swc.replica import Key, Replica
from broker.cluster.swc.wire import frozen

DEFAULT_GROUPS = 10


@dataclass(slots=True)
class Shipped:
    """A write to broadcast to the group's peers (`Replica.receive` there)."""

    group: int
    key: Key
    obj: Dcc


def group_of(key: Key, count: int) -> int:
    return zlib.crc32(msgpack.packb(key)) % count


def latest(values: Iterable[Any]) -> Any:
    """The winner among siblings (timestamp, writer, value): the last write, and of
    writes with one timestamp the greatest writer name."""
    return max(values, key=lambda stamped: (stamped[0], stamped[1]))


class Groups:
    __slots__ = ("node", "replicas")

    def __init__(self, replicas: list[Replica], node: str) -> None:
        self.replicas = replicas
        self.node = node  # the writer's name in the values it writes

    def __len__(self) -> int:
        return len(self.replicas)

    def replica(self, key: Key) -> tuple[int, Replica]:
        group = group_of(key, len(self.replicas))
        return group, self.replicas[group]

    def get(self, key: Key, shipped: list[Shipped] | None = None) -> Any:
        """The key's value (None: absent). Siblings are resolved, and the resolution
        written back; its broadcast is appended to `shipped` when given."""
        key = frozen(key)
        group, replica = self.replica(key)
        stored = replica.objects.get(key)
        values = stored.values() if stored is not None else []
        if len(values) < 2:  # (no siblings: no context to fill, nothing to write back)
            return values[0][2] if values else None
        obj = replica.read(key)
        winner = latest(values)
        written = replica.write(key, winner, obj.context)
        if shipped is not None:
            shipped.append(Shipped(group, key, written))
        return winner[2]

    def put(self, key: Key, value: Any, ts: int) -> Shipped:
        """Write `value` as of `ts` (ns), superseding every sibling this node holds."""
        key = frozen(key)
        group, replica = self.replica(key)
        # Frozen as it will arrive elsewhere (wire.py): every replica holds equal values.
        return Shipped(group, key, replica.write(key, frozen((ts, self.node, value))))

    def delete(self, key: Key) -> Shipped:
        key = frozen(key)
        group, replica = self.replica(key)
        return Shipped(group, key, replica.delete(key))

    def items(self) -> Iterator[tuple[Key, Any]]:
        """Every key that has a value, with its value (siblings resolved, not written
        back: a read-only pass, as a snapshot is)."""
        for replica in self.replicas:
            for key in replica.objects:
                values = replica.read(key).values()
                if values:
                    yield key, latest(values)[2]
