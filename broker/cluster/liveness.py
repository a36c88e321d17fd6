"""Which nodes are alive: the heartbeat, the dead nodes, and the links to the live ones.

Every `liveness_interval` the node refreshes its entry in the metadata and reads
everyone's; a node silent for `dead_after` is dead (one missing from the entries ages on
this node's clock). There is a link to every live node; a dead node's link is closed
(what it held is counted as dropped), and the live node with the lowest name reaps its
sessions (adoption.py) and counts what only the dead node's memory held (losses.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from broker.cluster.metadata import MetadataUnavailable, NodeInfo
from broker.config import host_port

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Any

    from broker.cluster.adoption import Adoption
    from broker.cluster.link import PeerLink
    from broker.cluster.losses import Losses
    from broker.cluster.metadata import MetadataBackend
    from broker.cluster.sync import MetadataSync
    from broker.cluster.tracing import ClusterTracing
    from broker.config import ClusterSettings
    from broker.metrics import Metrics

log = logging.getLogger("nautilus.cluster")


class Neighbourhood(Protocol):
    """The Cluster (node.py), as liveness watches the other nodes and links to them."""

    node: str  # this node's name
    settings: ClusterSettings  # liveness_interval, dead_after, peer_addresses
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    backend: MetadataBackend  # the heartbeat
    links: dict[str, PeerLink]  # by node name
    losses: Losses  # what a dead node held only in memory

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...

    def link_to(self, node: str, address: tuple[str, int]) -> None:
        """A new link to `node`, listening at `address`."""

    def after_heartbeat(self) -> None:
        """What is checked once the nodes are known again (netsplit, removal)."""


class Liveness:
    def __init__(
        self,
        cluster: Neighbourhood,
        sync: MetadataSync,
        tracing: ClusterTracing,
        adoption: Adoption,
    ) -> None:
        self.cluster = cluster
        self.sync = sync  # the heartbeat tells whether the metadata answers
        self.tracing = tracing  # a dead node's parts of traces end
        self.adoption = adoption  # a dead node's sessions are taken
        self.node = cluster.node
        self.settings = cluster.settings
        self.loop = cluster.loop
        self.nodes: dict[str, NodeInfo] = {}  # as of the last heartbeat
        self.dead: set[str] = set()
        self._last_seen: dict[str, float] = {}  # node -> loop time it was last alive
        self._last_heartbeat = self.loop.time()  # of this node's last one that got through

    def alive(self) -> list[str]:
        """This node and the members not declared dead, sorted (the same list on every
        node once liveness has settled)."""
        return sorted({self.node, *(name for name in self.nodes if name not in self.dead)})

    def others_alive(self) -> int:
        """How many other nodes are alive now."""
        return len(self.nodes) - len(self.dead) - (self.node in self.nodes)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.liveness_interval)
            try:
                await self.heartbeat()
            except MetadataUnavailable as exc:
                self.sync.unavailable(exc)
                continue
            self.sync.answered()
            if not self.sync.available:
                await self.sync.recover()

    async def heartbeat(self) -> None:
        infos = {info.name: info for info in await self.cluster.backend.heartbeat()}
        now = self.loop.time()
        dead_after = self.settings.dead_after
        blind = now - self._last_heartbeat - self.settings.liveness_interval
        if blind > 0:  # this node could not look (Redis away): that is nobody's silence
            for name in self._last_seen:
                self._last_seen[name] += blind
        self._last_heartbeat = now
        for info in infos.values():
            if info.age < dead_after:
                self._last_seen[info.name] = now - info.age
        # A node missing from the entries ages on this node's clock from when it was last
        # seen alive: another node may have reaped and forgotten it before this one saw
        # it silent, or Redis restarted empty and it has not refreshed its entry yet.
        for name, last in list(self._last_seen.items()):
            if name not in infos and name != self.node:
                old = self.nodes.get(name)
                address, boot_id = (old.address, old.boot_id) if old else ("", "")
                infos[name] = NodeInfo(name, address, boot_id, now - last)
                if now - last >= dead_after and name in self.dead:
                    del self._last_seen[name]  # dead, and gone from the cluster
        self.nodes = infos
        alive = sorted(
            info.name for info in infos.values() if info.age < dead_after or info.name == self.node
        )
        for info in infos.values():
            if info.name == self.node:
                continue
            if info.age < dead_after:
                if info.name in self.dead:
                    self.dead.discard(info.name)
                    self.cluster.metrics.netsplit_resolved += 1
                    log.warning("cluster: node %s is back", info.name)
                self._ensure_link(info)
            elif info.name not in self.dead:
                self._declare_dead(info.name, f"silent for {info.age:.1f}s")
            if info.name in self.dead and alive and alive[0] == self.node:
                reap = self.adoption.reap(info.name)
                self.cluster.spawn(reap, f"cluster reaping {info.name}")
        self.cluster.after_heartbeat()

    def _declare_dead(self, name: str, why: str) -> None:
        self.dead.add(name)
        self.cluster.metrics.netsplit_detected += 1
        log.warning("cluster: node %s %s: dead", name, why)
        self.tracing.node_dead(name)
        link = self.cluster.links.pop(name, None)
        if link is not None:
            if not link.peer_stopped:  # (one that said it stops took its clients away)
                self.cluster.losses.gone_without_leaving(name, link.peer_at_risk, "died")
            link.close()  # what waited for it is counted as dropped

    def _ensure_link(self, info: NodeInfo) -> None:
        address = self.settings.peer_addresses.get(info.name) or info.address
        link = self.cluster.links.get(info.name)
        if link is not None and "{}:{}".format(*link.address) == address:
            return
        try:
            target = host_port(address)
        except ValueError:
            log.error("cluster: node %s advertises %r, not host:port", info.name, address)
            return
        if link is not None:  # it restarted elsewhere: what waits for it goes there
            link.retarget(target)
            return
        self.cluster.link_to(info.name, target)
