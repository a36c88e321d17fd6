"""Whether every member can be reached (metadata = "swc"), and what a netsplit refuses.

The cluster is ready while every member's link answers (VerneMQ's check); a member whose
link has not answered for dead_after makes it a netsplit, and the netsplit switches
(`allow_<action>_during_netsplit`) apply to registrations, publishes and subscriptions.

A member that said it stops (SIGTERM, a restart: its member record says so, and LEAVING
on the links) is not counted until it is back (its next run's record, or its link
welcomed again): it serves nobody meanwhile, so nothing can be decided on both sides of
it, and a rolling restart does not refuse the whole cluster's clients. Only a member that
goes silent without saying so counts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from broker.episodes import Episode

if TYPE_CHECKING:
    import asyncio

    from broker.cluster.link import PeerLink
    from broker.cluster.swc.backend import SwcBackend
    from broker.config import ClusterSettings
    from broker.metrics import Metrics

log = logging.getLogger("nautilus.cluster")


class Reachability(Protocol):
    """The Cluster (node.py), as the netsplit check reads its links."""

    node: str
    settings: ClusterSettings  # dead_after, the allow_*_during_netsplit switches
    loop: asyncio.AbstractEventLoop
    metrics: Metrics  # netsplit_refused
    links: dict[str, PeerLink]  # by node name
    # A member cannot be reached: set here, read by the core on its hot path
    # (broker/peers.py's NetsplitSwitches).
    split: bool


class Netsplit:
    def __init__(self, cluster: Reachability, replicated: SwcBackend | None) -> None:
        self.cluster = cluster
        self.replicated = replicated  # the members (none: not swc, never a netsplit)
        self.unreachable: list[str] = []
        self.stopped: list[str] = []  # members that said they stop (not counted)
        self._unanswered: dict[str, float] = {}  # member -> since when its link is not up
        self._episode = Episode(
            log,
            "requests refused in a netsplit",
            cluster.loop,
            interval=10.0,
            end_level=logging.INFO,
        )

    def refuses(self, action: str) -> str | None:
        cluster = self.cluster
        if not cluster.split or getattr(cluster.settings, f"allow_{action}_during_netsplit"):
            return None
        cluster.metrics.netsplit_refused += 1
        why = f"netsplit: {', '.join(self.unreachable)} cannot be reached"
        self._episode.occurred(
            "cluster: a %s refused (%s; allow_%s_during_netsplit is off); while this lasts "
            "refusals are counted in netsplit_refused",
            action,
            why,
            action,
            reason=why,
        )
        return why

    def check(self) -> None:
        """A member whose link has not answered for dead_after makes a netsplit, unless it
        said it stops. (Run every liveness_interval, and as links come and go.)"""
        if self.replicated is None:
            return
        cluster = self.cluster
        now = cluster.loop.time()
        members = self.replicated.members()
        since = self._unanswered
        said_so = self.replicated.stopped_members()  # also before this node's start
        stopped = []
        for node in members:
            link = cluster.links.get(node)
            if node == cluster.node or (link is not None and link.answering):
                since.pop(node, None)
            elif node in said_so or (link is not None and link.peer_stopped):
                since.pop(node, None)
                stopped.append(node)
            elif link is not None and link.last_answer:  # silent since its last answer
                since[node] = link.last_answer
            else:  # a member just learned of, or a link never up, gets dead_after
                since.setdefault(node, now)
        for node in [node for node in since if node not in members]:
            del since[node]
        dead_after = cluster.settings.dead_after
        unreachable = sorted(node for node, t in since.items() if now - t >= dead_after)
        split = bool(unreachable)
        if split and not cluster.split:
            log.warning(
                "cluster: not ready: %s cannot be reached (netsplit)", ", ".join(unreachable)
            )
        elif cluster.split and not split:
            if self._episode.active:  # the total of what it refused, in the line
                self._episode.ended("cluster: ready again, every member reached")
            else:
                log.info("cluster: ready again, every member reached")
        cluster.split, self.unreachable, self.stopped = split, unreachable, sorted(stopped)
