"""Replication: this node's replicas of every group, kept in step with the other nodes.

The sans-I/O replicas (replica.py) get their I/O here, over a `Transport` (the cluster
channel: broker/cluster/node.py provides it):

- a write (`put`, `delete`) is saved, then broadcast best effort to every linked peer
  (`SWC_WRITE`), unless `enable_broadcast` is off; the writes of one loop turn share one
  commit (`durable()` waits for it), and so do those of the turns that come less than
  COMMIT_WINDOW after the last commit;
- every `sync_interval` plus a random leeway of up to half of it, each group pulls from
  one random linked peer (`SWC_CLOCK`, `SWC_FETCH` in batches of `exchange_batch_size`
  dots, `SWC_WATERMARK`), one exchange per group at a time;
- every `gc_interval` each group forgets what every peer holds (tombstones included);
- what changed is saved to LevelDB in one write batch per loop turn, and that batch is
  written before any frame leaves this node or any write is acknowledged: a dot or a
  clock that another node saw is never lost by a crash here, so never made again.

What a read sees changing (a key set, changed or gone, here or from a peer) is told to
`on_change(key, value or None)`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgpack
import plyvel

from broker.cluster.frames import SWC_CLOCK, SWC_FETCH, SWC_KEYS, SWC_WATERMARK, SWC_WRITE
from broker.cluster.swc import storage, wire
from broker.cluster.swc.clock import Dot, NodeClock
from broker.cluster.swc.exchange import pull
from broker.cluster.swc.groups import Groups, Shipped, latest
from broker.cluster.swc.replica import Fetched, Key, Replica
from broker.cluster.swc.watermark import Watermark
from broker.config import SwcSettings

log = logging.getLogger("nautilus.cluster")

REQUEST_TIMEOUT = 30.0  # seconds a peer has to answer one request of an exchange
COPY_PAGE_FACTOR = 10  # a full copy's page: this many times exchange_batch_size keys
COPY_WAIT = 10.0  # seconds a registration on a joining node waits for its group's copy
COPIES_AT_ONCE = 2  # groups a joining node copies at a time (each from one member)
COMMIT_WINDOW = 0.004  # seconds: at most one commit this often (writes wait to share it)


class Transport(Protocol):
    """The cluster channel, as replication uses it."""

    def linked(self) -> list[str]:
        """The nodes whose link is up."""
        ...

    def send(self, node: str, *frame: Any) -> None:
        """Best effort: dropped if the link is down or full."""

    def request(self, node: str, *frame: Any) -> Awaitable[Any]:
        """The peer's answer (ConnectionError if the link goes down first)."""
        ...


