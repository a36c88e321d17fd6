"""Anti-entropy: one replica pulls what a peer's replica of the same group has.

The peer is reached through `Peer` (the cluster channel; in tests, another replica
in-process): its clock, the objects for the dots this replica lacks, in batches of
`batch_size` dots, then its watermark. Only the puller learns: the peer pulls in rounds
of its own (VerneMQ's `vmq_swc_exchange_fsm`). Local writes and broadcasts may land
between the batches: every step reads the replica as it is then.
"""

from __future__ import annotations

from typing import Protocol

from broker.cluster.swc.clock import Dot, NodeClock
from broker.cluster.swc.replica import Fetched, Key, Replica
from broker.cluster.swc.watermark import Watermark


class Peer(Protocol):
    """A group's replica on another node."""

    async def clock(self) -> NodeClock: ...

    async def fetch(self, dots: list[Dot]) -> list[Fetched]: ...

    async def watermark(self) -> Watermark: ...


async def pull(replica: Replica, peer_id: str, peer: Peer, batch_size: int) -> list[Key]:
    """One exchange; returns the keys whose values changed here."""
    remote_clock = await peer.clock()
    missing = replica.missing(remote_clock)
    changed: list[Key] = []
    for start in range(0, len(missing), batch_size):
        fetched = await peer.fetch(missing[start : start + batch_size])
        changed += replica.repair(fetched, remote_clock)
    replica.finish_exchange(peer_id, remote_clock, await peer.watermark())
    return changed
