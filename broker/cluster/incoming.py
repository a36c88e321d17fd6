"""The frames that arrive from other nodes, on the links they opened to this one
(link.py's ClusterServerProtocol), and which part of the cluster takes each: forwarded
messages go through this node's ingress (QoS 1/2 ones numbered: streams.py drops the
duplicates and answers what is queued), sessions moving to handover.py, the leaderless
metadata's to swc/, members joining and leaving to membership.py and adoption.py, admin
requests to operations.py, traces to tracing.py. A request that awaits is answered (ACK)
when it is done, by a task of its own.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.frames import (
    ACK,
    ADMIN,
    ANSWER,
    DRAINED,
    ENQUEUE,
    LEAVE,
    LEAVING,
    LEFT,
    PING,
    PONG,
    PUBLISH,
    STREAM,
    SWC_CLOCK,
    SWC_FETCH,
    SWC_KEYS,
    SWC_STANDING,
    SWC_WATERMARK,
    SWC_WRITE,
    TAKE,
    TAKEOVER,
)
from broker.cluster.tracing import FRAMES as TRACE_FRAMES

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine

    from broker.cluster.adoption import Adoption
    from broker.cluster.handover import Handover
    from broker.cluster.link import ClusterServerProtocol, PeerLink
    from broker.cluster.membership import Membership
    from broker.cluster.operations import RemoteOperations
    from broker.cluster.ports import NodeRouting
    from broker.cluster.streams import Streams
    from broker.cluster.tracing import ClusterTracing


class Recipients(Protocol):
    """The Cluster (node.py), as the frames from other nodes reach its parts."""

    loop: asyncio.AbstractEventLoop
    links: dict[str, PeerLink]  # by node name: a stopping peer's is held
    forwarding: bool  # set while a PUBLISH from another node is routed
    handover: Handover
    adoption: Adoption
    membership: Membership
    operations: RemoteOperations
    tracing: ClusterTracing

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...

    def drained(self, node: str) -> None: ...


class IncomingFrames:
    def __init__(self, cluster: Recipients, routing: NodeRouting, streams: Streams) -> None:
        self.cluster = cluster
        self.routing = routing
        self.streams = streams  # QoS 1/2 messages: duplicates dropped, queued ones answered

    def on_frame(self, inbound: ClusterServerProtocol, frame: list[Any]) -> None:
        cluster = self.cluster
        kind = frame[0]
        if kind == PUBLISH:  # a message another node routed here, for subscribers here
            seq = frame[2] if len(frame) > 2 else None  # QoS 1/2: numbered (streams.py)
            if seq is not None and not self.streams.fresh(inbound, seq):
                return  # queued here already
            routing = self.routing
            message = frames.unpack_message(frame[1], cluster.loop.time())
            cluster.forwarding = True  # Forwarders send it on (they ignore local publishes)
            try:
                congested = routing.ingress.forwarded(message)
            finally:
                cluster.forwarding = False
            if seq is not None:
                self.streams.queued(inbound, seq)
            if cluster.handover.keeping and not any(
                route.subscriber.local for route in routing.router.match(message.topic)
            ):
                cluster.handover.unrouted(message)
            if congested:  # the link waits for these subscribers, as a publisher would
                routing.flow.hold(inbound, congested)
        elif kind == ENQUEUE:
            _, ref, client_id, items, share, *numbered = frame
            if numbered and not self.streams.fresh(inbound, numbered[0]):
                return  # queued here already
            answer = functools.partial(inbound.reply, ACK, ref) if ref else None
            congested = cluster.handover.enqueue(client_id, items, share, answer)
            if numbered:
                self.streams.queued(inbound, numbered[0])
            if congested:
                self.routing.flow.hold(inbound, congested)
        elif kind == TAKEOVER:
            _, ref, client_id, clean = frame
            cluster.handover.on_takeover(inbound, ref, client_id, clean)
        elif kind == PING:
            inbound.reply(PONG, frame[1])
        elif kind == STREAM:
            self.streams.stream(inbound, frame[1], frame[2])
        elif kind == SWC_WRITE:
            cluster.membership.swc().on_write(inbound.node, frame[1], frame[2], frame[3])
        elif kind in (SWC_CLOCK, SWC_FETCH, SWC_WATERMARK, SWC_KEYS):
            result = cluster.membership.swc().answer(inbound.node, kind, frame[2:])
            inbound.reply(ANSWER, frame[1], result)
        elif kind == SWC_STANDING:  # a node starting asks this one as a seed (swc/seeds.py)
            swc = cluster.membership.swc()
            inbound.reply(ANSWER, frame[1], [swc.holds(), swc.alone()])
        elif kind == TAKE:
            _, ref, client_id, expiry = frame
            self._answer_later(inbound, ref, cluster.adoption.take(inbound.node, client_id, expiry))
        elif kind == LEFT:
            self._answer_later(inbound, frame[1], cluster.membership.left(inbound.node, frame[2]))
        elif kind == LEAVE:  # another member runs `nautilus cluster leave` for this one
            inbound.reply(ANSWER, frame[1], cluster.membership.asked_to_leave())
        elif kind == LEAVING:  # that node stops: what it has not read yet waits here
            link = cluster.links.get(inbound.node)
            if link is not None:
                link.hold_until_back()
            else:  # (no link to it, so nothing of this node's is on its way there)
                inbound.reply(DRAINED)
        elif kind == DRAINED:
            cluster.drained(inbound.node)
        elif kind == ADMIN:
            result = cluster.operations.answer(inbound.node, frame[2], frame[3])
            inbound.reply(ANSWER, frame[1], result)
        elif kind in TRACE_FRAMES:
            cluster.tracing.on_frame(inbound.node, frame)
        else:
            raise ValueError(f"unknown frame kind {kind}")

    def _answer_later(
        self, inbound: ClusterServerProtocol, ref: int, work: Coroutine[Any, Any, Any]
    ) -> None:
        """Run a request that awaits; its result goes back as the ACK."""

        async def answer() -> None:
            inbound.reply(ACK, ref, await work)

        self.cluster.spawn(answer(), f"cluster request from {inbound.node}")
