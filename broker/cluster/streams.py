"""At least once between nodes: QoS 1/2 messages forwarded to another node are numbered,
kept by the sender until the receiver says they are queued, sent again on every new link,
and dropped by the receiver when they come again.

The sending side: a QoS 1/2 PUBLISH (or a single ENQUEUE) to another node gets the next
number of this node's stream to it (frames.py: [PUBLISH, message, seq]) and waits in that
node's `Outbox` (sequences.py) until a QUEUED frame acknowledges it. With a persistent
store it is written to the store too, in the batch of the turn that routed it, which the
publisher's PUBACK waits for (broker/writer.py, Ingress.kept): so a message this node
acknowledged survives this node's kill -9, and is sent again once it is back. The link
takes a kept frame only when it has room and only in order (a refused one is offered again
when the link drains); while it is down they wait in the Outbox, within
`outgoing_buffer_size` bytes: beyond that a message is dropped and counted
(`cluster_messages_dropped`). QoS 0 is as before: one frame, nothing kept, nothing answered.

The receiving side: every link starts with STREAM, naming the numbering (its epoch) the
sender uses; the receiver's `Inbox` for that node says which numbers it queued already: a
duplicate is dropped (`cluster_messages_duplicate`), a new one routed to this node's
sessions. Once per event-loop turn, what the turn queued is committed to the store with the
Inboxes that changed (one batch, unless something else in the turn committed first: a
message is never acknowledged before it is stored, and its number is stored with it or
after it), and then each sender gets one QUEUED with the highest number below which
everything is queued.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgpack

from broker.cluster import frames
from broker.cluster.frames import PUBLISH, QUEUED, STREAM
from broker.cluster.sequences import Inbox, Outbox
from broker.config import ClusterSettings

if TYPE_CHECKING:
    from broker.cluster.link import ClusterServerProtocol, PeerLink
    from broker.message import Message
    from broker.metrics import Metrics
    from broker.store import MessageStore

log = logging.getLogger("nautilus.cluster")

# The store's records (under its x/ prefix).
EPOCH = b"e"  # this node's stream epoch
KEPT = b"o/"  # o/<node>\0<seq:8>: a frame sent to <node>, not acknowledged
ACKED = b"a/"  # a/<node>: <node> acknowledged every number up to this one
SEEN = b"d/"  # d/<origin>: what was queued from <origin> (Inbox.state)
RETRY = 0.5  # seconds before a failed commit's acknowledgements are tried again


class StreamingNode(Protocol):
    """The Cluster (node.py), as the streams use it."""

    boot_id: str
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    settings: ClusterSettings
    links: dict[str, PeerLink]


class Streams:
    def __init__(self, cluster: StreamingNode, store: MessageStore) -> None:
        self.cluster = cluster
        self.store = store
        self.keeps = store.persistent  # messages and numbers outlive this run
        self.epoch = self._epoch()
        self.outboxes: dict[str, Outbox] = {}  # by the node they go to
        self.inboxes: dict[str, Inbox] = {}  # by the node they come from
        self._answer: dict[str, ClusterServerProtocol] = {}  # each origin's latest link
        self._changed: set[str] = set()  # origins with something to acknowledge
        self._acknowledging = False
        self._body: tuple[Message | None, bytes] = (None, b"")
        if self.keeps:
            self._load()

    def _epoch(self) -> str:
        """The store's epoch (made with it), or this run's when nothing is kept."""
        if not self.keeps:
            return self.cluster.boot_id
        for _, value in self.store.load_cluster(EPOCH):
            return value.decode()
        epoch = uuid.uuid4().hex
        self.store.put_cluster(EPOCH, epoch.encode())
        return epoch

    def _load(self) -> None:
        limit = self.cluster.settings.outgoing_buffer_size
        for node, value in self.store.load_cluster(ACKED):
            self.outboxes[node.decode()] = Outbox(self.epoch, limit, int(msgpack.unpackb(value)))
        kept = 0
        for key, frame in self.store.load_cluster(KEPT):
            to = key[:-9].decode()
            outbox = self.outboxes.get(to)
            if outbox is None:
                outbox = self.outboxes[to] = Outbox(self.epoch, limit)
            outbox.restore(int.from_bytes(key[-8:], "big"), frame)
            kept += 1
        for origin, value in self.store.load_cluster(SEEN):
            self.inboxes[origin.decode()] = Inbox.of(msgpack.unpackb(value))
        if kept:
            log.info("cluster: %d forwarded messages kept from the last run, to send again", kept)

    # -- sending -----------------------------------------------------------------------

    def publish_body(self, message: Message) -> bytes:
        """The message of a PUBLISH frame (any QoS), encoded once however many nodes it
        goes to."""
        cached, body = self._body
        if cached is not message:
            body = frames.publish_body(message, self.cluster.loop.time())
            self._body = (message, body)
        return body

    def send(self, node: str, frame_of: Callable[[int], bytes]) -> None:
        """Number a QoS 1/2 message for `node` (`frame_of(seq)` is its frame), keep it
        until `node` has queued it, and send it now if the link takes it."""
        outbox = self.outboxes.get(node)
        if outbox is None:
            limit = self.cluster.settings.outgoing_buffer_size
            outbox = self.outboxes[node] = Outbox(self.epoch, limit)
        caught_up = outbox.caught_up
        added = outbox.add(frame_of)
        if added is None:
            self.cluster.metrics.cluster_messages_dropped += 1
            return
        seq, frame = added
        if self.keeps:
            self.store.put_cluster(_kept_key(node, seq), frame)
        link = self.cluster.links.get(node)
        if caught_up and link is not None and link.offer(frame):
            outbox.mark_sent(seq)

    def pump(self, node: str) -> None:
        """Offer the link to `node` what it has not taken, in order, while it has room."""
        outbox = self.outboxes.get(node)
        if outbox is None or outbox.caught_up:
            return
        link = self.cluster.links.get(node)
        if link is None:
            return
        for seq, frame in outbox.unsent():
            if not link.offer(frame):
                return
            outbox.mark_sent(seq)

    def link_up(self, link: PeerLink) -> None:
        """A new link: it starts with this node's epoch, then everything not acknowledged
        goes out again (the receiver drops what it queued already)."""
        outbox = self.outboxes.get(link.node)
        link.send_first(frames.encode(STREAM, self.epoch, outbox.acked if outbox else 0))
        if outbox is None:
            return
        self.cluster.metrics.cluster_messages_resent += outbox.sent - outbox.acked
        outbox.relinked()
        self.pump(link.node)

    def acknowledged(self, node: str, epoch: str, upto: int) -> None:
        """QUEUED from `node`: it queued every number up to `upto`."""
        outbox = self.outboxes.get(node)
        if outbox is None or epoch != outbox.epoch:
            return  # an answer to another run's numbering
        released = outbox.ack(upto)
        if self.keeps and released:
            store = self.store
            for seq in released:
                store.delete_cluster(_kept_key(node, seq))
            store.put_cluster(ACKED + node.encode(), msgpack.packb(outbox.acked))

    def take_kept(self, node: str) -> list[Message]:
        """`node`'s sessions were taken by this one (it was reaped): the messages kept for
        it, for those sessions now. Their numbers are given up (the next STREAM to `node`
        says so)."""
        outbox = self.outboxes.get(node)
        if outbox is None:
            return []
        messages = []
        now = self.cluster.loop.time()
        for seq, frame in outbox.give_up():
            if self.keeps:
                self.store.delete_cluster(_kept_key(node, seq))
            fields = msgpack.unpackb(frame[4:], strict_map_key=False)
            if fields[0] == PUBLISH:  # (an ENQUEUE was for one session, which moved too)
                messages.append(frames.unpack_message(fields[1], now))
        if self.keeps:
            self.store.put_cluster(ACKED + node.encode(), msgpack.packb(outbox.acked))
        return messages

    # -- receiving ---------------------------------------------------------------------

    def stream(self, inbound: ClusterServerProtocol, epoch: str, settled: int) -> None:
        """STREAM: what `inbound`'s node sends next is numbered in `epoch`, and it waits
        for nothing up to `settled`."""
        origin = inbound.node
        inbox = self.inboxes.get(origin)
        if inbox is None:
            inbox = self.inboxes[origin] = Inbox()
        before = inbox.state()
        inbox.stream(epoch, settled)
        if inbox.state() != before:
            self._acknowledge_later(origin)  # (stored with the next commit)
        self._answer[origin] = inbound

    def fresh(self, inbound: ClusterServerProtocol, seq: int) -> bool:
        """Whether the message numbered `seq` is new here (False: a duplicate, dropped,
        and acknowledged again)."""
        inbox = self.inboxes.get(inbound.node)
        if inbox is None:
            raise ValueError("a numbered message before STREAM")
        # Scheduled before routing writes anything: the turn's acknowledgement then
        # commits the store once, queued messages and Inboxes together.
        self._acknowledge_later(inbound.node)
        if inbox.fresh(seq):
            return True
        self.cluster.metrics.cluster_messages_duplicate += 1
        return False

    def queued(self, inbound: ClusterServerProtocol, seq: int) -> None:
        """The message numbered `seq` is in its subscribers' queues (acknowledged at the
        end of the turn: `fresh` scheduled it)."""
        self.inboxes[inbound.node].queued(seq)

    def _acknowledge_later(self, origin: str) -> None:
        self._changed.add(origin)
        if not self._acknowledging:
            self._acknowledging = True
            self.cluster.loop.call_soon(self._acknowledge)

    def _acknowledge(self) -> None:
        """The turn's QUEUED answers, once what they acknowledge is in the store."""
        self._acknowledging = False
        store = self.store
        if self.keeps:
            for origin in self._changed:
                state = msgpack.packb(self.inboxes[origin].state())
                store.put_cluster(SEEN + origin.encode(), state)
        store.commit()
        if store.failed:  # nothing is acknowledged until a commit works
            self._acknowledging = True
            self.cluster.loop.call_later(RETRY, self._acknowledge)
            return
        for origin in self._changed:
            inbound = self._answer.get(origin)
            if inbound is not None:
                inbox = self.inboxes[origin]
                inbound.reply(QUEUED, inbox.epoch, inbox.high)
        self._changed.clear()


def _kept_key(node: str, seq: int) -> bytes:
    return KEPT + node.encode() + b"\0" + seq.to_bytes(8, "big")
