"""Dots and node clocks (bitmapped version vectors) of Server Wide Clocks.

A dot (replica id, n) names one write: the n-th write made by that replica. A node clock
records every dot a replica has stored or seen superseded, per replica id, as a base (all
of 1..base) and a bitmap of the dots past base+1 it has too (bit k: base+1+k). It is
kept normalised: while the dot just past the base is present, the base moves up.

Reference: Gonçalves et al., "Concise Server-Wide Causality Management for Eventually
Consistent Data Stores"; VerneMQ's `swc_node.erl`. Pure values, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

Dot = tuple[str, int]  # (replica id, counter from 1)


class NodeClock:
    """A bitmapped version vector: replica id -> (base, bitmap)."""

    __slots__ = ("entries",)

    def __init__(self, entries: dict[str, tuple[int, int]] | None = None) -> None:
        self.entries: dict[str, tuple[int, int]] = dict(entries or {})

    def __repr__(self) -> str:
        return f"NodeClock({self.entries!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeClock) and self.entries == other.entries

    def copy(self) -> NodeClock:
        return NodeClock(self.entries)

    def ids(self) -> Iterable[str]:
        return self.entries.keys()

    def base(self, replica: str) -> int:
        """Every dot of `replica` up to this counter is here."""
        entry = self.entries.get(replica)
        return entry[0] if entry is not None else 0

    def bases(self) -> dict[str, int]:
        """The clock as a version vector: each replica's base."""
        return {replica: base for replica, (base, _) in self.entries.items()}

    def __contains__(self, dot: Dot) -> bool:
        replica, n = dot
        base, bitmap = self.entries.get(replica, (0, 0))
        return n <= base or bool((bitmap >> (n - base - 1)) & 1)

    def add_peer(self, replica: str) -> None:
        """Know of `replica` (with no dots of it yet), so that exchanges ask for them."""
        self.entries.setdefault(replica, (0, 0))

    def add(self, dot: Dot) -> None:
        replica, n = dot
        base, bitmap = self.entries.get(replica, (0, 0))
        if n > base:
            self.entries[replica] = _normalised(base, bitmap | (1 << (n - base - 1)))

    def event(self, replica: str) -> Dot:
        """The next dot of `replica` (this node's own writes), added to the clock. Its own
        entry never has a gap: only this node makes its dots."""
        base, bitmap = self.entries.get(replica, (0, 0))
        if bitmap:
            # A gap in our own dots: the store lost what it acknowledged. Never reuse a
            # counter: continue past everything seen.
            base += bitmap.bit_length()
        self.entries[replica] = (base + 1, 0)
        return (replica, base + 1)

    def merge(self, other: NodeClock, only: Iterable[str] | None = None) -> None:
        """Take in what `other` has: every replica, or only those named in `only`."""
        replicas = other.entries.keys() if only is None else only
        for replica in replicas:
            theirs = other.entries.get(replica)
            if theirs is None:
                continue
            mine = self.entries.get(replica)
            self.entries[replica] = theirs if mine is None else _merged(mine, theirs)

    def missing_from(self, remote: NodeClock) -> list[Dot]:
        """The dots `remote` has and this clock lacks, oldest first per replica."""
        missing: list[Dot] = []
        for replica, (rbase, rbitmap) in remote.entries.items():
            base, bitmap = self.entries.get(replica, (0, 0))
            if rbase <= base and not rbitmap:
                continue  # nothing past what we have for sure
            for n in range(base + 1, rbase + 1):
                if not (bitmap >> (n - base - 1)) & 1:
                    missing.append((replica, n))
            k = 0
            while rbitmap:
                if rbitmap & 1:
                    n = rbase + 1 + k
                    if n > base and not (bitmap >> (n - base - 1)) & 1:
                        missing.append((replica, n))
                rbitmap >>= 1
                k += 1
        return missing


def _normalised(base: int, bitmap: int) -> tuple[int, int]:
    """Move the base up over the dots just past it (the bitmap's low set bits)."""
    if bitmap & 1:
        run = (~bitmap & (bitmap + 1)).bit_length() - 1  # trailing ones
        base += run
        bitmap >>= run
    return base, bitmap


def _merged(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    (abase, abitmap), (bbase, bbitmap) = a, b
    if abase < bbase:
        (abase, abitmap), (bbase, bbitmap) = (bbase, bbitmap), (abase, abitmap)
    # abase >= bbase: b's bitmap, seen from abase, loses the bits at or below abase.
    shift = abase - bbase
    return _normalised(abase, abitmap | (bbitmap >> shift))
