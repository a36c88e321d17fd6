"""Sessions this node takes on without their client: a dead node's, and a leaving node's.

Reaping. The live node with the lowest name takes a dead node's sessions (liveness.py
says which are dead): clean ones are deleted, persistent ones become offline sessions
here. The reap's answer and the change stream announcing it come over different
connections, in either order: whichever arrives first adopts the session (MetadataSync.
subscriber_changed), so that no publish finds the dead node's route gone and no session
here in its place; forwarded messages that match no session meanwhile are kept for it
(Handover.unrouted), as during a registration. The QoS 1/2 messages this node had sent
the dead node and kept unacknowledged (streams.py) go to the sessions it reaped.

Taking. A node leaving the cluster hands each of its sessions to a member (TAKE,
departure.py), which registers it as a CONNECT would, without a client.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from broker.cluster.handover import deliver_matching
from broker.cluster.metadata import MetadataUnavailable, StaleRequest

if TYPE_CHECKING:
    from broker.cluster.handover import Handover, OwnerRecords
    from broker.cluster.metadata import MetadataBackend, Subscriber
    from broker.cluster.ports import NodeSessions
    from broker.cluster.streams import Streams
    from broker.cluster.view import RemoteView
    from broker.metrics import Metrics
    from broker.session import Session

log = logging.getLogger("nautilus.cluster")

REAP_BATCH = 100  # sessions taken from a dead node per call


class Successor(Protocol):
    """The Cluster (node.py), as it takes on the sessions of nodes that are gone."""

    node: str
    metrics: Metrics
    backend: MetadataBackend  # what the reaps take
    view: RemoteView  # who owns which session, as far as this node knows
    handover: Handover  # sessions registered here, and forwarded messages kept for them
    streams: Streams  # the QoS 1/2 messages kept for the dead node, for its sessions

    @property
    def sync(self) -> OwnerRecords:
        """The metadata (an outage during a reap)."""
        ...

    @property
    def dead(self) -> set[str]:
        """The nodes declared dead (liveness.py)."""
        ...


class Adoption:
    def __init__(self, cluster: Successor, sessions: NodeSessions) -> None:
        self.cluster = cluster
        self.sessions = sessions
        self._reaping: set[str] = set()  # dead nodes whose sessions are being taken

    @property
    def reaping(self) -> bool:
        """Whether this node is taking a dead node's sessions."""
        return bool(self._reaping)

    def reaping_from(self, node: str) -> bool:
        """Whether this node is taking the sessions of `node`."""
        return node in self._reaping

    async def reap(self, dead: str) -> None:
        """Take the dead node's sessions: persistent ones live on here, offline."""
        reaping = self._reaping
        if dead in reaping:
            return
        reaping.add(dead)
        cluster = self.cluster
        adopted: list[Session] = []
        try:
            while dead in cluster.dead:
                moved = await cluster.backend.reap(dead, REAP_BATCH)
                if moved is None:
                    log.info("cluster: node %s forgotten (its sessions reaped)", dead)
                    self._hand_kept(dead, adopted)
                    return
                if not moved:
                    return  # it came back
                for client_id, record in moved:
                    self.adopt(client_id, record)
                    cluster.metrics.cluster_sessions_reaped += 1
                    if (session := self.sessions.registry.get(client_id)) is not None:
                        adopted.append(session)
        except MetadataUnavailable as exc:
            cluster.sync.unavailable(exc)
        finally:
            reaping.discard(dead)
            cluster.handover.forget_unrouted()

    def _hand_kept(self, dead: str, adopted: list[Session]) -> None:
        """The QoS 1/2 messages this node kept for the dead node, unacknowledged
        (streams.py), are its reaped sessions' now: each takes those it subscribed to."""
        kept = self.cluster.streams.take_kept(dead)
        if kept:
            for session in adopted:
                deliver_matching(session, kept)
            log.info("cluster: %d messages kept for %s handed to its sessions", len(kept), dead)

    def adopt(self, client_id: str, record: Subscriber) -> None:
        """A persistent session this node now owns but does not hold: an offline one,
        with its subscriptions (its queue, if any, was on a node that is gone). Forwarded
        messages kept meanwhile (Handover.unrouted) that match it are queued for it."""
        if client_id in self.sessions.registry:
            return
        session = self._offline(client_id, record.subscriptions, None)
        self.cluster.handover.adopted(session)

    async def take(self, node: str, client_id: str, expiry: int | None) -> str | None:
        """`node` leaves the cluster and hands `client_id`'s session here (TAKE): it is
        registered as a CONNECT registers it, without a client (`node` releases it and
        its queue follows), and lives on here offline until its client comes back. Not
        if the metadata says the session is elsewhere now (its client came back there).
        The error, or None."""
        cluster = self.cluster
        record = cluster.view.records.get(client_id)
        if record is None or record.node != node:
            return None  # not that node's any more: nothing to take
        if cluster.handover.busy(client_id) or client_id in self.sessions.registry:
            return f"{client_id} is being registered on {cluster.node}"
        try:
            registration = await cluster.handover.register(client_id, False)
        except (MetadataUnavailable, StaleRequest) as exc:
            return str(exc)
        session = self._offline(client_id, {}, expiry)
        cluster.handover.registered(client_id, session, registration, True)
        return None

    def _offline(self, client_id: str, subscriptions: dict, expiry: int | None) -> Session:
        """A new offline session here, in the router, saved; it ends in `expiry` seconds
        (None: persistent_client_expiration) unless its client comes back."""
        sessions = self.sessions
        registry = sessions.registry
        session = registry.new_session(client_id)
        if expiry is None:
            expiry = sessions.settings.persistent_client_expiration or None
        session.expiry = expiry
        for topic_filter, options in subscriptions.items():
            session.subscriptions[topic_filter] = options
            sessions.router.subscribe(session, topic_filter, options)
        registry.save(session)
        registry.adopt(session, expiry)
        return session
