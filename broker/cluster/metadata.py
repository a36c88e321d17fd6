"""What a cluster keeps in its shared metadata, and the interface of a metadata backend.

The backend holds the truth every node agrees on: which node owns each client id, each
subscriber's subscriptions (shared ones included) and the retained messages, plus which
nodes are alive and where their cluster listeners are. Nodes write through it and follow
its change stream to keep their local routing view (broker/cluster/view.py).

Only the Redis backend exists (plugins/redis_subs, Courier's way); a leaderless one can
come later behind the same interface. Every write carries a nanosecond timestamp and the
writer's node name: a write older than what is stored (`StaleRequest`), or about a
subscriber that another node owns (`NotOwner`), is refused, as Courier's scripts do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import msgpack

# What the core sees of a backend's answers is the peers' port's (broker/peers.py).
from broker.peers import MetadataUnavailable, Registration, StaleRequest
from broker.subscription_trie import SubOptions

__all__ = [
    "Change",
    "MetadataBackend",
    "MetadataUnavailable",
    "NodeInfo",
    "NotOwner",
    "Registration",
    "Resync",
    "Snapshot",
    "StaleRequest",
    "SubOptions",  # what a backend stores per subscription
    "Subscriber",
    "Write",
    "pack_subscriptions",
    "unpack_subscriptions",
]


class NotOwner(Exception):
    """A write about a subscriber that another node owns."""


class Resync(Exception):
    """The change stream lost events (trimmed, or the backend restarted empty): the
    reader must load the whole state again."""


@dataclass(slots=True)
class Subscriber:
    """One client id's record: the node that owns it, whether its session ends with its
    connection (clean), and its subscriptions by filter (`$share/...` included)."""

    node: str
    clean: bool
    subscriptions: dict[str, SubOptions] = field(default_factory=dict)


@dataclass(slots=True)
class NodeInfo:
    name: str
    address: str  # its cluster listener as it advertises it
    boot_id: str  # new at every start: a restarted node is a new peer
    age: float  # seconds since its last liveness refresh


@dataclass(slots=True)
class Change:
    """One entry of the change stream: a subscriber record set or deleted (`client_id`),
    or a retained message set or cleared (`topic`, `retained` the packed message or None).
    `seq` numbers the entries without gaps."""

    seq: int
    client_id: str = ""
    subscriber: Subscriber | None = None
    topic: str = ""
    retained: bytes | None = None


@dataclass(slots=True)
class Snapshot:
    """The whole state at one point of the change stream (`seq`)."""

    seq: int
    subscribers: dict[str, Subscriber]
    retained: dict[str, bytes]


@dataclass(slots=True)
class Write:
    """A subscriber record to store (None: delete it), as of `ts` (ns)."""

    client_id: str
    subscriber: Subscriber | None
    ts: int


class MetadataBackend(Protocol):
    """Every call may raise MetadataUnavailable."""

    async def open(self, node: str, boot_id: str, address: str) -> None:
        """Connect and load what the backend needs (scripts, functions)."""

    async def close(self) -> None: ...

    async def heartbeat(self) -> list[NodeInfo]:
        """Refresh this node's liveness entry; every node known, the dead included."""

    async def register(self, client_id: str, clean: bool, ts: int) -> Registration:
        """Make this node the owner of `client_id` (StaleRequest if `ts` is not newer)."""

    async def write(self, writes: list[Write]) -> list[Exception | None]:
        """Store or delete records this node owns, in order; per write None or the
        refusal (StaleRequest, NotOwner)."""

    async def retain(self, changes: list[tuple[str, bytes | None, int]]) -> None:
        """Set (or with None clear) the retained message of each topic, as of its ts
        (a change older than the stored one is ignored)."""

    async def snapshot(self) -> Snapshot:
        """The whole state, and the change stream's position for changes() to read on."""

    async def subscribers(self) -> dict[str, Subscriber]:
        """Every subscriber record as it is now (the stream's position untouched)."""

    def changes(self, after: int) -> AsyncIterator[Change]:
        """The changes after sequence number `after`, as they happen; raises Resync when
        some are lost."""

    async def reap(self, dead: str, limit: int) -> list[tuple[str, Subscriber]] | None:
        """Take over up to `limit` subscribers of a dead node: clean ones are deleted,
        the others moved to this node and returned. None once the dead node has none left
        (it is then forgotten). Refused (empty list) if `dead` came back meanwhile."""


def pack_subscriptions(subscriptions: dict[str, SubOptions]) -> bytes:
    """A subscriber's subscriptions as both backends store them (msgpack)."""
    return msgpack.packb(
        {
            topic_filter: [
                o.qos,
                o.no_local,
                o.retain_as_published,
                o.retain_handling,
                o.subscription_id,
            ]
            for topic_filter, o in sorted(subscriptions.items())
        }
    )


def unpack_subscriptions(data: bytes) -> dict[str, SubOptions]:
    return {
        topic_filter: SubOptions(*options)
        for topic_filter, options in msgpack.unpackb(data).items()
    }
