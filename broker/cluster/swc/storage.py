"""A replica's state in LevelDB: what a node restarted (even after kill -9) comes back with.

One database holds every group, each under its own prefix (`g<n>/`):

    g<n>/i                    the replica id (new when a node starts with no state)
    g<n>/s                    b"1" once the group holds a synced member's whole state
    g<n>/k                    the node clock
    g<n>/w                    the watermark
    g<n>/o/<key>              a stored (stripped) object
    g<n>/d/<id>\\0<n:8>        a dot-key entry: the dot's key
    left                      set once the node has left its cluster (it will not start)

Keys and values are msgpack (keys are tuples of strings and numbers; a bitmap of the
clock, which may pass 64 bits, as bytes). `save` puts what changed since the last save
(the replica keeps the list) into a write batch; the caller writes the batch before it
acknowledges the writes or sends a dot anywhere, so that a dot that left the node is
never made again after a restart.
"""

from __future__ import annotations

from typing import Any

import msgpack
import plyvel

from broker.cluster.swc import wire
from broker.cluster.swc.clock import Dot
from broker.cluster.swc.replica import Key, Replica

ID = b"i"
SYNCED = b"s"
CLOCK = b"k"
WATERMARK = b"w"
OBJECT = b"o/"
DKM = b"d/"
LEFT = b"left"


def prefix(group: int) -> bytes:
    return b"g%d/" % group


def save(replica: Replica, batch: Any, group: int) -> None:
    """Put what changed in `replica` since the last save into `batch` (a plyvel write
    batch, or anything with put and delete): the objects and dot-key entries it lists,
    its clock (which nearly every save changes), and its id, synced flag and watermark
    when they differ from what the last save put (most saves are one CONNECT's write,
    which changes none of them)."""
    base = prefix(group)
    for key in replica.changed:
        obj = replica.objects.get(key)
        if obj is None:
            batch.delete(base + OBJECT + _key(key))
        else:
            batch.put(base + OBJECT + _key(key), msgpack.packb(wire.pack_object(obj)))
    for dot in replica.dkm_dropped:
        batch.delete(base + DKM + _dot(dot))
    for dot, key in replica.dkm_added.items():
        batch.put(base + DKM + _dot(dot), _key(key))
    head = (replica.id, replica.synced)
    if head != replica.saved_head:
        batch.put(base + ID, replica.id.encode())
        batch.put(base + SYNCED, b"1" if replica.synced else b"0")
        replica.saved_head = head
    batch.put(base + CLOCK, msgpack.packb(wire.pack_clock(replica.clock)))
    if replica.watermark.rows != replica.saved_watermark:
        watermark = wire.pack_watermark(replica.watermark)  # (a copy)
        batch.put(base + WATERMARK, msgpack.packb(watermark))
        replica.saved_watermark = watermark
    replica.changed.clear()
    replica.dkm_added.clear()
    replica.dkm_dropped.clear()


def stored_id(db: plyvel.DB, group: int) -> str | None:
    """The replica id the group was saved under; None: no state (a new or wiped node)."""
    value = db.get(prefix(group) + ID)
    return value.decode() if value is not None else None


def mark_left(db: plyvel.DB, when: str) -> None:
    """The node has left its cluster (at `when`): its state is no member's any more."""
    db.put(LEFT, when.encode(), sync=True)


def left_at(db: plyvel.DB) -> str | None:
    """When the node left its cluster, if it did."""
    value = db.get(LEFT)
    return value.decode() if value is not None else None


def load(db: plyvel.DB, group: int, replica_id: str, peers: list[str]) -> Replica:
    """The group's replica as it was last saved (an empty one if it never was)."""
    base = prefix(group)
    replica = Replica(replica_id)
    clock = db.get(base + CLOCK)
    if clock is not None:
        replica.clock = wire.unpack_clock(msgpack.unpackb(clock, use_list=False))
    watermark = db.get(base + WATERMARK)
    if watermark is not None:
        replica.watermark = wire.unpack_watermark(msgpack.unpackb(watermark))
    for raw, value in db.iterator(prefix=base + OBJECT):
        key = wire.frozen(msgpack.unpackb(raw[len(base + OBJECT) :]))
        obj = wire.unpack_object(msgpack.unpackb(value, use_list=False))
        replica.objects[key] = obj
        if obj.context:
            replica.unsettled.add(key)
    for raw, value in db.iterator(prefix=base + DKM):
        replica_part, _, counter = raw[len(base + DKM) :].partition(b"\0")
        key = wire.frozen(msgpack.unpackb(value))
        replica.dkm.setdefault(replica_part.decode(), {})[int.from_bytes(counter)] = key
    replica.synced = db.get(base + SYNCED) == b"1"
    replica.set_peers(peers)
    return replica


def _key(key: Key) -> bytes:
    return msgpack.packb(key)


def _dot(dot: Dot) -> bytes:
    return dot[0].encode() + b"\0" + dot[1].to_bytes(8)