class Replication:
    def __init__(
        self,
        settings: SwcSettings,
        node: str,
        db: plyvel.DB,
        transport: Transport,
        on_change: Callable[[Key, Any], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.settings = settings
        self.node = node
        self.db = db
        self.transport = transport
        self.on_change = on_change
        self.loop = loop
        self.replica_id = storage.stored_id(db, 0) or f"{node}/{uuid.uuid4().hex[:12]}"
        replicas = [storage.load(db, g, self.replica_id, []) for g in range(settings.groups)]
        self.groups = Groups(replicas, node)
        self.peers: dict[str, str] = {}  # node -> its replica id, for the linked ones
        self._touched: set[int] = set()  # groups changed since the last commit
        self._commit_due = False
        self._last_commit = float("-inf")  # (loop time) of the last batch written
        self._tasks: set[asyncio.Task] = set()
        # A group's keys in the order a joining node copies them, and the order's token.
        self._copy_order: dict[int, tuple[str, list[Key]]] = {}
        self._copies: dict[int, _Copy] = {}  # this node's full copies under way, by group
        self._copying = asyncio.Semaphore(COPIES_AT_ONCE)
        # One exchange per group at a time (the periodic one, or one asked for: LEFT).
        self._exchanging = [asyncio.Lock() for _ in range(settings.groups)]
        self._outbox: list[Shipped] = []  # writes to broadcast after the commit
        self._waiting: list[asyncio.Future[None]] = []  # for the next commit, one each
        self.removed_by: set[str] = set()  # peers that say this node was removed
        self.exchanges = 0  # done
        self.exchange_failures = 0
        count = settings.groups
        self.group_exchanges = [0] * count
        self.group_failures = [0] * count
        self.last_exchange = [loop.time()] * count  # of each group's last one that worked
        # Set while the group holds the whole state (a joining node's copy is done).
        self._copied = [asyncio.Event() for _ in range(count)]
        self._all_copied = False
        for group in range(count):
            self._mark_copied(group)

    def found(self) -> None:
        """This node starts a cluster (no seeds): what it holds is the whole state."""
        for group, replica in enumerate(self.groups.replicas):
            if not replica.synced:
                replica.synced = True
                self._touch(group)
            self._mark_copied(group)

    def unfound(self) -> None:
        """This node, alone and with nothing of its own, joins a cluster: each group
        copies a member's state first (as a node started with seeds does)."""
        for group, replica in enumerate(self.groups.replicas):
            replica.synced = False
            self._touch(group)
            self._mark_copied(group)

    def copy_now(self, node: str) -> None:
        """This node just joined through `node`: copy each group it does not hold yet
        from there now, not at the group's next exchange (up to a sync_interval and a
        half away)."""
        if node not in self.transport.linked():
            return  # (the exchanges copy from whichever member they meet)
        for group, replica in enumerate(self.groups.replicas):
            if not replica.synced:
                self._spawn(self.exchange(group, node))

    def copy_progress(self) -> tuple[int, int, list[str]]:
        """The groups holding the whole state, of how many, and the members copies are
        under way from."""
        copied = sum(replica.synced for replica in self.groups.replicas)
        sources = sorted({copy.node for copy in self._copies.values()})
        return copied, len(self.groups), sources

    def _mark_copied(self, group: int) -> None:
        event = self._copied[group]
        if not self.groups.replicas[group].synced:
            event.clear()
        elif not event.is_set():
            event.set()
        was, self._all_copied = self._all_copied, all(e.is_set() for e in self._copied)
        if self._all_copied and not was:
            log.info("cluster: every group holds the cluster's whole metadata")
            gc.freeze()  # a bulk load: out of the collector's passes (broker/collector.py)

    async def copied(self, key: Key) -> None:
        """Once the group of `key` holds the cluster's whole state: at once, but on a
        node joining a cluster, until the group's copy is done (TimeoutError after
        COPY_WAIT). A read before would miss what the cluster holds."""
        if self._all_copied:  # (every CONNECT asks: no hashing once all are copied)
            return
        group, _ = self.groups.replica(key)
        event = self._copied[group]
        if not event.is_set():
            await asyncio.wait_for(event.wait(), COPY_WAIT)

    def start(self) -> None:
        for group in range(len(self.groups)):
            self._spawn(self._exchanges(group))
        self._spawn(self._collect())

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.commit()

    def _spawn(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- membership --------------------------------------------------------------------

    def set_peers(self, peers: dict[str, str]) -> None:
        """The group's members: node -> replica id (this node's added)."""
        self.peers = {node: rid for node, rid in peers.items() if node != self.node}
        members = [self.replica_id, *self.peers.values()]
        for group, replica in enumerate(self.groups.replicas):
            replica.set_peers(members)
            self._touch(group)

    # -- the broker's reads and writes -------------------------------------------------

    def get(self, key: Key) -> Any:
        shipped: list[Shipped] = []
        value = self.groups.get(key, shipped)
        for write in shipped:  # siblings resolved: the resolution goes out like a write
            self._written(write)
        return value

    def put(self, key: Key, value: Any, ts: int) -> None:
        self._written(self.groups.put(key, value, ts))
        self.on_change(key, value)

    def delete(self, key: Key) -> None:
        self._written(self.groups.delete(key))
        self.on_change(key, None)

    def items(self) -> list[tuple[Key, Any]]:
        return list(self.groups.items())

    def introduction(self) -> tuple[int, Key, Any]:
        """This node's member record as an SWC_WRITE carries it (group, key, object):
        what a node it links to, or a seed, learns it from."""
        key = ("node", self.node)
        group, replica = self.groups.replica(key)
        return group, key, wire.pack_object(replica.read(key))

    def _written(self, write: Shipped) -> None:
        """A write of this node's: broadcast once this turn's batch is on disk."""
        self._touch(write.group)
        if self.settings.enable_broadcast:
            self._outbox.append(write)

    async def durable(self) -> None:
        """Wait until what was written so far is on disk (the next commit, which the
        writes of this turn and maybe of the next ones share: one fsync for all)."""
        if not self._touched:
            return
        waiter = self.loop.create_future()  # (one's cancellation leaves the others waiting)
        self._waiting.append(waiter)
        await waiter

    # -- frames from peers -------------------------------------------------------------

    def on_write(self, group: int, key: Key, packed: Any) -> None:
        replica = self._replica(group)
        key = wire.frozen(key)
        if replica.receive(key, wire.unpack_object(packed)):
            self._changed(key)
        self._touch(group)

    def answer(self, kind: int, args: list[Any], removed: bool = False) -> Any:
        """The answer to a peer's request (the frame after its kind and reference);
        `removed`: the peer asking is no longer a member (its clock answer says so)."""
        if kind == SWC_CLOCK:
            return self.answer_clock(args[0], removed)
        if kind == SWC_FETCH:
            return self.answer_fetch(*args)
        if kind == SWC_WATERMARK:
            return self.answer_watermark(*args)
        if kind == SWC_KEYS:
            return self.answer_keys(args[0], args[1], args[2], args[3] if len(args) > 3 else None)
        raise ValueError(f"not a replication request: {kind}")

    def answer_clock(self, group: int, removed: bool = False) -> list[Any]:
        self.commit()  # what the clock says must be on disk before anyone learns it
        replica = self._replica(group)
        return [self.replica_id, wire.pack_clock(replica.clock), replica.synced, removed]

    def answer_fetch(self, group: int, dots: list[Any]) -> list[Any]:
        self.commit()
        wanted: list[Dot] = [(replica, n) for replica, n in dots]
        return wire.pack_fetched(self._replica(group).fetch(wanted))

    def answer_watermark(self, group: int) -> Any:
        self.commit()
        return wire.pack_watermark(self._replica(group).watermark)

    def answer_keys(self, group: int, start: int, limit: int, token: str | None) -> list[Any]:
        """A page of the group's whole key space, in the order of the keys' bytes (a
        joining node's full copy), the last page or not, and the order's token. The
        order is taken at the first page and kept for the next ones, which name it by
        its token (a key written since arrives by the exchanges after the copy). A page
        past the first whose order is gone (another copy began, this node restarted) is
        answered with no token: the copy starts again."""
        self.commit()
        objects = self._replica(group).objects
        held = self._copy_order.get(group)
        if start == 0:
            held = self._copy_order[group] = (
                uuid.uuid4().hex[:12],
                sorted(objects, key=msgpack.packb),
            )
        elif held is None or held[0] != token:
            return [[], False, None]
        token, keys = held
        page = [(key, objects[key]) for key in keys[start : start + limit] if key in objects]
        done = start + limit >= len(keys)
        if done:
            self._copy_order.pop(group, None)
        return [[(key, wire.pack_object(obj)) for key, obj in page], done, token]

    def _replica(self, group: int) -> Replica:
        if not 0 <= group < len(self.groups):
            raise ValueError(f"group {group} (this node has {len(self.groups)})")
        return self.groups.replicas[group]

    def _changed(self, key: Key) -> None:
        _, replica = self.groups.replica(key)
        values = replica.read(key).values()
        self.on_change(key, latest(values)[2] if values else None)

    # -- anti-entropy and GC -----------------------------------------------------------

    async def _exchanges(self, group: int) -> None:
        interval = self.settings.sync_interval
        await asyncio.sleep(random.uniform(0, interval / 2))
        while True:
            try:
                await self.exchange(group)
            except Exception:  # a bug of ours: this round is lost, not the loop
                log.exception("cluster: exchange of group %d failed", group)
            await asyncio.sleep(interval + random.uniform(0, interval / 2))

    async def exchange(self, group: int, node: str | None = None) -> bool:
        """Pull from one linked peer (random unless `node`); False if there was none or
        it failed."""
        linked = [n for n in self.transport.linked() if n in self.peers]
        if node is None:
            if not linked:
                return False
            copy = self._copies.get(group)  # a copy under way goes on with its member
            node = copy.node if copy is not None and copy.node in linked else random.choice(linked)
        if node not in self.peers:
            return False
        peer = _RemoteGroup(self, node, group)
        replica = self.groups.replicas[group]
        try:
            async with self._exchanging[group]:
                if replica.synced:
                    changed = await pull(replica, self.peers[node], peer, self._batch)
                else:
                    changed = await self._full_sync(replica, self.peers[node], peer)
        except (ConnectionError, TimeoutError, ValueError) as exc:
            self.exchange_failures += 1
            self.group_failures[group] += 1
            log.warning("cluster: exchange of group %d with %s failed: %s", group, node, exc)
            return False
        self.exchanges += 1
        self.group_exchanges[group] += 1
        self.last_exchange[group] = self.loop.time()
        self._touch(group)
        self._mark_copied(group)
        for key in changed:
            self._changed(key)
        return True

    async def _full_sync(self, replica: Replica, peer_id: str, peer: _RemoteGroup) -> list[Key]:
        """Copy a synced peer's whole group (a joining node: what the others forgot
        before it joined cannot be asked for by dot), COPIES_AT_ONCE groups at a time.
        Nothing if the peer is not synced itself (it is joining too): another round
        tries another peer. A copy that fails (a link down) goes on from its last page
        at the next round, with the same peer while it is linked. What each page changes
        is told at once (an interrupted copy's pages are merged already)."""
        group = peer.group
        async with self._copying:
            copy = self._copies.get(group)
            if copy is None or copy.node != peer.node:
                remote_clock = await peer.clock()
                if not peer.synced:
                    return []
                copy = self._copies[group] = _Copy(peer.node, remote_clock)
            done = False
            while not done:
                page, done, token = await peer.keys(copy.start, self._copy_page, copy.token)
                if token is None:
                    del self._copies[group]
                    raise ValueError(f"{peer.node} no longer has the copy's order: again")
                copy.token = token
                objects = [(wire.frozen(key), wire.unpack_object(obj)) for key, obj in page]
                for key in replica.take_page(objects, copy.clock):
                    self._changed(key)
                copy.start += self._copy_page
                copy.copied += len(objects)
            replica.finish_copy(peer_id, copy.clock, await peer.watermark())
            del self._copies[group]
        log.info("cluster: group %d copied from %s (%d keys)", group, peer.node, copy.copied)
        return []

    @property
    def _copy_page(self) -> int:
        return self.settings.exchange_batch_size * COPY_PAGE_FACTOR

    @property
    def _batch(self) -> int:
        return self.settings.exchange_batch_size

    async def _collect(self) -> None:
        while True:
            await asyncio.sleep(self.settings.gc_interval)
            self.gc()

    def gc(self) -> None:
        for group, replica in enumerate(self.groups.replicas):
            replica.gc()
            self._touch(group)

    # -- saving ------------------------------------------------------------------------

    def _touch(self, group: int) -> None:
        self._touched.add(group)
        if not self._commit_due:
            self._commit_due = True
            # At once (the next loop turn), unless the last commit was less than
            # COMMIT_WINDOW ago: then at its end, so that a burst of writes (a connect
            # storm) shares one LevelDB write, which costs more than a CONNECT's own work.
            wait = self._last_commit + COMMIT_WINDOW - self.loop.time()
            if wait > 0:
                self.loop.call_later(wait, self.commit)
            else:
                self.loop.call_soon(self.commit)

    def commit(self) -> None:
        """Write what changed, in one batch; then the broadcasts of the writes it holds
        go out, and whoever waited for them to be durable goes on."""
        self._commit_due = False
        if self._touched:
            self._last_commit = self.loop.time()
            with self.db.write_batch(sync=self.settings.sync) as batch:
                for group in self._touched:
                    storage.save(self.groups.replicas[group], batch, group)
            self._touched.clear()
        outbox, self._outbox = self._outbox, []
        linked = self.transport.linked() if outbox else []
        for write in outbox if linked else ():  # packed once, for every linked node
            packed = wire.pack_object(write.obj)
            for node in linked:
                self.transport.send(node, SWC_WRITE, write.group, write.key, packed)
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def group_figures(self) -> list[dict[str, float]]:
        """Per group, for /metrics (labelled by group)."""
        now = self.loop.time()
        return [
            {
                "objects": len(replica.objects),
                "tombstones": replica.tombstones(),
                "dotkeymap_entries": sum(len(e) for e in replica.dkm.values()),
                "exchanges": self.group_exchanges[group],
                "exchange_failures": self.group_failures[group],
                "sync_age_seconds": round(now - self.last_exchange[group], 3) if self.peers else 0,
            }
            for group, replica in enumerate(self.groups.replicas)
        ]

    def figures(self) -> dict[str, int]:
        replicas = self.groups.replicas
        return {
            "swc_objects": sum(len(r.objects) for r in replicas),
            "swc_tombstones": sum(r.tombstones() for r in replicas),
            "swc_dotkeymap_entries": sum(len(e) for r in replicas for e in r.dkm.values()),
            "swc_exchanges": self.exchanges,
            "swc_exchange_failures": self.exchange_failures,
        }


class _Copy:
    """A full copy of one group under way: from whom, the clock it was read at, how far
    it got (the next page's start), and the order's token its member gave."""

    def __init__(self, node: str, clock: NodeClock) -> None:
        self.node = node
        self.clock = clock
        self.start = 0
        self.copied = 0  # keys
        self.token: str | None = None


class _RemoteGroup:
    """A group's replica on another node, over the transport (exchange.Peer)."""

    def __init__(self, replication: Replication, node: str, group: int) -> None:
        self.replication = replication
        self.node = node
        self.group = group
        self.synced = False  # the peer's group holds the whole state (from its clock)
        self.pulling = replication.groups.replicas[group].synced  # (else: copying it whole)

    async def clock(self) -> NodeClock:
        replica_id, packed, self.synced, removed = await self._ask(SWC_CLOCK, self.group)
        if replica_id != self.replication.peers.get(self.node):
            raise ValueError(f"{self.node} answers as replica {replica_id}")
        if removed:  # it says this node is no longer a member
            self.replication.removed_by.add(self.node)
            if self.pulling:
                # Its state forgot, without this node, what this node missed meanwhile:
                # pulled by dot, a write would be taken as seen and never arrive. A whole
                # copy (the node leaving: Replication.unfound) is what it gets.
                raise ValueError(f"{self.node} says this node is no longer a member")
        return wire.unpack_clock(packed)

    async def fetch(self, dots: list[Dot]) -> list[Fetched]:
        return wire.unpack_fetched(await self._ask(SWC_FETCH, self.group, dots))

    async def watermark(self) -> Watermark:
        return wire.unpack_watermark(await self._ask(SWC_WATERMARK, self.group))

    async def keys(
        self, start: int, limit: int, token: str | None
    ) -> tuple[list[Any], bool, str | None]:
        """A page of the peer's keys, whether it was the last, and the order's token
        (None: the order `token` named is gone)."""
        page, done, token = await self._ask(SWC_KEYS, self.group, start, limit, token)
        return list(page), bool(done), token

    async def _ask(self, *frame: Any) -> Any:
        request = self.replication.transport.request(self.node, *frame)
        return await asyncio.wait_for(request, REQUEST_TIMEOUT)
