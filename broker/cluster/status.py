"""What the cluster shows of itself: `nautilus cluster status` and the admin API, the
problem /health names, and the figures /metrics and $SYS publish (the leaderless
metadata's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from hooks import Metric

if TYPE_CHECKING:
    from broker.cluster.departure import Departure
    from broker.cluster.link import PeerLink
    from broker.cluster.liveness import Liveness
    from broker.cluster.losses import Census
    from broker.cluster.netsplit import Netsplit
    from broker.cluster.swc.backend import SwcBackend
    from broker.cluster.swc.seeds import Seeds
    from broker.cluster.sync import MetadataSync
    from broker.cluster.view import RemoteView
    from broker.config import ClusterSettings
    from broker.metrics import Metrics


class Observed(Protocol):
    """The Cluster (node.py), as its status reads it."""

    node: str
    settings: ClusterSettings  # allow_register_during_outage
    metrics: Metrics  # the routing score
    links: dict[str, PeerLink]  # by node name
    split: bool  # swc: a member cannot be reached
    liveness: Liveness  # the nodes, and which are dead
    sync: MetadataSync  # whether the metadata answers
    view: RemoteView  # the other nodes' subscribers
    replicated: SwcBackend | None  # the leaderless metadata, if it is that
    seeds: Seeds | None  # swc: joining (or starting) the cluster at start


class StatusReport:
    def __init__(
        self, cluster: Observed, netsplit: Netsplit, departure: Departure | None, census: Census
    ) -> None:
        self.cluster = cluster
        self.census = census  # what only this node's memory holds
        self.netsplit = netsplit  # the members that cannot be reached
        self.departure = departure  # this node's, with swc

    def problem(self) -> str | None:
        """The node is leaving the cluster, or the metadata does not answer (/health
        says so)."""
        if self.departure is not None and self.departure.started:
            return "leaving the cluster"
        waiting = self._waiting()
        if waiting is not None:
            return f"not ready: {waiting}"
        if self.cluster.sync.available:
            return None
        refused = not self.cluster.settings.allow_register_during_outage
        return "the cluster's metadata is unavailable" + (
            " (new connections are refused)" if refused else ""
        )

    def status(self) -> dict[str, Any]:
        """What `nautilus cluster status` and the admin API show."""
        cluster = self.cluster
        m = cluster.metrics
        matches = m.router_matches_local + m.router_matches_remote
        departure = self.departure
        return {
            "node": cluster.node,
            "metadata": self._metadata(),
            "leaving": departure.stage if departure is not None and departure.started else None,
            "swc": self._swc(),
            "nodes": self._nodes(),
            "routing_score": {
                "local": m.router_matches_local,
                "remote": m.router_matches_remote,
                "local_share": round(m.router_matches_local / matches, 4) if matches else None,
            },
            "remote_subscribers": len(cluster.view.records),
        }

    def _nodes(self) -> list[dict[str, Any]]:
        cluster = self.cluster
        known, dead = cluster.liveness.nodes, cluster.liveness.dead
        nodes = []
        for name in sorted(set(known) | {cluster.node}):
            info = known.get(name)
            link = cluster.links.get(name)
            nodes.append(
                {
                    "node": name,
                    "self": name == cluster.node,
                    "alive": name == cluster.node or name not in dead,
                    "address": info.address if info is not None else "",
                    "last_seen": round(info.age, 3) if info is not None else None,
                    "link": None if name == cluster.node else bool(link is not None and link.up),
                    "bytes_sent": link.bytes_sent if link is not None else 0,
                    "bytes_dropped": link.bytes_dropped if link is not None else 0,
                    "messages_at_risk": self._at_risk(name, link),
                }
            )
        return nodes

    def _at_risk(self, name: str, link: PeerLink | None) -> int | None:
        """What the node holds only in memory: this node's census, another's last PONG."""
        if name == self.cluster.node:
            return self.census.figure
        return link.peer_at_risk if link is not None else None

    def _waiting(self) -> str | None:
        """swc: what this node waits for before it holds the cluster's metadata."""
        seeds = self.cluster.seeds
        return seeds.not_ready() if seeds is not None else None

    def _metadata(self) -> str:
        if self.cluster.replicated is not None:  # swc: ready (no netsplit)
            waiting = self._waiting()
            if waiting is not None:
                return f"not ready ({waiting})"
            return "ready" if not self.cluster.split else "not ready (netsplit)"
        return "available" if self.cluster.sync.available else "unavailable"

    def _swc(self) -> dict[str, Any] | None:
        """swc: ready (no netsplit), and in sync."""
        if self.cluster.replicated is None:
            return None
        replicas = self.cluster.replicated.replicas
        ages = [g["sync_age_seconds"] for g in replicas.group_figures()]
        return {
            "ready": not self.cluster.split and self._waiting() is None,
            "waiting": self._waiting(),  # what a node not holding the metadata yet waits for
            "unreachable": list(self.netsplit.unreachable),
            "stopped": list(self.netsplit.stopped),  # said so: not a netsplit
            "groups_synced": sum(r.synced for r in replicas.groups.replicas),
            "groups": len(replicas.groups),
            "oldest_exchange_s": max(ages) if ages else 0,
        }

    def figures(self) -> dict[str, int]:
        """Gauges for /metrics and $SYS: what only memory holds, the leaderless
        metadata's figures."""
        replicated = self.cluster.replicated
        swc = replicated.replicas.figures() if replicated is not None else {}
        return {"cluster_messages_at_risk": self.census.figure, **swc}

    def group_metrics(self) -> list[Metric]:
        """/metrics' labelled figures (the leaderless metadata's, per group)."""
        replicated = self.cluster.replicated
        if replicated is None:
            return []
        counters = ("exchanges", "exchange_failures")
        return [
            Metric(
                f"swc_group_{name}",
                value,
                "counter" if name in counters else "gauge",
                (("group", str(group)),),
            )
            for group, figures in enumerate(replicated.replicas.group_figures())
            for name, value in figures.items()
        ]
