"""The object kept per key: a dotted causal container (DCC).

`versions` holds the values written concurrently (siblings), each under the dot that
wrote it; `context` is a version vector: the writes this object has seen, kept or
superseded. A stored object is *stripped* (context entries the node clock's base already
covers are left out, so a key in the steady state keeps no context at all) and *filled*
again from the node clock when read or merged.

Reference: VerneMQ's `swc_kv.erl`. Pure values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.cluster.swc.clock import Dot, NodeClock

DELETED = None  # the value a delete writes, read back as "absent" (VerneMQ's '$deleted')


@dataclass(slots=True)
class Dcc:
    versions: dict[Dot, Any] = field(default_factory=dict)
    context: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Dcc:
        return Dcc(dict(self.versions), dict(self.context))

    def values(self) -> list[Any]:
        """The live values (siblings), deletes left out, oldest dot first."""
        return [value for _, value in sorted(self.versions.items()) if value is not DELETED]

    def discard(self, context: dict[str, int]) -> None:
        """Drop the versions `context` has seen (a write that supersedes them)."""
        self.versions = {
            dot: value for dot, value in self.versions.items() if dot[1] > context.get(dot[0], 0)
        }
        _raise(self.context, context)

    def add(self, dot: Dot, value: Any) -> None:
        self.versions[dot] = value
        if dot[1] > self.context.get(dot[0], 0):
            self.context[dot[0]] = dot[1]

    def fill(self, clock: NodeClock) -> None:
        """Raise the context to the clock's bases: what the node has seen, this key has
        seen (or it would hold it)."""
        context = self.context
        for replica, (base, _) in clock.entries.items():  # (every read: no bases() dict)
            if base > context.get(replica, 0):
                context[replica] = base

    def strip(self, clock: NodeClock) -> None:
        """Leave out the context the clock's bases imply."""
        self.context = {
            replica: n for replica, n in self.context.items() if n > clock.base(replica)
        }

    def without_deletes(self) -> None:
        self.versions = {dot: value for dot, value in self.versions.items() if value is not DELETED}

    @property
    def empty(self) -> bool:
        """Nothing to keep: no version and no context (the key can go)."""
        return not self.versions and not self.context


def sync(a: Dcc, b: Dcc) -> Dcc:
    """Merge two replicas of one key: a version survives if both hold it, or if the other
    side has not seen it (its counter is past the other's context)."""
    versions = {
        dot: value
        for dot, value in a.versions.items()
        if dot in b.versions or dot[1] > b.context.get(dot[0], 0)
    }
    for dot, value in b.versions.items():
        if dot not in versions and dot[1] > a.context.get(dot[0], 0):
            versions[dot] = value
    context = dict(a.context)
    _raise(context, b.context)
    return Dcc(versions, context)


def _raise(context: dict[str, int], other: dict[str, int]) -> None:
    for replica, n in other.items():
        if n > context.get(replica, 0):
            context[replica] = n
