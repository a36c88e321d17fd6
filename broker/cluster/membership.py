"""Who is a member (metadata = "swc"): `nautilus cluster join` and `nautilus cluster
leave`, the LEAVE and LEFT requests of the members, and this node finding itself
removed. The departure itself, a node leaving with its sessions, is departure.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.frames import LEAVE
from broker.cluster.swc.seeds import Joiner, Seeds
from broker.config import host_port

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from broker.cluster.departure import Departure
    from broker.cluster.swc.backend import SwcBackend

log = logging.getLogger("nautilus.cluster")

LEAVE_TIMEOUT = 10.0  # seconds a member asked to leave has to say whether it does


class JoiningNode(Joiner, Protocol):
    """The Cluster (node.py), as members join and leave: a Joiner of seeds.py, and its
    listener's address (not a seed of its own)."""

    address: tuple[str, int] | None  # the cluster listener, bound

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...


class Membership:
    def __init__(
        self,
        cluster: JoiningNode,
        replicated: SwcBackend | None,
        departure: Departure | None,
    ) -> None:
        self.cluster = cluster
        self.replicated = replicated  # the members (none: metadata = "redis")
        self.departure = departure  # this node's, with swc
        self._removed_said = False  # that this node was removed and cannot leave yet

    def join(self, address: str) -> str:
        """`nautilus cluster join ADDRESS` (metadata = "swc")."""
        replicated = self._replicated("join")
        try:
            host_port(address)
        except ValueError:
            raise ValueError(f"expected host:port, got {address!r}") from None
        if replicated.alone():  # nothing of its own to keep: copy the cluster's first
            replicated.replicas.unfound()
        seeds = Seeds(self.cluster, replicated, [address], self.cluster.address)
        self.cluster.spawn(seeds.join_through(address), f"cluster join through {address}")
        return f"joining the cluster of {address}: `nautilus cluster show` lists the members"

    async def leave(self, node: str) -> str:
        """`nautilus cluster leave [NODE]` (metadata = "swc"). This node, or a member
        that answers, leaves with its sessions (departure.py); a member that cannot be
        reached is removed, and after dead_after the live node with the lowest name takes
        its sessions, without what was queued on it."""
        replicated = self._replicated("leave")
        node = node or self.cluster.node
        if node not in replicated.members():
            raise ValueError(f"{node} is not a member ({', '.join(sorted(replicated.members()))})")
        if node == self.cluster.node:
            return self._departure().start()
        link = self.cluster.links.get(node)
        if link is not None and link.answering:  # alive: it leaves by itself
            try:
                error, said = await asyncio.wait_for(link.request(LEAVE), LEAVE_TIMEOUT)
            except (ConnectionError, TimeoutError) as exc:
                raise ValueError(f"{node} did not answer: {exc or 'timeout'}") from None
            if error:
                raise ValueError(error)
            return str(said)
        replicated.remove(node)
        log.warning("cluster: node %s removed from the cluster", node)
        after = self.cluster.settings.dead_after
        return (
            f"{node} removed (it cannot be reached): its sessions are taken by a live "
            f"member after {after}s, without what was queued on it"
        )

    def asked_to_leave(self) -> list[Any]:
        """LEAVE: another member runs `nautilus cluster leave` for this one. The answer:
        [error or None, what the departure says]."""
        try:
            return [None, self._departure().start()]
        except ValueError as exc:
            return [str(exc), ""]

    async def left(self, node: str, remove: bool) -> str | None:
        """LEFT: `node` is leaving the cluster. Pull every group from it (nothing it
        wrote is left only there); then, if `remove`, it is no longer a member. (One
        removed already is not pulled: what it wrote since is not wanted.)"""
        replicated = self.swc()
        replicas = replicated.replicas
        if node not in replicated.members():
            return None
        for group in range(len(replicas.groups)):
            if not await replicas.exchange(group, node):
                return f"group {group} could not be pulled from {node}"
        if remove and self.replicated is not None and node in self.replicated.members():
            self.replicated.remove(node)
            await replicas.durable()
            log.warning("cluster: node %s left the cluster", node)
        return None

    def check_removed(self) -> None:
        """swc: another member removed this node (`nautilus cluster leave` while it could
        not be reached): it is not a member now, and leaves as if asked, handing over
        what it holds, once it reaches a member."""
        departure = self.departure
        if self.replicated is None or not self.replicated.removed or departure is None:
            return
        if departure.started:
            return
        try:
            departure.start()
        except ValueError as exc:
            if not self._removed_said:
                self._removed_said = True
                log.error(
                    "cluster: this node was removed from the cluster; it leaves once it can: %s",
                    exc,
                )
            return
        log.error(
            "cluster: this node was removed from the cluster by another member: it leaves, "
            "handing its sessions over"
        )
        # The members forgot, without this node, what it missed while it was cut off
        # (a reaped session's new record, say): a whole copy brings their state, and the
        # sessions that moved meanwhile are handed to their new owners as it arrives.
        self.replicated.replicas.unfound()

    def _departure(self) -> Departure:
        if self.departure is None:
            raise ValueError('leave: only with metadata = "swc"')
        return self.departure

    def _replicated(self, command: str) -> SwcBackend:
        if self.replicated is None:
            raise ValueError(
                f'cluster {command}: only with metadata = "swc" (with "redis", nodes come '
                "and go through Redis)"
            )
        return self.replicated

    def swc(self) -> SwcBackend:
        """The leaderless metadata, which replication frames are for (ValueError: this
        node's is not)."""
        if self.replicated is None:
            raise ValueError("replication frames, and this node's metadata is not swc")
        return self.replicated
