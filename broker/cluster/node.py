"""This node as one of a cluster: membership, the links to the other nodes, other nodes
in the router, the frames that arrive from them, and the cluster's status. The metadata
is kept in step by MetadataSync (sync.py); sessions move between nodes by Handover
(handover.py).

Membership. Every `liveness_interval` the node refreshes its entry in the metadata and
reads everyone's; a node silent for `dead_after` is dead (one missing from the entries
ages on this node's clock). There is a link to every live node; a dead node's link is
closed (what it held is counted as dropped), and the live node with the lowest name
reaps its sessions: clean ones are deleted, persistent ones become offline sessions here.
The reap's answer and the change stream announcing it come over different connections,
in either order: whichever arrives first adopts the session (MetadataSync.
subscriber_changed), so that no publish finds the dead node's route gone and no session
here in its place; forwarded messages that match no session meanwhile are kept for it
(Handover.unrouted), as during a registration.

Routing. Local sessions are in the router as usual; other nodes' subscribers are there
through the RemoteView (view.py), fed by a full load at start and the change stream.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from broker.binding import BindError, claim
from broker.cluster import frames
from broker.cluster.departure import Departure
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
    SWC_CLOCK,
    SWC_FETCH,
    SWC_KEYS,
    SWC_WATERMARK,
    SWC_WRITE,
    TAKE,
    TAKEOVER,
)
from broker.cluster.handover import Handover
from broker.cluster.link import ClusterServerProtocol, PeerLink
from broker.cluster.metadata import (
    MetadataBackend,
    MetadataUnavailable,
    NodeInfo,
    Registration,
    StaleRequest,
    Subscriber,
)
from broker.cluster.remote import RemoteMember, RemoteNode
from broker.cluster.swc.backend import SwcBackend
from broker.cluster.swc.seeds import Seeds
from broker.cluster.swc.service import Replication
from broker.cluster.sync import MetadataSync
from broker.cluster.tracing import FRAMES as TRACE_FRAMES
from broker.cluster.tracing import ClusterTracing
from broker.cluster.view import RemoteView
from broker.config import ClusterSettings, host_port
from broker.episodes import Episode
from broker.message import Message
from broker.peers import Answer
from broker.trace.trace import TraceSpec
from hooks import Metric

if TYPE_CHECKING:
    from broker.cluster.host import Host
    from broker.session import Session

log = logging.getLogger("nautilus.cluster")

REAP_BATCH = 100  # sessions taken from a dead node per call
DRAIN_TIMEOUT = 2.0  # seconds a stopping node waits for a peer that does not answer
DRAIN_LIMIT = 30.0  # seconds a stopping node waits at most for its peers' DRAINED
LEAVE_TIMEOUT = 10.0  # seconds a member asked to leave has to say whether it does
# Seconds a node has to answer an admin request: one hung node is an error in the answer,
# not an operator's command that hangs (VerneMQ's RPC timeouts, vernemq issue 2167).
ADMIN_TIMEOUT = 3.0


class Cluster:
    def __init__(self, host: Host, settings: ClusterSettings, backend: MetadataBackend):
        self.host = host
        self.settings = settings
        self.backend = backend
        self.loop = host.loop
        self.metrics = host.metrics
        self.node = host.settings.node_name  # [cluster] node_name lands there
        self.boot_id = uuid.uuid4().hex
        self.links: dict[str, PeerLink] = {}
        self.remote_nodes: dict[str, RemoteNode] = {}
        self._members: dict[tuple[str, str], RemoteMember] = {}
        self.view = RemoteView(
            host.router, self.node, self.remote_node, self.remote_member, self._forget_member
        )
        self.nodes: dict[str, NodeInfo] = {}  # as of the last heartbeat
        self.dead: set[str] = set()
        self.address: tuple[str, int] | None = None  # the cluster listener, bound
        self.inbound: set[ClusterServerProtocol] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self._last_ts = 0
        self._publish_cache: tuple[Message | None, bytes] = (None, b"")
        self._reaping: set[str] = set()  # dead nodes whose sessions are being taken
        self._last_seen: dict[str, float] = {}  # node -> loop time it was last alive
        self._last_heartbeat = self.loop.time()  # of this node's last one that got through
        self.forwarding = False  # a PUBLISH from another node is being routed
        self._draining: dict[str, asyncio.Future[None]] = {}  # stopping: DRAINED awaited
        self.sync = MetadataSync(self)  # the metadata: loading, following, writing
        self.handover = Handover(self)  # sessions moving between nodes
        self.tracing = ClusterTracing(self)  # traces read on one node, followed on all
        # The leaderless metadata (metadata = "swc") replicates over this node's links.
        self.replicated = backend if isinstance(backend, SwcBackend) else None
        self.split = False  # (Peers) swc: a member cannot be reached
        self._unreachable: list[str] = []
        self._unanswered: dict[str, float] = {}  # member -> since when its link is not up
        self._split_episode = Episode(
            log, "requests refused in a netsplit", self.loop, interval=10.0, end_level=logging.INFO
        )
        self.departure: Departure | None = None  # swc: `nautilus cluster leave` of this node
        self._removed_said = False  # that this node was removed and cannot leave yet
        if self.replicated is not None:
            self.replicated.attach(LinkTransport(self), self.loop)
            self.departure = Departure(self, self.replicated)

    async def bind(self) -> None:
        host, port = host_port(self.settings.address)
        factory = functools.partial(ClusterServerProtocol, self)
        try:
            self._server = await claim(self.loop, factory, host, port, reuse_address=True)
        except OSError as exc:
            raise BindError(
                "cluster.address", self.settings.address, exc, "[cluster] address"
            ) from None
        self.address = self._server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        assert self._server is not None and self.address is not None  # bind() first
        await self._server.start_serving()
        advertise = self.settings.advertise or "{}:{}".format(*self.address)
        await self.backend.open(self.node, self.boot_id, advertise)
        if self.replicated is not None and self.settings.seeds:
            seeds = Seeds(self, self.replicated, self.settings.seeds, self.address)
            self.spawn(seeds.join(), "cluster join")
        await self._heartbeat()
        snapshot = await self.backend.snapshot()
        self.sync.reconcile(snapshot)
        self.sync.available = True
        log.info(
            "cluster node %s listening on %s:%s, %d other nodes alive",
            self.node,
            *self.address,
            len(self.nodes) - len(self.dead) - (self.node in self.nodes),
        )
        self.spawn(self._heartbeats(), "cluster heartbeat")
        self.spawn(self.sync.follow(snapshot.seq), "cluster change stream")
        self.spawn(self.sync.writer(), "cluster metadata writer")

    async def stop(self) -> None:
        """Leave without losing what other nodes already sent, or what this node sent
        them: each is told (LEAVING), after this node's last frames to it, and answers,
        after its own last frame, with DRAINED, keeping what comes after for this node's
        return; once every answer is read, the links close. A peer whose flow control
        holds this node's frames (a slow subscriber) is waited for while it answers
        (_drain_peers). The clients are gone by then: what arrives goes to offline
        sessions."""
        if self._server is not None:
            self._server.close()
        await self._drain_peers()
        await self.sync.flush()
        for task in list(self._tasks):
            task.cancel()
        for link in self.links.values():
            link.close(graceful=True)
        for inbound in list(self.inbound):
            if inbound.transport is not None:
                inbound.transport.abort()
        await self.backend.close()

    async def _drain_peers(self) -> None:
        """Send LEAVING to every peer and wait for each DRAINED. A peer reads LEAVING only
        after every frame this node sent before it, which this node has acknowledged to
        their publishers already, and its flow control may hold them while a slow
        subscriber there drains (until the subscriber is stuck, slow_subscriber_timeout):
        so a peer that still answers is waited for, up to DRAIN_LIMIT; one that does not
        (hung, blackholed, its link down) is given up after DRAIN_TIMEOUT."""
        links = {name: link for name, link in self.links.items() if link.up}
        if not links:
            return
        self._draining = {name: self.loop.create_future() for name in links}
        for link in links.values():
            link.send(frames.encode(LEAVING))
        waiting = dict(self._draining)
        started = self.loop.time()
        while waiting:
            await asyncio.wait(waiting.values(), timeout=DRAIN_TIMEOUT)
            late = self.loop.time() - started >= DRAIN_LIMIT
            for name in list(waiting):
                if waiting[name].done():
                    del waiting[name]
                elif late or not links[name].answering:
                    log.warning("cluster: node %s did not take this node's last frames", name)
                    del waiting[name]

    def drained(self, node: str) -> None:
        """DRAINED from `node`: every frame it sent this (stopping) node before is read."""
        drained = self._draining.get(node)
        if drained is not None and not drained.done():
            drained.set_result(None)

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = self.loop.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cluster: %s failed", task.get_name(), exc_info=task.exception())

    def ts(self) -> int:
        """A write's timestamp: wall-clock ns, never twice the same on this node."""
        self._last_ts = max(time.time_ns(), self._last_ts + 1)
        return self._last_ts

    # -- what the rest of the broker calls (broker/peers.py) -------------------------------

    @property
    def available(self) -> bool:
        """Whether the metadata answers (/health says so when it does not)."""
        return self.sync.available

    def problem(self) -> str | None:
        """The node is leaving the cluster, or the metadata does not answer (/health
        says so)."""
        if self.departure is not None and self.departure.started:
            return "leaving the cluster"
        if self.sync.available:
            return None
        refused = not self.settings.allow_register_during_outage
        return "the cluster's metadata is unavailable" + (
            " (new connections are refused)" if refused else ""
        )

    def changed(self, client_id: str) -> None:
        """The session of `client_id` changed (subscriptions, clean, or it ended)."""
        self.sync.changed(client_id)

    def unavailable(self, error: Exception) -> None:
        """A call to the metadata failed."""
        self.sync.unavailable(error)

    def retained(self, message: Message) -> None:
        """A retained message was published on this node."""
        self.sync.retained(message)

    def register(self, client_id: str, clean: bool) -> Coroutine[Any, Any, Registration | None]:
        """Before a CONNACK: see Handover.register."""
        if self.split and (why := self.refuses("register")) is not None:
            return _refused(why)
        return self.handover.register(client_id, clean)

    def refuses(self, action: str) -> str | None:
        if not self.split or getattr(self.settings, f"allow_{action}_during_netsplit"):
            return None
        self.metrics.netsplit_refused += 1
        why = f"netsplit: {', '.join(self._unreachable)} cannot be reached"
        self._split_episode.occurred(
            "cluster: a %s refused (%s; allow_%s_during_netsplit is off); while this lasts "
            "refusals are counted in netsplit_refused",
            action,
            why,
            action,
            reason=why,
        )
        return why

    def _check_split(self) -> None:
        """swc: the cluster is ready while every member's link answers (VerneMQ's
        check); a member whose link has not answered for dead_after makes it a netsplit,
        and the netsplit switches apply. (Run every liveness_interval, and as links come
        and go.)"""
        if self.replicated is None:
            return
        now = self.loop.time()
        members = self.replicated.members()
        since = self._unanswered
        for node in members:
            link = self.links.get(node)
            if node == self.node or (link is not None and link.answering):
                since.pop(node, None)
            else:  # a member just learned of, or a link just dropped, gets dead_after
                since.setdefault(node, now)
        for node in [node for node in since if node not in members]:
            del since[node]
        dead_after = self.settings.dead_after
        unreachable = sorted(node for node, t in since.items() if now - t >= dead_after)
        split = bool(unreachable)
        if split and not self.split:
            log.warning(
                "cluster: not ready: %s cannot be reached (netsplit)", ", ".join(unreachable)
            )
        elif self.split and not split:
            if self._split_episode.active:  # the total of what it refused, in the line
                self._split_episode.ended("cluster: ready again, every member reached")
            else:
                log.info("cluster: ready again, every member reached")
        self.split, self._unreachable = split, unreachable

    def registered(
        self, client_id: str, session: Session, registration: Registration | None, fresh: bool
    ) -> None:
        self.handover.registered(client_id, session, registration, fresh)

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

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.liveness_interval)
            try:
                await self._heartbeat()
            except MetadataUnavailable as exc:
                self.sync.unavailable(exc)
                continue
            self.sync.answered()
            if not self.sync.available:
                await self.sync.recover()

    async def _heartbeat(self) -> None:
        infos = {info.name: info for info in await self.backend.heartbeat()}
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
                    self.metrics.netsplit_resolved += 1
                    log.warning("cluster: node %s is back", info.name)
                self._ensure_link(info)
            elif info.name not in self.dead:
                self._declare_dead(info.name, f"silent for {info.age:.1f}s")
            if info.name in self.dead and alive and alive[0] == self.node:
                self.spawn(self._reap(info.name), f"cluster reaping {info.name}")
        self._check_split()
        self._check_removed()

    def _check_removed(self) -> None:
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

    def _declare_dead(self, name: str, why: str) -> None:
        self.dead.add(name)
        self.metrics.netsplit_detected += 1
        log.warning("cluster: node %s %s: dead", name, why)
        self.tracing.node_dead(name)
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
        if link is not None:  # it restarted elsewhere: what waits for it goes there
            link.retarget(target)
            return
        self.links[info.name] = PeerLink(self, info.name, target)

    def link_up(self, link: PeerLink, restarted: bool) -> None:
        if restarted:
            log.info("cluster: node %s restarted", link.node)
        self._check_split()
        self.tracing.link_up(link.node)
        if self.replicated is not None:  # it learns of this node at once (its record)
            link.send(frames.encode(SWC_WRITE, *self.replicated.replicas.introduction()))

    def link_down(self, link: PeerLink) -> None:
        self.release_publishers(link.node)
        self._check_split()

    def release_publishers(self, node: str) -> None:
        remote = self.remote_nodes.get(node)
        if remote is not None and remote.held:
            self.host.flow.release(remote)

    def inbound_up(self, inbound: ClusterServerProtocol) -> None:
        self.inbound.add(inbound)

    def inbound_down(self, inbound: ClusterServerProtocol) -> None:
        self.inbound.discard(inbound)

    @property
    def reaping(self) -> bool:
        """Whether this node is taking a dead node's sessions."""
        return bool(self._reaping)

    def reaping_from(self, node: str) -> bool:
        """Whether this node is taking the sessions of `node`."""
        return node in self._reaping

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
                    self.adopt(client_id, record)
                    self.metrics.cluster_sessions_reaped += 1
        except MetadataUnavailable as exc:
            self.sync.unavailable(exc)
        finally:
            reaping.discard(dead)
            self.handover.forget_unrouted()

    def adopt(self, client_id: str, record: Subscriber) -> None:
        """A persistent session this node now owns but does not hold: an offline one,
        with its subscriptions (its queue, if any, was on a node that is gone). Forwarded
        messages kept meanwhile (Handover.unrouted) that match it are queued for it."""
        if client_id in self.host.registry:
            return
        session = self._offline(client_id, record.subscriptions, None)
        self.handover.adopted(session)

    async def take(self, node: str, client_id: str, expiry: int | None) -> str | None:
        """`node` leaves the cluster and hands `client_id`'s session here (TAKE): it is
        registered as a CONNECT registers it, without a client (`node` releases it and
        its queue follows), and lives on here offline until its client comes back. Not
        if the metadata says the session is elsewhere now (its client came back there).
        The error, or None."""
        record = self.view.records.get(client_id)
        if record is None or record.node != node:
            return None  # not that node's any more: nothing to take
        if self.handover.busy(client_id) or client_id in self.host.registry:
            return f"{client_id} is being registered on {self.node}"
        try:
            registration = await self.handover.register(client_id, False)
        except (MetadataUnavailable, StaleRequest) as exc:
            return str(exc)
        session = self._offline(client_id, {}, expiry)
        self.handover.registered(client_id, session, registration, True)
        return None

    def _offline(self, client_id: str, subscriptions: dict, expiry: int | None) -> Session:
        """A new offline session here, in the router, saved; it ends in `expiry` seconds
        (None: persistent_client_expiration) unless its client comes back."""
        host = self.host
        registry = host.registry
        session = registry.new_session(client_id)
        if expiry is None:
            expiry = host.settings.persistent_client_expiration or None
        session.expiry = expiry
        for topic_filter, options in subscriptions.items():
            session.subscriptions[topic_filter] = options
            host.router.subscribe(session, topic_filter, options)
        registry.save(session)
        registry.adopt(session, expiry)
        return session

    async def _left(self, node: str, remove: bool) -> str | None:
        """LEFT: `node` is leaving the cluster. Pull every group from it (nothing it
        wrote is left only there); then, if `remove`, it is no longer a member. (One
        removed already is not pulled: what it wrote since is not wanted.)"""
        replicas = self._replication()
        if node not in self._swc().members():
            return None
        for group in range(len(replicas.groups)):
            if not await replicas.exchange(group, node):
                return f"group {group} could not be pulled from {node}"
        if remove and self.replicated is not None and node in self.replicated.members():
            self.replicated.remove(node)
            await replicas.durable()
            log.warning("cluster: node %s left the cluster", node)
        return None

    def _answer_later(
        self, inbound: ClusterServerProtocol, ref: int, work: Coroutine[Any, Any, Any]
    ) -> None:
        """Run a request that awaits; its result goes back as the ACK."""

        async def answer() -> None:
            inbound.reply(ACK, ref, await work)

        self.spawn(answer(), f"cluster request from {inbound.node}")

    def on_frame(self, inbound: ClusterServerProtocol, frame: list[Any]) -> None:
        kind = frame[0]
        if kind == PUBLISH:
            message = frames.unpack_message(frame[1], self.loop.time())
            self.forwarding = True  # Forwarders send it on (they ignore local publishes)
            try:
                congested = self.host.ingress.forwarded(message)
            finally:
                self.forwarding = False
            if self.handover.keeping and not any(
                route.subscriber.local for route in self.host.router.match(message.topic)
            ):
                self.handover.unrouted(message)
            if congested:  # the link waits for these subscribers, as a publisher would
                self.host.flow.hold(inbound, congested)
        elif kind == ENQUEUE:
            _, ref, client_id, items, share = frame
            answer = functools.partial(inbound.reply, ACK, ref) if ref else None
            congested = self.handover.enqueue(client_id, items, share, answer)
            if congested:
                self.host.flow.hold(inbound, congested)
        elif kind == TAKEOVER:
            _, ref, client_id, clean = frame
            self.handover.on_takeover(inbound, ref, client_id, clean)
        elif kind == PING:
            inbound.reply(PONG, frame[1])
        elif kind == SWC_WRITE:
            self._swc().on_write(inbound.node, frame[1], frame[2], frame[3])
        elif kind in (SWC_CLOCK, SWC_FETCH, SWC_WATERMARK, SWC_KEYS):
            inbound.reply(ANSWER, frame[1], self._swc().answer(inbound.node, kind, frame[2:]))
        elif kind == TAKE:
            _, ref, client_id, expiry = frame
            self._answer_later(inbound, ref, self.take(inbound.node, client_id, expiry))
        elif kind == LEFT:
            self._answer_later(inbound, frame[1], self._left(inbound.node, frame[2]))
        elif kind == LEAVE:  # another member runs `nautilus cluster leave` for this one
            try:
                inbound.reply(ANSWER, frame[1], [None, self._departure().start()])
            except ValueError as exc:
                inbound.reply(ANSWER, frame[1], [str(exc), ""])
        elif kind == LEAVING:  # that node stops: what it has not read yet waits here
            link = self.links.get(inbound.node)
            if link is not None:
                link.hold_until_back()
            else:  # (no link to it, so nothing of this node's is on its way there)
                inbound.reply(DRAINED)
        elif kind == DRAINED:
            self.drained(inbound.node)
        elif kind == ADMIN:
            inbound.reply(ANSWER, frame[1], self._admin_answer(inbound.node, frame[2], frame[3]))
        elif kind in TRACE_FRAMES:
            self.tracing.on_frame(inbound.node, frame)
        else:
            raise ValueError(f"unknown frame kind {kind}")

    def _admin_answer(self, node: str, command: str, arguments: dict[str, Any]) -> list[Any]:
        """[error or None, result] of an ADMIN request from `node`. Any failure is an
        answer: the asking operator is told, never left to time out."""
        try:
            return [None, self.host.admin_request(command, arguments)]
        except (ValueError, LookupError) as exc:
            return [str(exc), None]
        except Exception as exc:
            log.exception("cluster: admin request %r from %s failed", command, node)
            return [f"{type(exc).__name__}: {exc}", None]

    async def ask_others(
        self, command: str, arguments: dict[str, Any], nodes: Iterable[str] | None = None
    ) -> list[Answer]:
        """(Peers) An admin command on the other nodes alive (of `nodes`), at once; a
        dead one is said, not asked (what it would change, it does not)."""
        wanted = set(nodes) if nodes is not None else None
        others = [n for n in self.alive() if n != self.node and (wanted is None or n in wanted)]
        # (Those `cluster status` lists: a node forgotten after its reaping is not.)
        dead = [n for n in sorted(self.nodes) if n in self.dead and (wanted is None or n in wanted)]
        answers = await asyncio.gather(*(self._ask(node, command, arguments) for node in others))
        return [*answers, *(Answer(node, "declared dead: not asked", None) for node in dead)]

    async def _ask(self, node: str, command: str, arguments: dict[str, Any]) -> Answer:
        link = self.links.get(node)
        if link is None or not link.up:
            return Answer(node, f"no link to {node}", None)
        try:
            error, result = await asyncio.wait_for(
                link.request(ADMIN, command, arguments), ADMIN_TIMEOUT
            )
        except TimeoutError:
            return Answer(node, f"no answer within {ADMIN_TIMEOUT:g} s", None)
        except ConnectionError as exc:
            return Answer(node, str(exc), None)
        return Answer(node, error, result)

    def start_trace(self, trace_id: int, spec: TraceSpec) -> None:
        self.tracing.start(trace_id, spec)

    def stop_trace(self, trace_id: int) -> None:
        self.tracing.stop(trace_id)

    def stop_all_traces(self) -> None:
        self.tracing.stop_all()

    def join(self, address: str) -> str:
        """`nautilus cluster join ADDRESS` (metadata = "swc")."""
        replicated = self._replicated("join")
        try:
            host_port(address)
        except ValueError:
            raise ValueError(f"expected host:port, got {address!r}") from None
        if replicated.alone():  # nothing of its own to keep: copy the cluster's first
            replicated.replicas.unfound()
        seeds = Seeds(self, replicated, [address], self.address)
        self.spawn(seeds.join(), f"cluster join through {address}")
        return f"joining the cluster of {address}: `nautilus cluster show` lists the members"

    async def leave(self, node: str) -> str:
        """`nautilus cluster leave [NODE]` (metadata = "swc"). This node, or a member
        that answers, leaves with its sessions (departure.py); a member that cannot be
        reached is removed, and after dead_after the live node with the lowest name takes
        its sessions, without what was queued on it."""
        replicated = self._replicated("leave")
        node = node or self.node
        if node not in replicated.members():
            raise ValueError(f"{node} is not a member ({', '.join(sorted(replicated.members()))})")
        if node == self.node:
            return self._departure().start()
        link = self.links.get(node)
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
        after = self.settings.dead_after
        return (
            f"{node} removed (it cannot be reached): its sessions are taken by a live "
            f"member after {after}s, without what was queued on it"
        )

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

    def group_metrics(self) -> list[Metric]:
        if self.replicated is None:
            return []
        counters = ("exchanges", "exchange_failures")
        return [
            Metric(
                f"swc_group_{name}",
                value,
                "counter" if name in counters else "gauge",
                (("group", str(group)),),
            )
            for group, figures in enumerate(self.replicated.replicas.group_figures())
            for name, value in figures.items()
        ]

    def figures(self) -> dict[str, int]:
        return self.replicated.replicas.figures() if self.replicated is not None else {}

    def _swc(self) -> SwcBackend:
        if self.replicated is None:
            raise ValueError("replication frames, and this node's metadata is not swc")
        return self.replicated

    def _replication(self) -> Replication:
        return self._swc().replicas

    def alive(self) -> list[str]:
        """This node and the members not declared dead, sorted (the same list on every
        node once liveness has settled)."""
        return sorted({self.node, *(name for name in self.nodes if name not in self.dead)})

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
        if self.replicated is not None:  # swc: ready (no netsplit), and in sync
            replicas = self.replicated.replicas
            ages = [g["sync_age_seconds"] for g in replicas.group_figures()]
            metadata = "ready" if not self.split else "not ready (netsplit)"
            swc: dict[str, Any] | None = {
                "ready": not self.split,
                "unreachable": list(self._unreachable),
                "groups_synced": sum(r.synced for r in replicas.groups.replicas),
                "groups": len(replicas.groups),
                "oldest_exchange_s": max(ages) if ages else 0,
            }
        else:
            metadata = "available" if self.sync.available else "unavailable"
            swc = None
        departure = self.departure
        return {
            "node": self.node,
            "metadata": metadata,
            "leaving": departure.stage if departure is not None and departure.started else None,
            "swc": swc,
            "nodes": nodes,
            "routing_score": {
                "local": m.router_matches_local,
                "remote": m.router_matches_remote,
                "local_share": round(m.router_matches_local / matches, 4) if matches else None,
            },
            "remote_subscribers": len(self.view.records),
        }


class LinkTransport:
    """The leaderless metadata's transport (swc/service.Transport) over this node's
    links: requests go out on this node's link to the peer, answers come back on it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def linked(self) -> list[str]:
        return [node for node, link in self.cluster.links.items() if link.up]

    def send(self, node: str, *frame: Any) -> None:
        link = self.cluster.links.get(node)
        if link is not None and link.up:
            link.send(frames.encode(*frame))

    def request(self, node: str, *frame: Any) -> asyncio.Future[Any]:
        link = self.cluster.links.get(node)
        if link is None or not link.up:
            failed: asyncio.Future[Any] = self.cluster.loop.create_future()
            failed.set_exception(ConnectionError(f"no link to {node}"))
            return failed
        return link.request(*frame)


async def _refused(why: str) -> Registration | None:
    """A registration refused before it started (a netsplit): CONNACK 0x88."""
    raise MetadataUnavailable(why)
