"""This node as one of a cluster: the Cluster makes the parts, starts and stops them,
and is what the rest of the broker tells and asks (broker/peers.py's roles) and what the
links report to. Each part has one job:

- liveness.py: the heartbeat, which nodes are alive or dead, a link to each live one;
- adoption.py: sessions taken on without their client (a dead node's, reaped; a
  leaving node's, handed here);
- netsplit.py: whether every member can be reached (swc), and what a netsplit refuses;
- incoming.py: the frames that arrive from other nodes, each to the part it is for;
- streams.py: QoS 1/2 messages between nodes at least once (numbered, kept until the
  other node has queued them, sent again, duplicates dropped);
- losses.py: what only memory holds, which a node's crash loses, counted on a survivor;
- operations.py: admin commands across the cluster; tracing.py: traces across it;
- membership.py: members joining and leaving; departure.py: this node leaving;
- status.py: `nautilus cluster status`, /health's problem, the figures;
- sync.py: the metadata kept in step; handover.py: sessions moving between nodes;
- view.py, remote.py: other nodes' subscribers in this node's router (local sessions
  are in it as usual; other nodes' come through the RemoteView, fed by a full load at
  start and the change stream).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from broker.binding import BindError, claim
from broker.cluster import frames
from broker.cluster.adoption import Adoption
from broker.cluster.channel_tls import ChannelTls
from broker.cluster.departure import Departure
from broker.cluster.frames import LEAVING, SWC_WRITE
from broker.cluster.handover import Handover
from broker.cluster.incoming import IncomingFrames
from broker.cluster.link import HANDSHAKE_TIMEOUT, ClusterServerProtocol, PeerLink
from broker.cluster.liveness import Liveness
from broker.cluster.losses import Census, Losses
from broker.cluster.membership import Membership
from broker.cluster.metadata import MetadataBackend, MetadataUnavailable, Registration
from broker.cluster.netsplit import Netsplit
from broker.cluster.operations import RemoteOperations
from broker.cluster.remote import RemoteMember, RemoteNode
from broker.cluster.status import StatusReport
from broker.cluster.streams import Streams
from broker.cluster.swc.backend import SwcBackend
from broker.cluster.swc.seeds import Seeds
from broker.cluster.sync import MetadataSync
from broker.cluster.tracing import ClusterTracing
from broker.cluster.view import RemoteView
from broker.config import ClusterSettings, host_port
from broker.message import Message

if TYPE_CHECKING:
    from broker.cluster.ports import NodePorts
    from broker.peers import Answer
    from broker.session import Session
    from broker.trace_spec import TraceSpec
    from hooks import Metric

log = logging.getLogger("nautilus.cluster")

DRAIN_TIMEOUT = 2.0  # seconds a stopping node waits for a peer that does not answer
DRAIN_LIMIT = 30.0  # seconds a stopping node waits at most for its peers' DRAINED


class Cluster:
    def __init__(self, ports: NodePorts, settings: ClusterSettings, backend: MetadataBackend):
        self.settings = settings
        self.backend = backend
        self.ports = ports  # the node this one is, role by role
        self.loop = ports.loop
        self.metrics = ports.metrics
        self.node = ports.settings.node_name  # [cluster] node_name lands there
        self.boot_id = uuid.uuid4().hex
        # The links' TLS, if [cluster] tls_certfile is set (ConfigError: a file will not load).
        self.tls = ChannelTls(settings) if settings.tls_certfile else None
        self.links: dict[str, PeerLink] = {}
        self.remote_nodes: dict[str, RemoteNode] = {}
        self._members: dict[tuple[str, str], RemoteMember] = {}
        self.view = RemoteView(
            ports.routing.router,
            self.node,
            self.remote_node,
            self.remote_member,
            self._forget_member,
        )
        self.address: tuple[str, int] | None = None  # the cluster listener, bound
        self.inbound: set[ClusterServerProtocol] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self.streams = Streams(self, ports.sessions.store)  # QoS 1/2 at least once
        # What a crash would lose here, and what other nodes' crashes lost.
        self.census = Census(ports.sessions.registry, settings.liveness_interval)
        self.losses = Losses(self)
        self.forwarding = False  # a PUBLISH from another node is being routed
        self._draining: dict[str, asyncio.Future[None]] = {}  # stopping: DRAINED awaited
        # The leaderless metadata (metadata = "swc") replicates over this node's links.
        self.replicated = backend if isinstance(backend, SwcBackend) else None
        self.split = False  # (NetsplitSwitches) swc: a member cannot be reached (netsplit.py)
        self.sync = MetadataSync(self, ports.mirrored)  # the metadata: loading, following, writing
        self.handover = Handover(self, self.sync, ports.sessions)  # sessions moving between nodes
        self.adoption = Adoption(self, ports.sessions)  # sessions of nodes that are gone
        self.tracing = ClusterTracing(self.links, ports.traced)  # traces followed on all nodes
        self.liveness = Liveness(self, self.sync, self.tracing, self.adoption)
        self.netsplit = Netsplit(self, self.replicated)
        self.departure: Departure | None = None  # swc: `nautilus cluster leave` of this node
        self.seeds: Seeds | None = None  # swc: joining (or starting) the cluster at start
        if self.replicated is not None:
            self.replicated.attach(LinkTransport(self), self.loop)
            self.departure = Departure(self, self.replicated, ports.exit)
        self.membership = Membership(self, self.replicated, self.departure)
        self.operations = RemoteOperations(self.node, self.links, self.liveness, ports.admin)
        self.report = StatusReport(self, self.netsplit, self.departure, self.census)
        self.incoming = IncomingFrames(self, ports.routing, self.streams)

    async def bind(self) -> None:
        """Claim the cluster listener's address, not accepting yet (BindError: it cannot
        be had): start-up binds every address before it starts anything."""
        host, port = host_port(self.settings.address)
        link = functools.partial(ClusterServerProtocol, self, self.census)
        factory: Callable[[], asyncio.Protocol] = link
        if self.tls is not None:  # TLS first, then the link
            factory = functools.partial(self.tls.accepting, link, self.loop, HANDSHAKE_TIMEOUT)
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
            self.seeds = Seeds(self, self.replicated, self.settings.seeds, self.address)
            self.spawn(self.seeds.join(), "cluster join")
            self.spawn(self.seeds.report(), "cluster readiness report")
        await self.liveness.heartbeat()
        snapshot = await self.backend.snapshot()
        self.sync.reconcile(snapshot)
        self.sync.available = True
        log.info(
            "cluster node %s listening on %s:%s, %d other nodes alive",
            self.node,
            *self.address,
            self.liveness.others_alive(),
        )
        self.spawn(self.liveness.run(), "cluster heartbeat")
        self.spawn(self.census.run(), "cluster census of what only memory holds")
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
        if self.replicated is not None and not (self.departure and self.departure.started):
            await self.replicated.stopping()  # (a node leaving for good is no member)
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

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = self.loop.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("cluster: %s failed", task.get_name(), exc_info=task.exception())

    # -- what the parts ask of it ----------------------------------------------------------

    @property
    def dead(self) -> set[str]:
        """The nodes declared dead."""
        return self.liveness.dead

    @property
    def reaping(self) -> bool:
        """Whether this node is taking a dead node's sessions."""
        return self.adoption.reaping

    def link_to(self, node: str, address: tuple[str, int]) -> None:
        self.links[node] = PeerLink(self, node, address, self.tls, self.streams.acknowledged)

    def after_heartbeat(self) -> None:
        self.netsplit.check()
        self.membership.check_removed()

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

    # -- what the links report (link.py) ---------------------------------------------------

    def link_up(self, link: PeerLink, restarted: bool, lost: int | None) -> None:
        if restarted:
            log.info("cluster: node %s restarted", link.node)
        if lost is not None:
            self.losses.gone_without_leaving(link.node, lost, "restarted")
        self.streams.link_up(link)
        self.netsplit.check()
        self.tracing.link_up(link.node)
        if self.replicated is not None:  # it learns of this node at once (its record)
            link.send(frames.encode(SWC_WRITE, *self.replicated.replicas.introduction()))

    def link_down(self, link: PeerLink) -> None:
        self.release_publishers(link.node)
        self.netsplit.check()

    def release_publishers(self, node: str) -> None:
        self.streams.pump(node)  # (the link has room: what it refused goes first)
        remote = self.remote_nodes.get(node)
        if remote is not None and remote.held:
            self.ports.routing.flow.release(remote)

    def drained(self, node: str) -> None:
        """DRAINED from `node`: every frame it sent this (stopping) node before is read."""
        drained = self._draining.get(node)
        if drained is not None and not drained.done():
            drained.set_result(None)

    @property
    def stopping(self) -> bool:
        return self.ports.sessions.stopping

    def on_frame(self, inbound: ClusterServerProtocol, frame: list[Any]) -> None:
        self.incoming.on_frame(inbound, frame)

    def inbound_up(self, inbound: ClusterServerProtocol) -> None:
        self.inbound.add(inbound)

    def inbound_down(self, inbound: ClusterServerProtocol) -> None:
        self.inbound.discard(inbound)

    def publisher_gone(self, inbound: ClusterServerProtocol) -> None:
        self.ports.routing.flow.forget_publisher(inbound)

    # -- what the rest of the broker tells and asks (broker/peers.py) ----------------------

    def register(self, client_id: str, clean: bool) -> Coroutine[Any, Any, Registration | None]:
        """Before a CONNACK: see Handover.register."""
        if self.split and (why := self.refuses("register")) is not None:
            return _refused(why)
        return self.handover.register(client_id, clean)

    def registered(
        self, client_id: str, session: Session, registration: Registration | None, fresh: bool
    ) -> None:
        self.handover.registered(client_id, session, registration, fresh)

    def refuses(self, action: str) -> str | None:
        return self.netsplit.refuses(action)

    def changed(self, client_id: str) -> None:
        """The session of `client_id` changed (subscriptions, clean, or it ended)."""
        self.sync.changed(client_id)

    def retained(self, message: Message) -> None:
        """A retained message was published on this node."""
        self.sync.retained(message)

    def alive(self) -> list[str]:
        return self.liveness.alive()

    def problem(self) -> str | None:
        return self.report.problem()

    def status(self) -> dict[str, Any]:
        return self.report.status()

    def figures(self) -> dict[str, int]:
        return self.report.figures()

    def group_metrics(self) -> list[Metric]:
        return self.report.group_metrics()

    def join(self, address: str) -> str:
        return self.membership.join(address)

    async def leave(self, node: str) -> str:
        return await self.membership.leave(node)

    async def ask_others(
        self, command: str, arguments: dict[str, Any], nodes: Iterable[str] | None = None
    ) -> list[Answer]:
        return await self.operations.ask_others(command, arguments, nodes)

    def start_trace(self, trace_id: int, spec: TraceSpec) -> None:
        self.tracing.start(trace_id, spec)

    def stop_trace(self, trace_id: int) -> None:
        self.tracing.stop(trace_id)

    def stop_all_traces(self) -> None:
        self.tracing.stop_all()


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
