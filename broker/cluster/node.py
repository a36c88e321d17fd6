"""This node as one of a cluster: membership, the links, the routing view, sessions
moving between nodes, and the writes to the shared metadata.

Theory of operation (docs/clustering.md has the user's side):
- Membership. Every `liveness_interval` the node refreshes its entry in the metadata and
  reads everyone's; a node silent for `dead_after` is dead. There is a link to every live
  node; a dead node's link is closed (what it held is counted as dropped), and the live
  node with the lowest name reaps its sessions: clean ones are deleted, persistent ones
  become offline sessions here.
- Routing. Local sessions are in the router as usual; other nodes' subscribers are there
  through the RemoteView, fed by a full load at start and the metadata's change stream.
- Writes. A session's record (owner, clean, subscriptions) is written when it changes,
  by one writer task that batches every client changed since its last round into one
  pipeline, reading the state at write time (so a burst of changes costs one write).
- Sessions moving. A CONNECT registers the client id in the metadata first (Courier's
  remap); if another node owned it, that node is asked over the link to release it: it
  disconnects the old connection (MQTT 5: 0x8E), answers, and then sends the session's
  queue after it in chunks, each acknowledged, while the client is already connected
  here. A node that learns from the change stream that one of its clients is owned
  elsewhere (it was away when asked) releases it the same way.
- Outage. While the metadata cannot be reached, routing goes on from the local view;
  CONNECTs are refused with 0x88 (or allowed, `allow_register_during_outage`); when it
  returns, the node writes back its sessions and loads the whole state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from broker.cluster import frames
from broker.cluster.frames import ACK, ENQUEUE, PING, PONG, PUBLISH, TAKEOVER
from broker.cluster.link import ClusterServerProtocol, PeerLink
from broker.cluster.metadata import (
    MetadataBackend,
    MetadataUnavailable,
    NodeInfo,
    NotOwner,
    Registration,
    Resync,
    Snapshot,
    StaleRequest,
    Subscriber,
    Write,
)
from broker.cluster.remote import RemoteMember, RemoteNode
from broker.cluster.view import RemoteView
from broker.config import ClusterSettings, host_port
from broker.message import Delivery, Message

if TYPE_CHECKING:
    from broker.flow import FlowControl
    from broker.server import Broker
    from broker.session import Session

log = logging.getLogger("nautilus.cluster")

REAP_BATCH = 100  # sessions taken from a dead node per call
MIGRATION_CHUNK_TIMEOUT = 60.0  # seconds a migrating chunk may take to be acknowledged


def _nothing() -> None:
    pass


def _ignore(error: str | None) -> None:
    pass


class Cluster:
    def __init__(self, broker: Broker, settings: ClusterSettings, backend: MetadataBackend):
        self.broker = broker
        self.settings = settings
        self.backend = backend
        self.loop = broker.loop
        self.metrics = broker.metrics
        self.node = broker.settings.node_name  # [cluster] node_name lands there
        self.boot_id = uuid.uuid4().hex
        self.links: dict[str, PeerLink] = {}
        self.remote_nodes: dict[str, RemoteNode] = {}
        self._members: dict[tuple[str, str], RemoteMember] = {}
        self.view = RemoteView(
            broker.router, self.node, self.remote_node, self.remote_member, self._forget_member
        )
        self.nodes: dict[str, NodeInfo] = {}  # as of the last heartbeat
        self.dead: set[str] = set()
        self.available = False  # the metadata answers
        self.address: tuple[str, int] | None = None  # the cluster listener, bound
        self.inbound: set[ClusterServerProtocol] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self._dirty: dict[str, None] = {}  # client ids whose record must be written
        self._retained_dirty: dict[str, tuple[bytes | None, int]] = {}  # topic -> latest
        self._wake = asyncio.Event()
        self._registering: dict[str, list[Delivery]] = {}  # early arrivals, per client id
        self._moving: set[str] = set()  # client ids being handed to another node
        self._migrations: dict[str, asyncio.Task] = {}  # queues leaving, by client id
        self._last_ts = 0
        self._publish_cache: tuple[Message | None, bytes] = (None, b"")
        self._outage_logged = False
        self._reaping: set[str] = set()  # dead nodes whose sessions are being taken
        self._unconfirmed: set[str] = set()  # remote records a reload did not find
        self._last_seen: dict[str, float] = {}  # node -> loop time it was last alive
        self._failing_since: float | None = None  # the metadata's calls fail since

    # -- start and stop ----------------------------------------------------------------

    async def start(self) -> None:
        host, port = host_port(self.settings.address)
        self._server = await self.loop.create_server(
            lambda: ClusterServerProtocol(self), host, port, reuse_address=True
        )
        self.address = self._server.sockets[0].getsockname()[:2]
        advertise = self.settings.advertise or "{}:{}".format(*self.address)
        await self.backend.open(self.node, self.boot_id, advertise)
        await self._heartbeat()
        snapshot = await self.backend.snapshot()
        self._reconcile(snapshot)
        self.available = True
        log.info(
            "cluster node %s listening on %s:%s, %d other nodes alive",
            self.node,
            *self.address,
            len(self.nodes) - len(self.dead) - (self.node in self.nodes),
        )
        self.spawn(self._heartbeats(), "cluster heartbeat")
        self.spawn(self._follow(snapshot.seq), "cluster change stream")
        self.spawn(self._writer(), "cluster metadata writer")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if (self._dirty or self._retained_dirty) and self.available:  # the last changes
            with contextlib.suppress(MetadataUnavailable, asyncio.TimeoutError):
                await asyncio.wait_for(self._write_round(), 2.0)
        for task in list(self._tasks):
            task.cancel()
        for link in self.links.values():
            link.close()
        for inbound in list(self.inbound):
            if inbound.transport is not None:
                inbound.transport.abort()
        await self.backend.close()

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = self.loop.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cluster: %s failed", task.get_name(), exc_info=task.exception())

    def _ts(self) -> int:
        """A write's timestamp: wall-clock ns, never twice the same on this node."""
        self._last_ts = max(time.time_ns(), self._last_ts + 1)
        return self._last_ts

    # -- the router's view of other nodes ----------------------------------------------

    def remote_node(self, node: str) -> RemoteNode:
        remote = self.remote_nodes.get(node)
        if remote is None:
            remote = self.remote_nodes[node] = RemoteNode(self, node)
        return remote

    def remote_member(self, node: str, client_id: str) -> RemoteMember:
        member = self._members.get((node, client_id))
        if member is None:
            member = self._members[(node, client_id)] = RemoteMember(self, node, client_id)
        return member

    def _forget_member(self, node: str, client_id: str) -> None:
        self._members.pop((node, client_id), None)

    def publish_frame(self, message: Message) -> bytes:
        """The PUBLISH frame of `message`, built once however many nodes it goes to."""
        cached, frame = self._publish_cache
        if cached is not message:
            frame = frames.encode(PUBLISH, frames.pack_message(message, self.loop.time()))
            self._publish_cache = (message, frame)
        return frame

    # -- membership --------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.liveness_interval)
            try:
                await self._heartbeat()
            except MetadataUnavailable as exc:
                self._unavailable(exc)
                continue
            self._failing_since = None
            if not self.available:
                await self._recover()

    async def _heartbeat(self) -> None:
        infos = {info.name: info for info in await self.backend.heartbeat()}
        now = self.loop.time()
        dead_after = self.settings.dead_after
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
                    self.metrics.netsplit_resolved += 1
                    log.warning("cluster: node %s is back", info.name)
                self._ensure_link(info)
            elif info.name not in self.dead:
                self._declare_dead(info.name, f"silent for {info.age:.1f}s")
            if info.name in self.dead and alive and alive[0] == self.node:
                self.spawn(self._reap(info.name), f"cluster reaping {info.name}")

    def _declare_dead(self, name: str, why: str) -> None:
        self.dead.add(name)
        self.metrics.netsplit_detected += 1
        log.warning("cluster: node %s %s: dead", name, why)
        link = self.links.pop(name, None)
        if link is not None:
            link.close()  # what waited for it is counted as dropped

    def _ensure_link(self, info: NodeInfo) -> None:
        address = self.settings.peer_addresses.get(info.name) or info.address
        link = self.links.get(info.name)
        if link is not None and "{}:{}".format(*link.address) == address:
            return
        try:
            target = host_port(address)
        except ValueError:
            log.error("cluster: node %s advertises %r, not host:port", info.name, address)
            return
        if link is not None:
            link.close()
        self.links[info.name] = PeerLink(self, info.name, target)

    def link_up(self, link: PeerLink, restarted: bool) -> None:
        if restarted:
            log.info("cluster: node %s restarted", link.node)

    def link_down(self, link: PeerLink) -> None:
        remote = self.remote_nodes.get(link.node)
        if remote is not None and remote.held:
            self.broker.flow.release(remote)

    def inbound_up(self, inbound: ClusterServerProtocol, boot_id: str) -> None:
        self.inbound.add(inbound)

    def inbound_down(self, inbound: ClusterServerProtocol) -> None:
        self.inbound.discard(inbound)

    async def _reap(self, dead: str) -> None:
        """Take the dead node's sessions: persistent ones live on here, offline."""
        reaping = self._reaping
        if dead in reaping:
            return
        reaping.add(dead)
        try:
            while dead in self.dead:
                moved = await self.backend.reap(dead, REAP_BATCH)
                if moved is None:
                    log.info("cluster: node %s forgotten (its sessions reaped)", dead)
                    return
                if not moved:
                    return  # it came back
                for client_id, record in moved:
                    self._adopt(client_id, record)
                    self.metrics.cluster_sessions_reaped += 1
        except MetadataUnavailable as exc:
            self._unavailable(exc)
        finally:
            reaping.discard(dead)

    def _adopt(self, client_id: str, record: Subscriber) -> None:
        """A persistent session this node now owns but does not hold: an offline one,
        with its subscriptions (its queue, if any, was on a node that is gone)."""
        broker = self.broker
        if client_id in broker.registry.sessions:
            return
        session = broker.new_session(client_id)
        session.expiry = broker.settings.persistent_client_expiration or None
        for topic_filter, options in record.subscriptions.items():
            session.subscriptions[topic_filter] = options
            broker.router.subscribe(session, topic_filter, options)
        broker.save_session(session)
        broker.registry.adopt(session, session.expiry)

    # -- metadata: loading and following -----------------------------------------------

    def _reconcile(self, snapshot: Snapshot) -> None:
        """At start: the sessions this node restored from its store against the shared
        truth. Ours and unknown ones are (re)written; ones another node owns now are
        handed to it; ones the metadata says are ours but the store lost live on empty."""
        registry = self.broker.registry
        for client_id, session in list(registry.sessions.items()):
            record = snapshot.subscribers.get(client_id)
            if record is None or record.node == self.node:
                self.changed(client_id)
            else:
                self._hand_over(session, record.node, False)
        for client_id, record in snapshot.subscribers.items():
            if record.node == self.node and client_id not in registry.sessions:
                if record.clean:
                    self.changed(client_id)  # its connection is gone: delete it
                else:
                    self._adopt(client_id, record)
        self._load(snapshot)

    def _load(self, snapshot: Snapshot) -> None:
        self.view.load(snapshot.subscribers)
        for topic, packed in snapshot.retained.items():
            self._retained_changed(topic, packed)

    async def _follow(self, seq: int) -> None:
        while True:
            try:
                async for change in self.backend.changes(seq):
                    seq = change.seq
                    if change.topic:
                        self._retained_changed(change.topic, change.retained)
                    else:
                        self._subscriber_changed(change.client_id, change.subscriber)
            except Resync as exc:
                log.warning("cluster: reloading the metadata (%s)", exc)
            except MetadataUnavailable as exc:
                self._unavailable(exc)
                await asyncio.sleep(self.settings.liveness_interval)
            try:
                snapshot = await self.backend.snapshot()
            except MetadataUnavailable as exc:
                self._unavailable(exc)
                await asyncio.sleep(self.settings.liveness_interval)
                continue
            seq = snapshot.seq
            self._load_after_gap(snapshot)

    def _load_after_gap(self, snapshot: Snapshot) -> None:
        """Reload after changes were lost (an outage, a trimmed stream). The snapshot is
        merged, not taken as the whole truth: after Redis restarted empty the other nodes
        write their sessions back one by one, and a route dropped meanwhile would lose
        messages. What the snapshot lacks is dropped only if no change confirms it within
        dead_after. Retained messages are merged likewise; an empty Redis gets this
        node's back."""
        unconfirmed = set(self.view.records) - set(snapshot.subscribers)
        for client_id, record in snapshot.subscribers.items():
            self._subscriber_changed(client_id, record)
        for topic, packed in snapshot.retained.items():
            self._retained_changed(topic, packed)
        if not snapshot.retained:
            now = self.loop.time()
            for message in self.broker.retained.matching("#", now):
                self.retained(message)
        if unconfirmed:
            self._unconfirmed |= unconfirmed
            self.loop.call_later(self.settings.dead_after, self._drop_unconfirmed, unconfirmed)

    def _drop_unconfirmed(self, candidates: set[str]) -> None:
        for client_id in candidates & self._unconfirmed:
            self._unconfirmed.discard(client_id)
            self.view.apply(client_id, None)

    def _subscriber_changed(self, client_id: str, record: Subscriber | None) -> None:
        self._unconfirmed.discard(client_id)
        session = self.broker.registry.sessions.get(client_id)
        busy = client_id in self._moving or client_id in self._registering or self.broker.stopping
        if session is not None and not busy:
            if record is None:
                # Deleted by another node (this one was taken for dead and reaped) while
                # the session is here: it is ours, say so again.
                self.changed(client_id)
            elif record.node != self.node:
                # Another node registered it while this one was not asked (or did not
                # answer): release it here, its queue following if that node is reachable.
                self._hand_over(session, record.node, record.clean)
        self.view.apply(client_id, record)

    def _retained_changed(self, topic: str, packed: bytes | None) -> None:
        broker = self.broker
        if packed is None:
            broker.retained.update(Message(topic, b"", 0, True))
            broker.store.delete_retained(topic)
            return
        message = frames.unpack_message(frames.msgpack.unpackb(packed), self.loop.time())
        broker.retained.update(message)
        broker.store.put_retained(message)

    def retained(self, message: Message) -> None:
        """A retained message published on this node: the other nodes learn it through
        the metadata (written in the background, in publish order)."""
        packed = None
        if message.payload:
            packed = frames.msgpack.packb(frames.pack_message(message, self.loop.time()))
        self._retained_dirty[message.topic] = (packed, self._ts())
        self._wake.set()

    # -- metadata: writing ---------------------------------------------------------------

    def changed(self, client_id: str) -> None:
        """The session of `client_id` changed (subscriptions, clean, or it ended)."""
        if client_id in self._moving:
            return
        self._dirty[client_id] = None
        self._wake.set()

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.available:
                continue  # written when the metadata is back (_recover sets _wake)
            try:
                await self._write_round()
            except MetadataUnavailable as exc:
                self._unavailable(exc)

    async def _write_round(self) -> None:
        retained, self._retained_dirty = self._retained_dirty, {}
        if retained:
            try:
                await self.backend.retain([(t, m, ts) for t, (m, ts) in retained.items()])
            except MetadataUnavailable:
                for topic, change in retained.items():  # again when the metadata is back
                    self._retained_dirty.setdefault(topic, change)
                raise
        dirty, self._dirty = self._dirty, {}
        sessions = self.broker.registry.sessions
        writes = []
        for client_id in dirty:
            if client_id in self._moving:
                continue
            session = sessions.get(client_id)
            record = None
            if session is not None:
                record = Subscriber(self.node, session.expiry == 0, dict(session.subscriptions))
            writes.append(Write(client_id, record, self._ts()))
        if not writes:
            return
        try:
            results = await self.backend.write(writes)
        except MetadataUnavailable:
            for write in writes:  # again when the metadata is back
                self._dirty.setdefault(write.client_id, None)
            raise
        for write, result in zip(writes, results, strict=True):
            if isinstance(result, NotOwner) and write.subscriber is not None:
                log.info("cluster: %s is owned by another node now", write.client_id)
                session = sessions.get(write.client_id)
                record = self.view.records.get(write.client_id)
                if session is not None:  # its queue follows if the owner is known here
                    self._hand_over(session, record.node if record else "", record is None)
            elif isinstance(result, StaleRequest):
                self.changed(write.client_id)  # a clock went back: write it again

    # -- outage --------------------------------------------------------------------------

    def _unavailable(self, exc: Exception) -> None:
        """A call to the metadata failed. One failure may be a pooled connection that a
        restarted Redis closed (the next call takes a new one): the metadata is declared
        unavailable once calls fail for liveness_interval, with one log line."""
        now = self.loop.time()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since < self.settings.liveness_interval:
            self.loop.call_later(self.settings.liveness_interval, self._wake.set)  # retry
            return
        if self.available or not self._outage_logged:
            log.error("cluster: metadata unavailable: %s", exc)
            self._outage_logged = True
        self.available = False

    async def _recover(self) -> None:
        """The metadata answers again: write every local session back, then reload."""
        log.warning("cluster: metadata available again; resynchronising")
        self.available = True
        self._outage_logged = False
        for client_id in self.broker.registry.sessions:
            self._dirty[client_id] = None
        try:
            await self._write_round()
        except MetadataUnavailable as exc:
            self._unavailable(exc)
        # _follow notices on its own and reloads (its read failed or it finds a gap).

    # -- registering clients -----------------------------------------------------------

    async def register(self, client_id: str, clean: bool) -> Registration | None:
        """Make this node the owner of `client_id` before its CONNACK; another node that
        held it releases it first. None: the metadata is away and registrations are
        allowed anyway. Raises MetadataUnavailable (refuse with 0x88) or StaleRequest."""
        if not self.available:
            if not self.settings.allow_register_during_outage:
                self.metrics.cluster_registrations_refused += 1
                raise MetadataUnavailable("the cluster's metadata is unavailable")
            return None
        migration = self._migrations.get(client_id)
        if migration is not None:  # it comes back while its queue leaves: that first
            await asyncio.wait({migration}, timeout=self.settings.remote_enqueue_timeout)
        self._registering.setdefault(client_id, [])
        try:
            registration = await self.backend.register(client_id, clean, self._ts())
        except MetadataUnavailable as exc:
            self._registering.pop(client_id, None)
            self._unavailable(exc)
            if not self.settings.allow_register_during_outage:
                self.metrics.cluster_registrations_refused += 1
                raise
            return None
        except StaleRequest:
            self._registering.pop(client_id, None)
            raise
        previous = registration.previous_node
        if previous is not None and previous != self.node:
            await self._take_from(previous, client_id, clean)
        return registration

    async def _take_from(self, node: str, client_id: str, clean: bool) -> None:
        link = self.links.get(node)
        if link is None or not link.up:
            log.info(
                "cluster: %s was on node %s, unreachable: taken without its queue", client_id, node
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
        owner = session.owner
        if registration is not None and fresh:
            for topic_filter, options in registration.subscriptions.items():
                owner.subscriptions[topic_filter] = options
                self.broker.router.subscribe(owner, topic_filter, options)
            self.broker.save_session(owner)
        if registration is None or owner.subscriptions != registration.subscriptions:
            self.changed(client_id)  # the metadata learns what this node holds
        for delivery in early:
            owner.deliver(delivery)

    # -- releasing clients to other nodes ---------------------------------------------

    def _hand_over(
        self, session: Session, node: str, clean: bool, released: Callable[[], None] = _nothing
    ) -> None:
        """Release a session `node` owns now: its connection closes (0x8E), it is
        forgotten here (then `released()`), and unless the new owner started clean its
        queue follows in the background."""
        client_id = session.client_id
        if client_id in self._moving:
            return released()
        self._moving.add(client_id)  # what releasing it changes is not written
        try:
            leaving = self._release(session, clean)
        finally:
            self._moving.discard(client_id)
        released()
        if leaving is not None:
            task = self.spawn(self._migrate(node, leaving), f"cluster migrating {client_id}")
            self._migrations[client_id] = task
            task.add_done_callback(lambda _: self._migrations.pop(client_id, None))

    def _release(self, session: Session, clean: bool) -> Session | None:
        """Disconnect the session's connections and forget it here, without telling the
        metadata (it belongs to another node now). Returns the session if its queue is to
        follow (read by _migrate; the store keeps it meanwhile), else None."""
        broker = self.broker
        owner = session.owner
        for connection in list(broker.connections):
            if connection.session is not None and connection.session.owner is owner:
                connection.take_over()
        # Nothing follows a clean session, or one the new connection starts clean.
        leaving = None if clean or owner.expiry == 0 or not owner.holds_messages() else owner
        if owner.pending_will is not None:  # resumed elsewhere: the delayed will is off
            owner.pending_will[0].cancel()
            owner.pending_will = None
        if owner.expiry_timer is not None:
            owner.expiry_timer.cancel()
            owner.expiry_timer = None
        for topic_filter, _ in list(owner.subscriptions.items()):
            broker.router.unsubscribe(owner, topic_filter)
        owner.subscriptions.clear()
        if leaving is None:
            broker.store.delete_session(owner.client_id)
        if broker.registry.sessions.get(owner.client_id) is owner:
            del broker.registry.sessions[owner.client_id]
        return leaving

    async def _migrate(self, node: str, session: Session) -> None:
        """Send a released session's queue to its new node in acknowledged chunks of
        max_msgs_per_drain_step, read from memory and then from the store a chunk at a
        time (a queue of millions neither blocks the loop nor fills memory). Each chunk
        leaves the store once acknowledged, so a crash or a link that stays down leaves
        the rest in this node's store, handed over again at its next start."""
        client_id = session.client_id
        step = self.broker.settings.max_msgs_per_drain_step
        sent = 0
        while chunk := session.leaving_chunk(step):
            if not await self._send_chunk(node, client_id, chunk):
                break
            session.forget_sent(chunk)
            sent += len(chunk)
        else:
            if client_id not in self.broker.registry.sessions:  # (it may be back already)
                self.broker.store.delete_session(client_id)
            self.metrics.cluster_sessions_migrated += 1
            self.metrics.cluster_messages_migrated += sent
            log.info("cluster: %s moved to node %s with %d queued messages", client_id, node, sent)
            return
        self.metrics.cluster_messages_migrated += sent
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
        while node not in self.dead and self.loop.time() < deadline:
            link = self.links.get(node)
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

    # -- frames from other nodes -------------------------------------------------------

    def on_frame(self, inbound: ClusterServerProtocol, frame: list[Any]) -> None:
        kind = frame[0]
        if kind == PUBLISH:
            message = frames.unpack_message(frame[1], self.loop.time())
            congested = self.broker.publish_forwarded(message)
            if congested:  # the link waits for these subscribers, as a publisher would
                self.broker.flow.hold(inbound, congested)
        elif kind == ENQUEUE:
            _, ref, client_id, items, share = frame
            answer = functools.partial(inbound.reply, ACK, ref) if ref else _ignore
            self._enqueue(client_id, items, share, answer)
        elif kind == TAKEOVER:
            _, ref, client_id, clean = frame
            self._on_takeover(inbound, ref, client_id, clean)
        elif kind == PING:
            inbound.reply(PONG, frame[1])
        else:
            raise ValueError(f"unknown frame kind {kind}")

    def _on_takeover(
        self, inbound: ClusterServerProtocol, ref: int, client_id: str, clean: bool
    ) -> None:
        session = self.broker.registry.sessions.get(client_id)
        if session is None or self.broker.stopping:
            # Stopping: the session stays in this node's store, handed over at its next
            # start (_reconcile), rather than cut off halfway through a migration.
            inbound.reply(ACK, ref, None)
            return
        # The new node may answer CONNACK once the session is released here.
        self._hand_over(session, inbound.node, clean, lambda: inbound.reply(ACK, ref, None))

    def _enqueue(
        self,
        client_id: str,
        items: list[Any],
        share: str | None,
        done: Callable[[str | None], object],
    ) -> None:
        """Messages for one session here (a shared group's pick, or a migrating queue's
        chunk); `done(error)` once the session has taken them all."""
        now = self.loop.time()
        deliveries = []
        group = self.broker.router.group(share) if share is not None else None
        for fields, qos, retain, subscription_ids in items:
            message = frames.unpack_message(fields, now)
            deliveries.append(Delivery(message, qos, retain, tuple(subscription_ids), group))
        early = self._registering.get(client_id)
        if early is not None:
            early.extend(deliveries)
            done(None)
            return
        session = self.broker.registry.sessions.get(client_id)
        if session is None:
            if group is not None:  # the member left: another member here, if any
                for delivery in deliveries:
                    self.broker.deliver_shared(group, delivery.message, "local_only")
                done(None)
                return
            self.metrics.cluster_enqueue_dropped += len(deliveries)
            done(f"no session {client_id} on {self.node}")
            return
        _Feeder(self.broker.flow, session.owner, deliveries, done).run()

    # -- status ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What `nautilus cluster status` and the admin API show."""
        m = self.metrics
        matches = m.router_matches_local + m.router_matches_remote
        nodes = []
        for name in sorted(set(self.nodes) | {self.node}):
            info = self.nodes.get(name)
            link = self.links.get(name)
            nodes.append(
                {
                    "node": name,
                    "self": name == self.node,
                    "alive": name == self.node or name not in self.dead,
                    "address": info.address if info is not None else "",
                    "last_seen": round(info.age, 3) if info is not None else None,
                    "link": None if name == self.node else bool(link is not None and link.up),
                    "bytes_sent": link.bytes_sent if link is not None else 0,
                    "bytes_dropped": link.bytes_dropped if link is not None else 0,
                }
            )
        return {
            "node": self.node,
            "metadata": "available" if self.available else "unavailable",
            "nodes": nodes,
            "routing_score": {
                "local": m.router_matches_local,
                "remote": m.router_matches_remote,
                "local_share": round(m.router_matches_local / matches, 4) if matches else None,
            },
            "remote_subscribers": len(self.view.records),
        }


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
