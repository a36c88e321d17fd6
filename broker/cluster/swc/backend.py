"""The cluster's metadata without any external service: `[cluster] metadata = "swc"`.

A MetadataBackend (broker/cluster/metadata.py) over this node's replicas (service.py):
every node holds every record, replicated leaderlessly over the cluster channel. The keys:

    ("node", name)          a member: [cluster address, boot id, replica id]
                            (boot id STOPPED: it stopped on purpose, until its next start)
    ("sub", client id)      a subscriber: [owner node, clean, packed subscriptions, ts]
    ("retain", topic)       a retained message: [packed message, ts]

Writes are checked here as Redis's scripts check them (broker/cluster/metadata.py):
a subscriber record only by its owner (NotOwner) and only newer than the stored one
(StaleRequest); a retained change older than the stored one is ignored. Two nodes may
still write one key at once (no leader orders them): the later timestamp wins on every
node once they have exchanged (groups.latest).

Reads are local, so they never wait for the network; the change stream is what this
node's replicas saw change (its own writes, broadcasts, exchanges), numbered here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import plyvel

from broker.cluster.metadata import (
    Change,
    MetadataUnavailable,
    NodeInfo,
    NotOwner,
    Registration,
    Snapshot,
    StaleRequest,
    Subscriber,
    Write,
    pack_subscriptions,
    unpack_subscriptions,
)
from broker.cluster.swc import storage
from broker.cluster.swc.bootstrap import Standing
from broker.cluster.swc.replica import Key
from broker.cluster.swc.service import Replication, Transport
from broker.config import ConfigError, SwcSettings

NODE = "node"
SUB = "sub"
RETAIN = "retain"
STOPPED = ""  # a member record's boot id while its node is stopped on purpose


class SwcBackend:
    """Every call answers from this node's replicas: none waits for another node."""

    def __init__(self, settings: SwcSettings, joining: bool) -> None:
        """`joining`: the node has seeds (it joins a cluster; without, it starts one)."""
        self.settings = settings
        self.joining = joining
        self.path = settings.directory  # the replicas' LevelDB
        self.node = ""
        self.replication: Replication | None = None
        self._db: plyvel.DB | None = None
        self._seq = 0
        self._log: list[Change] = []  # changes not read yet by the stream
        self._wake = asyncio.Event()
        self._members: dict[str, Any] = {}  # node -> its record, kept from the changes
        # Who owns which subscriber, kept from the changes too: a reap takes a removed
        # member's records without scanning every key.
        self._owned: dict[str, set[str]] = {}  # node -> client ids
        self._owner: dict[str, str] = {}  # client id -> node
        self._deleted = False  # this node's member record was deleted (by another member)
        # Members removed since this node started (until one joins again under its name):
        # their broadcasts are dropped, and their exchanges told that they were removed.
        self.removed_members: set[str] = set()
        self._transport: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, transport: Transport, loop: asyncio.AbstractEventLoop) -> None:
        """The cluster channel, given by the Cluster before `open`."""
        self._transport = transport
        self._loop = loop

    @property
    def replicas(self) -> Replication:
        assert self.replication is not None, "open() first"
        return self.replication

    async def open(self, node: str, boot_id: str, address: str) -> None:
        self.node = node
        assert self._transport is not None and self._loop is not None, "attach() first"
        os.makedirs(self.path, exist_ok=True)
        self._db = plyvel.DB(self.path, create_if_missing=True)
        left = storage.left_at(self._db)
        if left is not None:
            self._db.close()
            raise ConfigError(
                f"cluster.swc.directory: node {node} left its cluster at {left} (`nautilus "
                f"cluster leave`); wipe {self.path} and the message store to start it again"
            )
        self.replication = Replication(
            self.settings, node, self._db, self._transport, self._changed, self._loop
        )
        for (kind, name), value in self.replication.items():  # one pass at start
            if kind == NODE:
                self._members[name] = value
            elif kind == SUB:
                self._own(name, value[0])
        member = [address, boot_id, self.replication.replica_id]
        self.replication.put((NODE, node), member, time.time_ns())
        self.replication.set_peers(self.members())
        if not self.joining:
            self.replication.found()
        self.replication.start()

    async def close(self) -> None:
        if self.replication is not None:
            self.replication.stop()
        if self._db is not None:
            self._db.close()

    async def stopping(self) -> None:
        """This node stops on purpose (SIGTERM): its member record says so until its next
        start writes it again, so that the others, and members that start meanwhile, do
        not count it towards a netsplit (netsplit.py). Not for a node removed from the
        members: its record would bring it back."""
        record = self._members.get(self.node)
        if record is None or self.removed or self.replication is None:
            return
        address, _, replica_id = record
        self.replication.put((NODE, self.node), [address, STOPPED, replica_id], time.time_ns())
        await self.replication.durable()  # (then broadcast, ahead of the LEAVING frames)

    def stopped_members(self) -> set[str]:
        """The members whose record says they stopped on purpose."""
        return {node for node, record in self._members.items() if record[1] == STOPPED}

    def members(self) -> dict[str, str]:
        """Node -> replica id, of every member this node knows."""
        return {node: record[2] for node, record in self._members.items()}

    # -- MetadataBackend ---------------------------------------------------------------

    async def heartbeat(self) -> list[NodeInfo]:
        # Membership is what the replicas hold; a node nobody can reach stays a member
        # (as in VerneMQ) until `nautilus cluster leave` removes it: age 0.
        return [
            NodeInfo(node, address, boot_id, 0.0)
            for node, (address, boot_id, _) in self._members.items()
        ]

    async def register(self, client_id: str, clean: bool, ts: int) -> Registration:
        key = (SUB, client_id)
        try:  # a joining node: the record may be in the part not copied yet
            await self.replicas.copied(key)
        except TimeoutError:
            raise MetadataUnavailable(
                "this node is joining the cluster and has not copied the metadata yet"
            ) from None
        stored = self.replicas.get(key)
        previous = None
        subscriptions: dict = {}
        if stored is not None:
            node, was_clean, packed, stored_ts = stored
            if ts <= stored_ts:
                raise StaleRequest(f"registration of {client_id} at {ts}, stored {stored_ts}")
            previous = node
            if not (clean or was_clean):
                subscriptions = unpack_subscriptions(packed)
        existed = bool(stored is not None and not clean and not stored[1])
        record = [self.node, clean, pack_subscriptions(subscriptions), ts]
        self.replicas.put(key, record, ts)
        await self.replicas.durable()  # the CONNACK promises what is on disk
        return Registration(previous, existed, subscriptions)

    async def write(self, writes: list[Write]) -> list[Exception | None]:
        results: list[Exception | None] = []
        for write in writes:
            key = (SUB, write.client_id)
            stored = self.replicas.get(key)
            if stored is not None and stored[0] != self.node:
                results.append(NotOwner(f"{write.client_id} is owned by {stored[0]}"))
                continue
            if stored is not None and write.ts <= stored[3]:
                results.append(StaleRequest(f"{write.client_id} at {write.ts}"))
                continue
            record = write.subscriber
            if record is None:
                self.replicas.delete(key)
            else:
                packed = pack_subscriptions(record.subscriptions)
                self.replicas.put(key, [self.node, record.clean, packed, write.ts], write.ts)
            results.append(None)
        await self.replicas.durable()
        return results

    async def retain(self, changes: list[tuple[str, bytes | None, int]]) -> None:
        for topic, message, ts in changes:
            key = (RETAIN, topic)
            stored = self.replicas.get(key)
            if stored is not None and ts <= stored[1]:
                continue  # older than what is kept
            if message is None:
                self.replicas.delete(key)
            else:
                self.replicas.put(key, [message, ts], ts)
        await self.replicas.durable()

    async def snapshot(self) -> Snapshot:
        subscribers: dict[str, Subscriber] = {}
        retained: dict[str, bytes] = {}
        for key, value in self.replicas.items():
            if key[0] == SUB:
                subscribers[key[1]] = _subscriber(value)
            elif key[0] == RETAIN:
                retained[key[1]] = value[0]
        self._log.clear()  # changes() reads on from here
        return Snapshot(self._seq, subscribers, retained)

    async def subscribers(self) -> dict[str, Subscriber]:
        return {key[1]: _subscriber(value) for key, value in self.replicas.items() if key[0] == SUB}

    async def changes(self, after: int) -> AsyncIterator[Change]:
        while True:
            while not self._log:
                self._wake.clear()
                await self._wake.wait()
            log, self._log = self._log, []
            for change in log:
                if change.seq > after:
                    yield change

    async def reap(self, dead: str, limit: int) -> list[tuple[str, Subscriber]] | None:
        """Take up to `limit` subscribers of a node that is no longer a member (`nautilus
        cluster leave`): clean ones deleted, persistent ones moved here. A member that
        only went silent is not reaped (as in VerneMQ): refused, []."""
        if dead in self._members:
            return []
        batch = sorted(self._owned.get(dead, ()))[:limit]
        if not batch:
            return None
        moved: list[tuple[str, Subscriber]] = []
        for client_id in batch:
            key = (SUB, client_id)
            value = self.replicas.get(key)
            if value is None or value[0] != dead:
                self._own(client_id, None if value is None else value[0])
                continue
            ts = max(time.time_ns(), value[3] + 1)
            if value[1]:  # clean: its session ended with the node
                self.replicas.delete(key)  # (each write updates the index: _changed)
                continue
            self.replicas.put(key, [self.node, False, value[2], ts], ts)
            moved.append((client_id, _subscriber([self.node, False, value[2], ts])))
        return moved

    def _own(self, client_id: str, node: str | None) -> None:
        """The owner index: `client_id`'s record names `node` now (None: gone)."""
        old = self._owner.pop(client_id, None)
        if old is not None:
            clients = self._owned[old]
            clients.discard(client_id)
            if not clients:
                del self._owned[old]
        if node is not None:
            self._owner[client_id] = node
            self._owned.setdefault(node, set()).add(client_id)

    def remove(self, node: str) -> None:
        """`nautilus cluster leave NODE`: NODE's member record goes, on every node."""
        self.replicas.delete((NODE, node))

    @property
    def removed(self) -> bool:
        """Whether another member removed this node (`nautilus cluster leave` while it
        could not be asked): its record deleted here, or a member's exchange says so
        (the delete itself may be forgotten by the time this node reaches them)."""
        return self._deleted or bool(self.replicas.removed_by)

    def on_write(self, sender: str, group: int, key: Any, packed: Any) -> None:
        """A write `sender` broadcast. A removed member's are dropped (VerneMQ drops the
        broadcasts of non-peers), but for its own member record: a node wiped and joining
        again under the name introduces itself so."""
        if sender in self.removed_members and list(key) != [NODE, sender]:
            return
        self.replicas.on_write(group, key, packed)

    def answer(self, asker: str, kind: int, args: list[Any]) -> Any:
        """A replication request's answer."""
        return self.replicas.answer(kind, args, removed=asker in self.removed_members)

    def mark_left(self) -> None:
        """This node has left its cluster: it will not start on this state again."""
        assert self._db is not None, "open() first"
        self.replicas.commit()
        storage.mark_left(self._db, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def alone(self) -> bool:
        """No other member, and nothing but this node's own record: joining loses
        nothing."""
        own = (NODE, self.node)
        return set(self._members) <= {self.node} and all(
            key == own for key, _ in self.replicas.items()
        )

    def holds(self) -> bool:
        """Every group holds the cluster's whole state (this node started the cluster, or
        copied it): a joining node can copy it from here."""
        return all(replica.synced for replica in self.replicas.groups.replicas)

    def standing(self) -> Standing:
        """Fresh (nothing but its own record), joining (it knows members, introduced,
        and holds nothing of theirs), or a member holding history: a subscriber or a
        retained message, or other members in a state it holds (bootstrap.py). Member
        records alone are no history: two fresh nodes that met hold each other's."""
        if self.alone():
            return Standing.FRESH
        if any(key[0] != NODE for key, _ in self.replicas.items()):
            return Standing.MEMBER
        synced = any(replica.synced for replica in self.replicas.groups.replicas)
        return Standing.MEMBER if synced else Standing.JOINING

    # -- what the replicas saw change --------------------------------------------------

    def _changed(self, key: Key, value: Any) -> None:
        if not isinstance(key, tuple) or len(key) != 2:
            return
        kind, name = key
        if kind == SUB:
            self._own(name, value[0] if value is not None else None)
            self._seq += 1
            record = _subscriber(value) if value is not None else None
            self._log.append(Change(self._seq, client_id=name, subscriber=record))
        elif kind == RETAIN:
            self._seq += 1
            self._log.append(Change(self._seq, topic=name, retained=value[0] if value else None))
        elif kind == NODE:
            if value is None:
                self._members.pop(name, None)
            else:
                self._members[name] = value
            if name == self.node:  # another member removed this one (`cluster leave`)
                self._deleted = value is None
            elif value is None:
                self.removed_members.add(name)
            else:
                self.removed_members.discard(name)
            if self.replication is not None:
                self.replication.set_peers(self.members())
            return
        else:
            return
        self._wake.set()


def _subscriber(value: list[Any]) -> Subscriber:
    node, clean, packed, _ = value
    return Subscriber(node, bool(clean), unpack_subscriptions(packed))
