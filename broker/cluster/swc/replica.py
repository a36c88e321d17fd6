"""One replica of one group of keys: Server Wide Clocks replication without I/O.

A replica keeps, for its group of keys: the stored objects (stripped DCCs, broker/cluster/
swc/dcc.py), its node clock (what it has seen), the watermark (what every peer is known
to have seen) and the dot-key map (dot -> key, for the dots not yet known everywhere, so
that anti-entropy turns a missing dot into "send this key" without a scan).

What crosses the wire is values: a write returns the object to broadcast to the peers
(`receive` on each); anti-entropy is a pull, driven by the puller:

    missing = mine.missing(their_clock)               # the dots they have and I lack
    for batch in batches(missing):                    # exchange_batch_size dots each
        mine.repair(theirs.fetch(batch), their_clock)
    mine.finish_exchange(their_id, their_clock, their_watermark)   # and GC

A delete is a write of DELETED. Its key leaves the store at once (or once the clock has no
gap under it); the dot-key entry that remembers it goes when every peer's watermark
passes its dot (`gc`), so no tombstone lives forever.

Reference: VerneMQ's `vmq_swc_store.erl`, `vmq_swc_exchange_fsm.erl`; the paper's
algorithm (Gonçalves et al.) as docs/clustering.md summarises it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker.cluster.swc.clock import Dot, NodeClock
from broker.cluster.swc.dcc import DELETED, Dcc, sync
from broker.cluster.swc.watermark import Watermark

# A key: hashable and msgpack-able, in practice a tuple of strings (("sub", client id)).
Key = Any


@dataclass(slots=True)
class Fetched:
    """A peer's answer for some missing dots: the object they lead to (stripped, as the
    peer stores it; a delete marker if the key is gone), and which of the dots asked
    for led to it."""

    key: Key
    dots: list[Dot]
    obj: Dcc


class Replica:
    __slots__ = (
        "changed",
        "clock",
        "dkm",
        "dkm_added",
        "dkm_dropped",
        "id",
        "objects",
        "peers",
        "saved_head",
        "saved_watermark",
        "synced",
        "unsettled",
        "watermark",
    )

    def __init__(self, replica_id: str, peers: Iterable[str] = ()) -> None:
        self.id = replica_id
        self.clock = NodeClock()
        self.watermark = Watermark()
        self.objects: dict[Key, Dcc] = {}  # stripped; deletes left out
        self.dkm: dict[str, dict[int, Key]] = {}  # replica id -> counter -> key
        # Stored with a context the clock does not imply yet (a gap under it, or a write
        # the clock has not reached): gc strips them again. Those with no value left are
        # a delete's record until then (a tombstone).
        self.unsettled: set[Key] = set()
        self.peers: list[str] = []
        # What changed since the store last took it (broker/cluster/swc/storage.py):
        # keys whose object was saved or removed, dot-key entries made and forgotten.
        self.changed: set[Key] = set()
        self.dkm_added: dict[Dot, Key] = {}
        self.dkm_dropped: set[Dot] = set()
        # What the store last put of the id and synced flag, and of the watermark (None:
        # nothing yet): it puts them again only when they differ.
        self.saved_head: tuple[str, bool] | None = None
        self.saved_watermark: dict[str, dict[str, int]] | None = None
        # Holds the whole group, as one synced member did (a joining node copies it
        # first: the dots the others forgot before it joined cannot be asked for).
        self.synced = False
        self.set_peers(peers)

    def __repr__(self) -> str:
        return f"<Replica {self.id} {len(self.objects)} keys>"

    def set_peers(self, peers: Iterable[str]) -> None:
        """The group's members (this replica is always one)."""
        self.peers = sorted({self.id, *peers})
        for peer in self.peers:
            self.clock.add_peer(peer)
        self.watermark.set_peers(self.peers)

    # -- reading and writing -----------------------------------------------------------

    def read(self, key: Key) -> Dcc:
        """The key's object, its context filled from the node clock: `values()` are the
        siblings (none: absent), `context` what a write superseding them passes."""
        stored = self.objects.get(key)
        obj = stored.copy() if stored is not None else Dcc()
        obj.fill(self.clock)
        return obj

    def get(self, key: Key) -> list[Any]:
        return self.read(key).values()

    def write(self, key: Key, value: Any, context: dict[str, int] | None = None) -> Dcc:
        """Store a new value under a new dot, superseding what `context` has seen (by
        default what this replica holds now). Returns the object to broadcast."""
        if context is None:
            stored = self.objects.get(key)
            if stored is None or not stored.context:
                return self._supersede(key, value)
        return self._write(key, value, context)

    def _write(self, key: Key, value: Any, context: dict[str, int] | None) -> Dcc:
        """`write`, the general way: any context, any object held."""
        obj = self.read(key)
        obj.discard(obj.context if context is None else context)
        dot = self.clock.event(self.id)
        obj.add(dot, value)
        self._index(dot, key)
        shipped = obj.copy()
        self._save(key, obj)
        return shipped

    def _supersede(self, key: Key, value: Any) -> Dcc:
        """`write` of a key held settled (no context beyond the clock's bases) or not at
        all, superseding what is held: what the general path comes to, without its
        copies and merges (every CONNECT writes one). The new dot supersedes every
        version held (the clock's bases cover them), the object kept is the new version
        alone (the clock implies its context), and the one broadcast carries the clock's
        bases as its context."""
        dot = self.clock.event(self.id)
        self._index(dot, key)
        self.changed.add(key)
        if value is DELETED:
            self.objects.pop(key, None)
        else:
            self.objects[key] = Dcc({dot: value})
        context = {replica: base for replica, (base, _) in self.clock.entries.items() if base}
        return Dcc({dot: value}, context)

    def delete(self, key: Key, context: dict[str, int] | None = None) -> Dcc:
        return self.write(key, DELETED, context)

    def receive(self, key: Key, remote: Dcc) -> bool:
        """A peer's write, broadcast: merged; True if what the key reads changed."""
        local = self.read(key)  # filled with the clock from before the remote's dots
        merged = sync(local, remote)
        for dot in remote.versions:
            self._learn(dot, key)
        self._save(key, merged)
        return merged.versions != local.versions

    # -- anti-entropy ------------------------------------------------------------------

    def missing(self, remote_clock: NodeClock) -> list[Dot]:
        """The dots a peer (its clock) has that this replica lacks."""
        return self.clock.missing_from(remote_clock)

    def fetch(self, dots: Iterable[Dot]) -> list[Fetched]:
        """The objects a peer asks for by dot (the dots this replica cannot place are
        skipped: the peer asks the replica that made them)."""
        found: dict[Key, Fetched] = {}
        for dot in dots:
            key = self.dkm.get(dot[0], {}).get(dot[1])
            if key is None:
                continue
            answer = found.get(key)
            if answer is None:
                stored = self.objects.get(key)
                obj = stored.copy() if stored is not None else Dcc()
                answer = found[key] = Fetched(key, [], obj)
            answer.dots.append(dot)
            if key not in self.objects:  # deleted here: a delete marker carries the dot
                answer.obj.versions[dot] = DELETED
        return list(found.values())

    def repair(self, fetched: Iterable[Fetched], remote_clock: NodeClock) -> list[Key]:
        """Merge a peer's answer (`fetch`); returns the keys whose values changed."""
        changed = []
        for answer in fetched:
            remote = answer.obj.copy()
            remote.fill(remote_clock)
            local = self.read(answer.key)
            merged = sync(local, remote)
            # The dots asked for too: the peer's object holds each, or supersedes it (its
            # context covers it), and so does what this replica holds now.
            for dot in itertools.chain(remote.versions, answer.dots):
                self._learn(dot, answer.key)
            self._save(answer.key, merged)
            if merged.values() != local.values():
                changed.append(answer.key)
        return changed

    def finish_exchange(self, peer: str, remote_clock: NodeClock, remote: Watermark) -> None:
        """After the last batch from `peer`: everything it wrote is here now (its own
        entry of its clock), and what it knows of the others; then GC."""
        only = [peer, *(i for i in remote_clock.ids() if i not in self.clock.entries)]
        self.clock.merge(remote_clock, only)
        self.watermark.update_peer(peer, remote_clock)
        self.watermark.left_join(remote)
        self.gc()

    def take_page(self, objects: Iterable[tuple[Key, Dcc]], remote_clock: NodeClock) -> list[Key]:
        """Merge a page of a synced peer's whole key space (a full sync: a joining
        replica); returns the keys whose values changed."""
        changed = []
        for key, stored in objects:
            remote = stored.copy()
            remote.fill(remote_clock)
            local = self.read(key)
            merged = sync(local, remote)
            for dot in remote.versions:
                self._learn(dot, key)
            self._save(key, merged)
            if merged.values() != local.values():
                changed.append(key)
        return changed

    def finish_copy(self, peer: str, remote_clock: NodeClock, remote: Watermark) -> None:
        """After the last page: this replica holds what the peer held when its clock was
        read, so it has seen all of that clock."""
        self.clock.merge(remote_clock)
        self.watermark.update_peer(peer, remote_clock)
        self.watermark.left_join(remote)
        self.synced = True
        self.gc()

    # -- forgetting --------------------------------------------------------------------

    def gc(self) -> int:
        """Forget the dots every peer holds (their dot-key entries: nobody will ask for
        them), and the deletes' context-only records the clock now implies. Returns how
        many dot-key entries went."""
        self.watermark.update_peer(self.id, self.clock)
        pruned = 0
        for replica, entries in list(self.dkm.items()):
            floor = self.watermark.min(replica)
            known = [n for n in entries if n <= floor]
            for n in known:
                del entries[n]
                self._dropped((replica, n))
            pruned += len(known)
            if not entries:
                del self.dkm[replica]
        for key in list(self.unsettled):
            stored = self.objects[key]
            stored.strip(self.clock)
            if not stored.context:
                self.unsettled.discard(key)
                if not stored.versions:
                    del self.objects[key]
                self.changed.add(key)
        return pruned

    def tombstones(self) -> int:
        """Deleted keys still remembered: context-only records, and dot-key entries
        that lead to no stored key."""
        gone = {
            key
            for entries in self.dkm.values()
            for key in entries.values()
            if key not in self.objects
        }
        hollow = sum(not self.objects[key].versions for key in self.unsettled)
        return len(gone) + hollow

    # -- inside ------------------------------------------------------------------------

    def _learn(self, dot: Dot, key: Key) -> None:
        if dot not in self.clock:
            self.clock.add(dot)
        self._index(dot, key)

    def _index(self, dot: Dot, key: Key) -> None:
        if dot[1] > self.watermark.min(dot[0]):  # known everywhere: nobody will ask
            self.dkm.setdefault(dot[0], {})[dot[1]] = key
            self.dkm_added[dot] = key
            self.dkm_dropped.discard(dot)

    def _dropped(self, dot: Dot) -> None:
        self.dkm_added.pop(dot, None)
        self.dkm_dropped.add(dot)

    def _save(self, key: Key, obj: Dcc) -> None:
        self.changed.add(key)
        obj.strip(self.clock)
        obj.without_deletes()
        if obj.empty:
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        if obj.context:
            self.unsettled.add(key)
        else:
            self.unsettled.discard(key)
