"""Server Wide Clocks' values as plain data (lists, dicts, bytes, numbers): what msgpack
carries between nodes (the cluster channel) and to disk (storage.py).

Keys and values travel as they are, except that msgpack has one kind of array: what
arrives is made of tuples again (`frozen`), whether it was unpacked into lists (the
cluster channel) or tuples (the store), so that a key is hashable and a value compares
equal to the one that was written. A clock's bitmap, which may pass 64 bits, travels as
bytes.
"""

from __future__ import annotations

from typing import Any

from broker.cluster.swc.clock import NodeClock
from broker.cluster.swc.dcc import Dcc
from broker.cluster.swc.replica import Fetched
from broker.cluster.swc.watermark import Watermark

_ATOMS = frozenset((str, bytes, int, float, bool, type(None)))  # frozen as they are


def frozen(data: Any) -> Any:
    """Arrays as tuples, all the way down (maps keep their keys, their values frozen)."""
    if isinstance(data, list | tuple):  # (atoms kept without a call: every write's key)
        return tuple([item if type(item) in _ATOMS else frozen(item) for item in data])
    if isinstance(data, dict):
        return {
            key: value if type(value) in _ATOMS else frozen(value) for key, value in data.items()
        }
    return data


def pack_clock(clock: NodeClock) -> dict[str, tuple[int, bytes]]:
    return {
        replica: (base, bitmap.to_bytes((bitmap.bit_length() + 7) // 8, "little"))
        for replica, (base, bitmap) in clock.entries.items()
    }


def unpack_clock(data: dict[str, Any]) -> NodeClock:
    return NodeClock(
        {
            replica: (base, int.from_bytes(bitmap, "little"))
            for replica, (base, bitmap) in data.items()
        }
    )


def pack_object(obj: Dcc) -> tuple[list[tuple[str, int, Any]], dict[str, int]]:
    return [(replica, n, value) for (replica, n), value in obj.versions.items()], obj.context


def unpack_object(data: Any) -> Dcc:
    versions, context = data
    return Dcc({(replica, n): frozen(value) for replica, n, value in versions}, dict(context))


def pack_watermark(watermark: Watermark) -> dict[str, dict[str, int]]:
    return watermark.to_dict()


def unpack_watermark(data: dict[str, Any]) -> Watermark:
    return Watermark({i: dict(row) for i, row in data.items()})


def pack_fetched(fetched: list[Fetched]) -> list[Any]:
    return [(answer.key, answer.dots, pack_object(answer.obj)) for answer in fetched]


def unpack_fetched(data: list[Any]) -> list[Fetched]:
    return [
        Fetched(frozen(key), [(replica, n) for replica, n in dots], unpack_object(obj))
        for key, dots, obj in data
    ]
