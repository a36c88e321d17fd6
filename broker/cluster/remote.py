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

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.frames import ENQUEUE

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.cluster.link import PeerLink
    from broker.cluster.streams import Streams
    from broker.message import Delivery
    from broker.metrics import Metrics


class Links(Protocol):
    """What the stand-ins for other nodes use of the Cluster (node.py)."""

    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    links: dict[str, PeerLink]  # by node name
    forwarding: bool  # a message another node forwarded is being routed here

    streams: Streams  # messages' frames; QoS 1/2 ones numbered, kept until acknowledged


class _OnAnotherNode:
    """What both stand-ins share: the link to their node, as flow control sees it."""

    __slots__ = ("client_id", "cluster", "held", "node", "stuck")

    local = False  # not a session of this node (shared groups prefer those)

    def __init__(self, cluster: Links, node: str, client_id: str) -> None:
        self.cluster = cluster
        self.node = node
        self.client_id = client_id
        self.held = False
        self.stuck = False

    @property
    def progress(self) -> int:
        link = self.cluster.links.get(self.node)
        return link.progress if link is not None else 0

    def _send(self, frame: bytes) -> _OnAnotherNode | None:
        """Queue a frame for the node (counted as dropped if there is no link to it);
        self when publishers must wait for the link."""
        link = self.cluster.links.get(self.node)
        if link is None:
            self.cluster.metrics.cluster_bytes_dropped += len(frame)
            return None
        link.send(frame)
        return self if link.congested and not self.stuck else None

    def _send_kept(self, frame_of: Callable[[int], bytes]) -> _OnAnotherNode | None:
        """Send a QoS 1/2 message's frame (`frame_of(seq)`), numbered and kept until the
        node has queued it (streams.py); self when publishers must wait for the link."""
        self.cluster.streams.send(self.node, frame_of)
        return self if self.full() else None

    def _enqueue(self, item: list[Any], share: str | None, qos: int) -> _OnAnotherNode | None:
        """An ENQUEUE of one message for the session (numbered and kept at QoS 1/2)."""
        if qos:
            return self._send_kept(
                lambda seq: frames.encode(ENQUEUE, 0, self.client_id, [item], share, seq)
            )
        return self._send(frames.encode(ENQUEUE, 0, self.client_id, [item], share))

    def takes_run(self, level: int, longest: int) -> bool:
        return False  # forwarded message by message (Routing.publish_run)

    def full(self) -> bool:
        link = self.cluster.links.get(self.node)
        return link is not None and link.congested and not self.stuck

    def must_wait_for(self) -> _OnAnotherNode | None:
        return self if self.full() else None

    def watched(self) -> tuple[()]:
        return ()


class RemoteNode(_OnAnotherNode):
    """Every non-shared subscription of one other node, as one subscriber."""

    __slots__ = ()

    online = True

    def __init__(self, cluster: Links, node: str) -> None:
        super().__init__(cluster, node, f"$cluster/{node}")

    def __repr__(self) -> str:
        return f"<RemoteNode {self.node}>"

    def deliver(self, delivery: Delivery) -> _OnAnotherNode | None:
        """Forward the message (not this delivery's QoS: the other node decides its own
        subscribers'). Returns self when publishers must wait for the link."""
        metrics = self.cluster.metrics
        metrics.router_matches_local -= 1  # counted as a local match by the broker
        metrics.router_matches_remote += 1
        message = delivery.message
        body = self.cluster.streams.publish_body(message)
        if message.qos:
            return self._send_kept(functools.partial(frames.publish_frame, body))
        return self._send(frames.publish_frame(body))


class RemoteMember(_OnAnotherNode):
    """A session on another node, as a member of a shared group on this one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<RemoteMember {self.client_id} on {self.node}>"

    @property
    def online(self) -> bool:
        link = self.cluster.links.get(self.node)
        return link is not None and link.up

    def deliver(self, delivery: Delivery) -> _OnAnotherNode | None:
        cluster = self.cluster
        group = delivery.group
        item = [
            frames.pack_message(delivery.message, cluster.loop.time()),
            delivery.qos,
            delivery.retain,
            list(delivery.sub_ids),
        ]
        share = f"$share/{group.name}/{group.filter}" if group is not None else None
        cluster.metrics.router_matches_remote += 1
        return self._enqueue(item, share, delivery.qos)


class Forwarder(_OnAnotherNode):
    """A session handed to another node, lingering in this node's router for a while:
    what other nodes forwarded here for it before they learned where it went is sent on
    to its new node. Local publishes are not: the router reaches the new node for those
    already (through its RemoteNode)."""

    __slots__ = ()

    online = True
    local = True  # matched with this node's sessions when another node's PUBLISH arrives

    def __repr__(self) -> str:
        return f"<Forwarder {self.client_id} to {self.node}>"

    def must_wait_for(self) -> None:
        return None  # local publishers never wait for it (it passes theirs by)

    def deliver(self, delivery: Delivery) -> _OnAnotherNode | None:
        cluster = self.cluster
        if not cluster.forwarding:
            return None
        item = [
            frames.pack_message(delivery.message, cluster.loop.time()),
            delivery.qos,
            delivery.retain,
            list(delivery.sub_ids),
        ]
        return self._enqueue(item, None, delivery.qos)
