"""Sessions moving between nodes: registering a client id before its CONNACK, asking the
node that held it to let go, releasing sessions other nodes took, and their queues
following in acknowledged chunks.

A CONNECT registers the client id in the metadata first (Courier's remap); if another
node owned it, that node is asked over the link to release it: it disconnects the old
connection (MQTT 5: 0x8E), answers, and then sends the session's queue after it in
chunks, each acknowledged, while the client is already connected here. A node that
learns from the change stream that one of its clients is owned elsewhere (it was away
when asked) releases it the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.frames import ACK, ENQUEUE, TAKEOVER
from broker.cluster.metadata import MetadataUnavailable, Registration, StaleRequest
from broker.cluster.remote import Forwarder, Links
from broker.message import Delivery, Message
from broker.subscription_trie import SHARE_PREFIX
from broker.topics import topic_matches

if TYPE_CHECKING:
    from broker.cluster.link import ClusterServerProtocol
    from broker.cluster.metadata import MetadataBackend
    from broker.cluster.ports import NodeSessions
    from broker.config import ClusterSettings
    from broker.flow import FlowControl
    from broker.session import Session
    from broker.subscription_trie import SubOptions, SubscriptionTrie

log = logging.getLogger("nautilus.cluster")

MIGRATION_CHUNK_TIMEOUT = 60.0  # seconds a migrating chunk may take to be acknowledged
UNROUTED_KEPT = 10000  # unmatched forwarded messages kept while sessions are on their way


def _nothing() -> None:
    pass


def _ignore(error: str | None) -> None:
    pass


def _unsubscribe(router: SubscriptionTrie, entries: list[tuple[Forwarder, str]]) -> None:
    for forwarder, topic_filter in entries:
        router.unsubscribe(forwarder, topic_filter)


class OtherNodes(Links, Protocol):
    """The Cluster (node.py), as sessions move to and from the other nodes: its links
    (remote.py's Links, for the Forwarders), which nodes are dead, and whether it is
    taking a dead node's sessions."""

    node: str
    settings: ClusterSettings

    @property
    def dead(self) -> set[str]:
        """The nodes declared dead."""
        ...

    @property
    def reaping(self) -> bool: ...

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...


class OwnerRecords(Protocol):
    """The metadata's record of which node owns a client id, as registrations write it
    (sync.py's MetadataSync)."""

    backend: MetadataBackend
    available: bool  # the metadata answers

    def changed(self, client_id: str) -> None: ...

    def unavailable(self, error: Exception) -> None: ...

    def ts(self) -> int: ...


class Handover:
    def __init__(self, cluster: OtherNodes, records: OwnerRecords, sessions: NodeSessions) -> None:
        self.cluster = cluster
        self.records = records
        self.sessions = sessions  # this node's
        self.backend = records.backend
        self.settings = cluster.settings
        self.loop = cluster.loop
        self.metrics = cluster.metrics
        self.node = cluster.node
        self._registering: dict[str, list[Delivery]] = {}  # early arrivals, per client id
        self._moving: set[str] = set()  # client ids being handed to another node
        self._migrations: dict[str, asyncio.Task] = {}  # queues leaving, by client id
        # client id -> what stands in the router for a session being registered here
        self._stand_ins: dict[str, tuple[_Arrivals, list[str]]] = {}
        # Forwarded messages that matched no session here while registrations or a
        # reaping were under way: the other nodes may route one to its session before the
        # registration's answer (and its stand-in) arrives, or before this node has
        # adopted the session it reaped; it is matched then.
        self._unrouted: deque[Message] = deque(maxlen=UNROUTED_KEPT)

    def unrouted(self, message: Message) -> None:
        """A forwarded message no local session took."""
        if self.keeping:
            self._unrouted.append(message)

    @property
    def registering(self) -> bool:
        """Whether some client is being registered here."""
        return bool(self._registering)

    @property
    def keeping(self) -> bool:
        """Whether forwarded messages that match no session here are kept a moment: a
        client is being registered here, or a dead node's sessions are being taken."""
        return bool(self._registering) or self.cluster.reaping

    def forget_unrouted(self) -> None:
        """What was kept is no longer anybody's, once nothing is on its way here."""
        if not self.keeping:
            self._unrouted.clear()

    def adopted(self, session: Session) -> None:
        """A reaped session lives here now: the forwarded messages kept meanwhile that
        its subscriptions match are queued for it (other nodes learned that it is here
        from the change stream, and may have sent them before this node adopted it)."""
        if self._unrouted:
            deliver_matching(session, self._unrouted)

    def moving(self, client_id: str) -> bool:
        """Whether the client is being released here (its changes are not written)."""
        return client_id in self._moving

    @property
    def migrating(self) -> list[asyncio.Task]:
        """The queues on their way to other nodes."""
        return list(self._migrations.values())

    def busy(self, client_id: str) -> bool:
        """Whether the client is being registered here or released."""
        return client_id in self._moving or client_id in self._registering

    async def register(self, client_id: str, clean: bool) -> Registration | None:
        """Make this node the owner of `client_id` before its CONNACK; another node that
        held it releases it first. None: the metadata is away and registrations are
        allowed anyway. Raises MetadataUnavailable (refuse with 0x88) or StaleRequest."""
        if not self.records.available:
            if not self.settings.allow_register_during_outage:
                self.metrics.cluster_registrations_refused += 1
                raise MetadataUnavailable("the cluster's metadata is unavailable")
            return None
        migration = self._migrations.get(client_id)
        if migration is not None:  # it comes back while its queue leaves: that first
            await asyncio.wait({migration}, timeout=self.settings.remote_enqueue_timeout)
        self._registering.setdefault(client_id, [])
        try:
            registration = await self.backend.register(client_id, clean, self.records.ts())
        except MetadataUnavailable as exc:
            self._registering.pop(client_id, None)
            self.records.unavailable(exc)
            if not self.settings.allow_register_during_outage:
                self.metrics.cluster_registrations_refused += 1
                raise
            return None
        except StaleRequest:
            self._registering.pop(client_id, None)
            raise
        # From now on the other nodes route this client's messages here, before its
        # session is: they wait with what the old node sends (see registered()).
        self.stand_in(client_id, registration.subscriptions)
        previous = registration.previous_node
        if previous is not None and previous != self.node:
            self.sessions.tracer.session_event(
                client_id, f"session taken over from node {previous}"
            )
            await self._take_from(previous, client_id, clean)
        return registration

    def stand_in(self, client_id: str, subscriptions: dict[str, SubOptions]) -> None:
        """The client being registered here has `subscriptions` (the registration's answer,
        or its record in the change stream, whichever comes first: the view drops the
        route to the old node as the record arrives, and what is published here from
        then on must not match nothing)."""
        early = self._registering.get(client_id)
        if early is None or not subscriptions or client_id in self._stand_ins:
            return
        stand_in = _Arrivals(client_id, early)
        filters = [f for f in subscriptions if not f.startswith(SHARE_PREFIX)]
        for topic_filter in filters:
            self.sessions.router.subscribe(stand_in, topic_filter, subscriptions[topic_filter])
        self._stand_ins[client_id] = (stand_in, filters)
        for message in self._unrouted:  # what came for it before the stand-in
            matching = [subscriptions[f] for f in filters if topic_matches(f, message.topic)]
            if matching:
                qos = min(message.qos, max(options.qos for options in matching))
                early.append(Delivery(message, qos, False))

    async def _take_from(self, node: str, client_id: str, clean: bool) -> None:
        link = self.cluster.links.get(node)
        if link is None or not link.up or link.peer_stopped:
            # (A stopping node would not release it either: its store keeps the queue
            # and hands it here at its next start.)
            state = "stopping" if link is not None and link.peer_stopped else "unreachable"
            log.info(
                "cluster: %s was on node %s, %s: taken without its queue", client_id, node, state
            )
            return
        try:
            error = await asyncio.wait_for(
                link.request(TAKEOVER, client_id, clean), self.settings.remote_enqueue_timeout
            )
        except (TimeoutError, ConnectionError) as exc:
            log.warning(
                "cluster: node %s did not release %s: %s", node, client_id, exc or "timeout"
            )
            return
        if error:
            log.warning("cluster: node %s could not release %s: %s", node, client_id, error)

    def registered(
        self, client_id: str, session: Session, registration: Registration | None, fresh: bool
    ) -> None:
        """The CONNECT's session exists here now: a session new on this node resumes the
        subscriptions the metadata kept; messages that came ahead of it are delivered."""
        early = self._registering.pop(client_id, [])
        self.forget_unrouted()
        stand_in, filters = self._stand_ins.pop(client_id, (None, []))
        for topic_filter in filters:
            self.sessions.router.unsubscribe(stand_in, topic_filter)
        owner = session.owner
        if registration is not None and fresh:
            for topic_filter, options in registration.subscriptions.items():
                owner.subscriptions[topic_filter] = options
                self.sessions.router.subscribe(owner, topic_filter, options)
            self.sessions.registry.save(owner)
        if registration is None or owner.subscriptions != registration.subscriptions:
            self.records.changed(client_id)  # the metadata learns what this node holds
        for delivery in early:
            owner.deliver(delivery)

    def hand_over(
        self, session: Session, node: str, clean: bool, released: Callable[[], None] = _nothing
    ) -> None:
        """Release a session `node` owns now: its connection closes (0x8E), it is
        forgotten here (then `released()`), and unless the new owner started clean its
        queue follows in the background."""
        client_id = session.subscriber_id
        if client_id in self._moving:
            return released()
        self._moving.add(client_id)  # what releasing it changes is not written
        try:
            leaving = self._let_go(session, clean, node)
        finally:
            self._moving.discard(client_id)
        released()
        follows = "; its queue follows" if leaving is not None else ""
        self.sessions.tracer.session_event(client_id, f"session handed to node {node}{follows}")
        if leaving is not None:
            task = self.cluster.spawn(
                self._migrate(node, leaving), f"cluster migrating {client_id}"
            )
            self._migrations[client_id] = task
            task.add_done_callback(lambda _: self._migrations.pop(client_id, None))

    def drop_ended(self, session: Session) -> None:
        """A session restored here that ended on another node while this one was away:
        forgotten with its queue and its stored state; nothing is written (the metadata
        says it is gone already, and a write would bring it back)."""
        client_id = session.subscriber_id
        self._moving.add(client_id)
        try:
            self._let_go(session, True, "")
        finally:
            self._moving.discard(client_id)
        log.info("cluster: %s ended on another node while this one was away: dropped", client_id)
        self.sessions.tracer.session_event(client_id, "session ended on another node: dropped")

    def _let_go(self, session: Session, clean: bool, node: str) -> Session | None:
        """Disconnect the session's connections and forget it here, without telling the
        metadata (it belongs to another node now). Returns the session if its queue is to
        follow (read by _migrate; the store keeps it meanwhile), else None.

        Other nodes learn where it went a little later, and frames they sent here before
        that are still on their way: for dead_after the session's subscriptions linger in
        the router as Forwarders, which send what other nodes forward here for it on to
        `node` (unless it started clean there)."""
        sessions = self.sessions
        owner = session.owner
        sessions.registry.disconnect(owner)
        # Nothing follows a clean session, or one the new connection starts clean.
        leaving = None if clean or owner.expiry == 0 or not owner.holds_messages() else owner
        if owner.pending_will is not None:  # resumed elsewhere: the delayed will is off
            owner.pending_will[0].cancel()
            owner.pending_will = None
        if owner.expiry_timer is not None:
            owner.expiry_timer.cancel()
            owner.expiry_timer = None
        lingering = []
        for topic_filter, options in list(owner.subscriptions.items()):
            sessions.router.unsubscribe(owner, topic_filter)
            if node and not clean and not topic_filter.startswith(SHARE_PREFIX):
                forwarder = Forwarder(self.cluster, node, owner.subscriber_id)
                sessions.router.subscribe(forwarder, topic_filter, options)
                lingering.append((forwarder, topic_filter))
        if lingering:
            self.loop.call_later(self.settings.dead_after, _unsubscribe, sessions.router, lingering)
        owner.subscriptions.clear()
        if leaving is None:
            sessions.store.delete_session(owner.subscriber_id)
        sessions.registry.forget(owner)
        return leaving

    async def _migrate(self, node: str, session: Session) -> None:
        """Send a released session's queue to its new node in acknowledged chunks of
        max_msgs_per_drain_step, read from memory and then from the store a chunk at a
        time (a queue of millions neither blocks the loop nor fills memory). Each chunk
        leaves the store once acknowledged, so a crash or a link that stays down leaves
        the rest in this node's store, handed over again at its next start."""
        client_id = session.subscriber_id
        step = self.sessions.settings.max_msgs_per_drain_step
        sent = 0
        while chunk := session.leaving_chunk(step):
            if not await self._send_chunk(node, client_id, chunk):
                break
            session.forget_sent(chunk)
            sent += len(chunk)
        else:
            if client_id not in self.sessions.registry:  # (it may be back already)
                self.sessions.store.delete_session(client_id)
            self.metrics.cluster_sessions_migrated += 1
            self.metrics.cluster_messages_migrated += sent
            log.info("cluster: %s moved to node %s with %d queued messages", client_id, node, sent)
            moved = f"queue moved to node {node}: {sent} messages"
            self.sessions.tracer.session_event(client_id, moved)
            return
        self.metrics.cluster_messages_migrated += sent
        self.sessions.tracer.session_event(
            client_id, f"queue migration to node {node} stopped after {sent} messages"
        )
        log.error(
            "cluster: %s: node %s took %d queued messages, then could not be reached; the "
            "rest wait in this node's store for its next start",
            client_id,
            node,
            sent,
        )

    async def _send_chunk(self, node: str, client_id: str, chunk: list[Delivery]) -> bool:
        """One chunk, acknowledged; tried again while the link is down but the node alive
        (for up to MIGRATION_CHUNK_TIMEOUT)."""
        now = self.loop.time()
        items = [
            [frames.pack_message(d.message, now), d.qos, d.retain, list(d.sub_ids)] for d in chunk
        ]
        deadline = now + MIGRATION_CHUNK_TIMEOUT
        while node not in self.cluster.dead and self.loop.time() < deadline:
            link = self.cluster.links.get(node)
            if link is None or not link.up:
                await asyncio.sleep(self.settings.liveness_interval)
                continue
            try:
                # The new node acknowledges a chunk once its session has taken it, as
                # fast as its client reads: a while for a slow one.
                error = await asyncio.wait_for(
                    link.request(ENQUEUE, client_id, items, None), deadline - self.loop.time()
                )
            except ConnectionError:
                continue  # the link went down: again once it is back
            except TimeoutError:
                return False
            return not error
        return False

    def on_takeover(
        self, inbound: ClusterServerProtocol, ref: int, client_id: str, clean: bool
    ) -> None:
        session = self.sessions.registry.get(client_id)
        if session is None or self.sessions.stopping:
            # Stopping: the session stays in this node's store, handed over at its next
            # start (_reconcile), rather than cut off halfway through a migration.
            inbound.reply(ACK, ref, None)
            return
        # The new node may answer CONNACK once the session is released here.
        self.hand_over(session, inbound.node, clean, lambda: inbound.reply(ACK, ref, None))

    def enqueue(
        self,
        client_id: str,
        items: list[Any],
        share: str | None,
        done: Callable[[str | None], object] | None,
    ) -> list[Any] | None:
        """Messages for one session here. A migrating queue's chunk (`done`) is fed to
        the session as fast as it takes it, then `done(error)`; single messages (a shared
        group's pick, a lingering subscription's) are delivered at once, and the sessions
        they filled are returned: the link waits for them, as for a PUBLISH."""
        answer = done or _ignore  # (single messages are answered by nobody)
        now = self.loop.time()
        deliveries = []
        group = self.sessions.router.group(share) if share is not None else None
        for fields, qos, retain, subscription_ids in items:
            message = frames.unpack_message(fields, now)
            deliveries.append(Delivery(message, qos, retain, tuple(subscription_ids), group))
        if done is not None:  # a chunk of a queue that follows its session here
            arrived = f"queue migration: {len(deliveries)} messages arrived"
            self.sessions.tracer.session_event(client_id, arrived)
        early = self._registering.get(client_id)
        if early is not None:
            early.extend(deliveries)
            answer(None)
            return None
        session = self.sessions.registry.get(client_id)
        if session is None:
            if group is not None:  # the member left: another member here, if any
                for delivery in deliveries:
                    self.sessions.routing.deliver_shared(group, delivery.message, "local_only")
                answer(None)
                return None
            self.metrics.cluster_enqueue_dropped += len(deliveries)
            answer(f"no session {client_id} on {self.node}")
            return None
        if done is not None:
            _Feeder(self.sessions.flow, session.owner, deliveries, done).run()
            return None
        congested = [full for d in deliveries if (full := session.owner.deliver(d)) is not None]
        return congested or None


def deliver_matching(session: Session, messages: Iterable[Message]) -> None:
    """Queue for `session` the messages its (non-shared) subscriptions match."""
    subscriptions = session.subscriptions
    filters = [f for f in subscriptions if not f.startswith(SHARE_PREFIX)]
    for message in messages:
        matching = [subscriptions[f] for f in filters if topic_matches(f, message.topic)]
        if matching:
            qos = min(message.qos, max(options.qos for options in matching))
            session.deliver(Delivery(message, qos, False))


class _Arrivals:
    """A session being registered here, in the router until it exists: the other nodes
    route its messages here from the moment the metadata says so, and what they send
    waits in the registration's early arrivals (delivered in order by registered())."""

    __slots__ = ("client_id", "early", "held", "stuck")

    local = True
    online = True

    def __init__(self, client_id: str, early: list[Delivery]) -> None:
        self.client_id = client_id
        self.early = early
        self.held = False
        self.stuck = False

    progress = 0

    def deliver(self, delivery: Delivery) -> None:
        self.early.append(delivery)

    def takes_run(self, level: int, longest: int) -> bool:
        return False  # kept message by message until registered

    def must_wait_for(self) -> None:
        return None

    def full(self) -> bool:
        return False

    def watched(self) -> tuple[()]:
        return ()


class _Feeder:
    """Hands deliveries to a session no faster than it takes them: a flow-control reader
    (broker/flow.py) held while the session's queue is at its high-water mark, so that a
    migrating queue never overflows the session it moves into."""

    __slots__ = ("deliveries", "done", "flow", "session")

    def __init__(
        self,
        flow: FlowControl,
        session: Session,
        deliveries: list[Delivery],
        done: Callable[[str | None], object],
    ) -> None:
        self.flow = flow
        self.session = session
        self.deliveries = deque(deliveries)
        self.done = done

    def run(self) -> None:
        deliveries = self.deliveries
        while deliveries:
            full = self.session.deliver(deliveries.popleft())
            if full is not None and deliveries:
                self.flow.hold(self, [full])
                return
        self.done(None)

    def hold(self) -> None:
        pass  # nothing to stop reading: run() stops by itself

    def release(self) -> None:
        self.run()
