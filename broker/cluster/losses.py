"""What a node's crash loses, and its count on a node that survives it.

A durable session (persistent store, expiry not 0) keeps its queue and what is in flight
in the store, and the other nodes keep each QoS 1/2 message they forward until it is
stored (streams.py): a kill -9 loses none of that. What only memory holds is lost with
the process: the queues and in-flight windows of clean sessions (and of every session
with the memory store). Nobody is left on the dead node to count them, so:

- each node counts them itself (`Census`, every `liveness_interval`, or less often on a
  node with so many sessions that the pass would cost more than CENSUS_SHARE of its
  time), shows the figure (the gauge `cluster_messages_at_risk`) and sends it to the
  other nodes in the PONGs its links send every `liveness_interval` (link.py);
- when a node goes without saying so (no LEAVING: killed, or its machine gone), a single
  survivor adds the last figure it heard from it to `cluster_messages_lost_with_node`:
  the live node with the lowest name among the others (`Losses.counts_for`), once the
  node is declared dead (metadata = "redis"; "swc": once it is removed, `nautilus
  cluster leave`) or once it is back with a new boot id (either metadata; a node
  declared dead is counted then, not again when it is back).

An estimate: the figure as of the node's last census before its last PONG, so up to one
census and one `liveness_interval` old at the crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.metrics import Metrics
    from broker.registry import Registry
    from broker.session import Session

log = logging.getLogger("nautilus.cluster")

CENSUS_CHUNK = 10_000  # sessions counted per event-loop turn (others run in between)
CENSUS_SHARE = 0.05  # at most this share of the node's time goes to the census


def held_in_memory(session: Session) -> int:
    """The messages of `session` that only memory holds: none for a durable session;
    else its queue, what an async on_deliver holds and what is in flight."""
    if session.durable:
        return 0
    return session.backlog() + len(session.window.entries)


class Census:
    """This node's messages that only memory holds (`figure`), counted again and again."""

    def __init__(self, registry: Registry, interval: float) -> None:
        self.registry = registry
        self.interval = interval  # seconds between passes, at least
        self.figure = 0  # as of the last pass

    async def run(self) -> None:
        while True:
            cost = await self.count()
            await asyncio.sleep(max(self.interval, cost / CENSUS_SHARE))

    async def count(self) -> float:
        """One pass over the sessions, a chunk per loop turn; the CPU seconds it took.
        (A session that ends meanwhile is counted as it was.)"""
        sessions = list(self.registry.values())
        total = 0
        cost = 0.0
        for start in range(0, len(sessions), CENSUS_CHUNK):
            began = time.perf_counter()
            total += sum(map(held_in_memory, sessions[start : start + CENSUS_CHUNK]))
            cost += time.perf_counter() - began
            await asyncio.sleep(0)
        self.figure = total
        return cost


class Living(Protocol):
    def alive(self) -> list[str]:
        """This node and the members not declared dead, sorted (liveness.py)."""
        ...


class Survivors(Protocol):
    """The Cluster (node.py), as a node's loss is counted on it."""

    node: str  # this node's name
    metrics: Metrics
    liveness: Living  # who is alive


class Losses:
    def __init__(self, cluster: Survivors) -> None:
        self.cluster = cluster

    def counts_for(self, gone: str) -> bool:
        """Whether this node is the one that counts what `gone` lost: the live node with
        the lowest name but for `gone` (the same on every node once liveness settled)."""
        others = [name for name in self.cluster.liveness.alive() if name != gone]
        return bool(others) and others[0] == self.cluster.node

    def gone_without_leaving(self, node: str, held: int, how: str) -> None:
        """`node` went without saying so (`how`); it last said it held `held` messages
        only in memory."""
        if not self.counts_for(node):
            return
        self.cluster.metrics.cluster_messages_lost_with_node += held
        if held:
            log.warning(
                "cluster: node %s %s without stopping: about %d messages only its memory "
                "held (clean sessions' queues, in flight) are lost "
                "(cluster_messages_lost_with_node)",
                node,
                how,
                held,
            )
