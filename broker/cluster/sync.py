"""The cluster's metadata as this node keeps in step with it: the full load at start
(reconciled with the sessions this node restored), the change stream feeding the routing
view and retained messages, the writer of this node's session records, and what an
outage of the metadata does.

- Writes. A session's record (owner, clean, subscriptions) is written when it changes,
  by one writer task that batches every client changed since its last round into one
  pipeline, reading the state at write time (so a burst of changes costs one write).
  Retained messages published here go the same way, the latest per topic.
- Outage. While the metadata cannot be reached, routing goes on from the local view;
  CONNECTs are refused with 0x88 (or allowed, `allow_register_during_outage`); when it
  returns, the node writes back its sessions and loads the whole state again, merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster import frames
from broker.cluster.metadata import (
    MetadataUnavailable,
    NotOwner,
    Resync,
    Snapshot,
    StaleRequest,
    Subscriber,
    Write,
)
from broker.message import Message

if TYPE_CHECKING:
    from broker.cluster.adoption import Adoption
    from broker.cluster.handover import Handover
    from broker.cluster.metadata import MetadataBackend
    from broker.cluster.ports import MirroredState
    from broker.cluster.view import RemoteView
    from broker.config import ClusterSettings
    from broker.session import Session

log = logging.getLogger("nautilus.cluster")


class SyncedNode(Protocol):
    """The Cluster (node.py), as its metadata is kept in step."""

    node: str
    backend: MetadataBackend
    settings: ClusterSettings
    loop: asyncio.AbstractEventLoop
    view: RemoteView  # other nodes' subscribers in the router
    handover: Handover  # sessions moving: records of those are not written meanwhile
    adoption: Adoption  # sessions that a reap or the metadata say are this node's now

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...


class MetadataSync:
    def __init__(self, cluster: SyncedNode, mirrored: MirroredState) -> None:
        self.cluster = cluster
        self.mirrored = mirrored  # this node's sessions and retained messages
        self.backend = cluster.backend
        self.settings = cluster.settings
        self.loop = cluster.loop
        self.node = cluster.node
        self.view = cluster.view
        self.available = False  # the metadata answers
        self._dirty: dict[str, None] = {}  # client ids whose record must be written
        self._retained_dirty: dict[str, tuple[bytes | None, int]] = {}  # topic -> latest
        self._wake = asyncio.Event()
        self._unconfirmed: set[str] = set()  # remote records a reload did not find
        self._failing_since: float | None = None  # the metadata's calls fail since
        self._outage_logged = False
        self._last_ts = 0

    def ts(self) -> int:
        """A write's timestamp: wall-clock ns, never twice the same on this node."""
        self._last_ts = max(time.time_ns(), self._last_ts + 1)
        return self._last_ts

    def answered(self) -> None:
        """A call to the metadata succeeded (the heartbeat's)."""
        self._failing_since = None

    async def flush(self) -> None:
        """At stop: the last changes reach the metadata, if it answers soon."""
        if (self._dirty or self._retained_dirty) and self.available:
            with contextlib.suppress(MetadataUnavailable, asyncio.TimeoutError):
                await asyncio.wait_for(self._write_round(), 2.0)

    def reconcile(self, snapshot: Snapshot) -> None:
        """At start: the sessions this node restored from its store against the shared
        truth. Unknown ones are written, and ours whose record the store has outrun (a
        crash before the writer's round); ones another node owns now are handed to it;
        ones the metadata says are ours but the store lost live on empty.

        A record that says ours and matches is not written again: with the leaderless
        metadata it is this node's own copy, stale until the exchanges catch up, and a
        write now would be newer than the registration another node made while this one
        was away, taking the session back from there (its client disconnected, 0x8E).
        The exchanges bring that registration, and subscriber_changed hands the session
        over with what this node had queued for it."""
        registry = self.mirrored.registry
        for client_id, session in list(registry.items()):
            record = snapshot.subscribers.get(client_id)
            if record is None or (record.node == self.node and not _describes(record, session)):
                self.changed(client_id)
            elif record.node != self.node:
                self.cluster.handover.hand_over(session, record.node, False)
        for client_id, record in snapshot.subscribers.items():
            if record.node == self.node and client_id not in registry:
                if record.clean:
                    self.changed(client_id)  # its connection is gone: delete it
                else:
                    self.cluster.adoption.adopt(client_id, record)
        self._load(snapshot)

    def _load(self, snapshot: Snapshot) -> None:
        self.view.load(snapshot.subscribers)
        for topic, packed in snapshot.retained.items():
            self._retained_changed(topic, packed)

    async def follow(self, seq: int) -> None:
        while True:
            try:
                async for change in self.backend.changes(seq):
                    seq = change.seq
                    if change.topic:
                        self._retained_changed(change.topic, change.retained)
                    else:
                        self.subscriber_changed(change.client_id, change.subscriber)
            except Resync as exc:
                log.warning("cluster: reloading the metadata (%s)", exc)
            except MetadataUnavailable as exc:
                self.unavailable(exc)
                await asyncio.sleep(self.settings.liveness_interval)
            try:
                snapshot = await self.backend.snapshot()
            except MetadataUnavailable as exc:
                self.unavailable(exc)
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
            self.subscriber_changed(client_id, record)
        for topic, packed in snapshot.retained.items():
            self._retained_changed(topic, packed)
        if not snapshot.retained:
            now = self.loop.time()
            for message in self.mirrored.retained.matching("#", now):
                self.retained(message)
        if unconfirmed:
            self._unconfirmed |= unconfirmed
            self.cluster.spawn(self._drop_unconfirmed(unconfirmed), "cluster reload check")

    async def _drop_unconfirmed(self, candidates: set[str]) -> None:
        """dead_after later, what the reload lacked and no change has confirmed since is
        looked up again: what the metadata still lacks then is gone."""
        await asyncio.sleep(self.settings.dead_after)
        while True:
            try:
                records = await self.backend.subscribers()
                break
            except MetadataUnavailable as exc:
                self.unavailable(exc)
                await asyncio.sleep(self.settings.liveness_interval)
        for client_id in candidates & self._unconfirmed:
            self._unconfirmed.discard(client_id)
            self.view.apply(client_id, records.get(client_id))

    def subscriber_changed(self, client_id: str, record: Subscriber | None) -> None:
        self._unconfirmed.discard(client_id)
        session = self.mirrored.registry.get(client_id)
        busy = self.cluster.handover.busy(client_id) or self.mirrored.stopping
        if session is not None and not busy:
            if record is None and session.online:
                # Deleted by another node (this one was taken for dead and reaped) while
                # its client is here: it is ours, say so again.
                self.changed(client_id)
            elif record is None:
                # Ended on another node while this one was away (moved there, then ended):
                # what this node restored of it is stale, and ends here too.
                self.cluster.handover.drop_ended(session)
            elif record.node != self.node:
                # Another node registered it while this one was not asked (or did not
                # answer): release it here, its queue following if that node is reachable.
                self.cluster.handover.hand_over(session, record.node, record.clean)
        elif session is None and not busy and record is not None and record.node == self.node:
            old = self.view.records.get(client_id)
            if (
                old is not None
                and not record.clean
                and self.cluster.adoption.reaping_from(old.node)
            ):
                # This node's reaping moved it here, and the change came before the reap's
                # answer: adopt it now, before its route to the dead node goes (the reap's
                # own adopt then finds it here). Else what is published until the answer
                # arrives would match neither.
                self.cluster.adoption.adopt(client_id, record)
        if record is not None and record.node == self.node:
            # This node's own registration, here before its answer: from now on the view
            # routes the client here, where its stand-in takes what is published for it.
            self.cluster.handover.stand_in(client_id, record.subscriptions)
        self.view.apply(client_id, record)

    def _retained_changed(self, topic: str, packed: bytes | None) -> None:
        mirrored = self.mirrored
        if packed is None:
            mirrored.retained.update(Message(topic, b"", 0, True))
            mirrored.store.delete_retained(topic)
            return
        message = frames.unpack_message(frames.msgpack.unpackb(packed), self.loop.time())
        mirrored.retained.update(message)
        mirrored.store.put_retained(message)

    def retained(self, message: Message) -> None:
        """A retained message published on this node: the other nodes learn it through
        the metadata (written in the background, in publish order)."""
        packed = None
        if message.payload:
            packed = frames.msgpack.packb(frames.pack_message(message, self.loop.time()))
        self._retained_dirty[message.topic] = (packed, self.ts())
        self._wake.set()

    def changed(self, client_id: str) -> None:
        """The session of `client_id` changed (subscriptions, clean, or it ended)."""
        if self.cluster.handover.moving(client_id):
            return
        self._dirty[client_id] = None
        self._wake.set()

    async def writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.available:
                continue  # written when the metadata is back (_recover sets _wake)
            try:
                await self._write_round()
            except MetadataUnavailable as exc:
                self.unavailable(exc)

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
        sessions = self.mirrored.registry
        writes = []
        for client_id in dirty:
            if self.cluster.handover.moving(client_id):
                continue
            session = sessions.get(client_id)
            record = None
            if session is not None:
                record = Subscriber(self.node, session.expiry == 0, dict(session.subscriptions))
            writes.append(Write(client_id, record, self.ts()))
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
                    self.cluster.handover.hand_over(
                        session, record.node if record else "", record is None
                    )
            elif isinstance(result, StaleRequest):
                self.changed(write.client_id)  # a clock went back: write it again

    def unavailable(self, exc: Exception) -> None:
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

    async def recover(self) -> None:
        """The metadata answers again: write every local session back, then reload."""
        log.warning("cluster: metadata available again; resynchronising")
        self.available = True
        self._outage_logged = False
        for client_id in self.mirrored.registry:
            self._dirty[client_id] = None
        try:
            await self._write_round()
        except MetadataUnavailable as exc:
            self.unavailable(exc)
        # _follow notices on its own and reloads (its read failed or it finds a gap).


def _describes(record: Subscriber, session: Session) -> bool:
    """Whether the metadata's record says what `session` holds (as the writer writes it)."""
    return record.clean == (session.expiry == 0) and record.subscriptions == session.subscriptions
