"""Other nodes as the router sees them.

A `RemoteNode` stands in the subscription trie for every non-shared subscription that
sessions on one other node hold (one entry per filter, however many subscribers): a
publish that matches it is forwarded to that node once, and matched again there against
its own sessions, as VerneMQ does. A `RemoteMember` is one session on another node in a
shared group here: when the group picks it, the message goes to that session alone.

Both are flow-control subscribers (broker/flow.py): while their link is above its
high-water mark, publishers feeding them wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cluster import frames
from broker.cluster.frames import ENQUEUE

if TYPE_CHECKING:
    from broker.cluster.node import Cluster
    from broker.message import Delivery


class RemoteNode:
    __slots__ = ("client_id", "cluster", "held", "node", "stuck")

    online = True
    local = False

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.client_id = f"$cluster/{node}"
        self.held = False
        self.stuck = False

    def __repr__(self) -> str:
        return f"<RemoteNode {self.node}>"

    @property
    def progress(self) -> int:
        link = self.cluster.links.get(self.node)
        return link.progress if link is not None else 0

    def deliver(self, delivery: Delivery) -> RemoteNode | None:
        """Forward the message (not this delivery's QoS: the other node decides its own
        subscribers'). Returns self when publishers must wait for the link."""
        cluster = self.cluster
        metrics = cluster.metrics
        metrics.router_matches_local -= 1  # counted as a local match by the broker
        metrics.router_matches_remote += 1
        link = cluster.links.get(self.node)
        frame = cluster.publish_frame(delivery.message)
        if link is None:
            metrics.cluster_bytes_dropped += len(frame)
            return None
        link.send(frame)
        return self if link.congested and not self.stuck else None

    def full(self) -> bool:
        link = self.cluster.links.get(self.node)
        return link is not None and link.congested and not self.stuck

    def must_wait_for(self) -> RemoteNode | None:
        return self if self.full() else None

    def watched(self) -> tuple[()]:
        return ()


class RemoteMember:
    """A session on another node, as a member of a shared group on this one."""

    __slots__ = ("client_id", "cluster", "held", "node", "stuck")

    local = False

    def __init__(self, cluster: Cluster, node: str, client_id: str) -> None:
        self.cluster = cluster
        self.node = node
        self.client_id = client_id
        self.held = False
        self.stuck = False

    def __repr__(self) -> str:
        return f"<RemoteMember {self.client_id} on {self.node}>"

    @property
    def online(self) -> bool:
        link = self.cluster.links.get(self.node)
        return link is not None and link.up

    @property
    def progress(self) -> int:
        link = self.cluster.links.get(self.node)
        return link.progress if link is not None else 0

    def deliver(self, delivery: Delivery) -> RemoteMember | None:
        cluster = self.cluster
        link = cluster.links.get(self.node)
        group = delivery.group
        item = [
            frames.pack_message(delivery.message, cluster.loop.time()),
            delivery.qos,
            delivery.retain,
            list(delivery.sub_ids),
        ]
        share = f"$share/{group.name}/{group.filter}" if group is not None else None
        frame = frames.encode(ENQUEUE, 0, self.client_id, [item], share)
        cluster.metrics.router_matches_remote += 1
        if link is None:
            cluster.metrics.cluster_bytes_dropped += len(frame)
            return None
        link.send(frame)
        return self if link.congested and not self.stuck else None

    def full(self) -> bool:
        link = self.cluster.links.get(self.node)
        return link is not None and link.congested and not self.stuck

    def must_wait_for(self) -> RemoteMember | None:
        return self if self.full() else None

    def watched(self) -> tuple[()]:
        return ()
