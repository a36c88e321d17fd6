"""The watermark: what each peer is known to have of each replica's writes.

A matrix over the group's peers: `rows[i][p]` is the base counter of replica i's writes
that peer p is known to hold. Its minimum over a row is how far i's writes are known
everywhere: a dot (i, n) with n <= min(i) can be forgotten (its dot-key entry pruned, a
delete's tombstone removed), since no peer will ever ask for it again.

A peer learns the others' columns from exchanges: its own column from its own clock, the
column of the peer it exchanged with from that peer's clock, and the rest from that
peer's watermark (`left_join`). A replica that left keeps its row (its dots may still
be waiting to be forgotten), with no column.

Reference: VerneMQ's `swc_watermark.erl`. Pure values, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.cluster.swc.clock import NodeClock


class Watermark:
    __slots__ = ("rows",)

    def __init__(self, rows: dict[str, dict[str, int]] | None = None) -> None:
        self.rows: dict[str, dict[str, int]] = {i: dict(row) for i, row in (rows or {}).items()}

    def __repr__(self) -> str:
        return f"Watermark({self.rows!r})"

    def set_peers(self, peers: Iterable[str]) -> None:
        """Make the matrix square over `peers` (this node among them), keeping what is
        known of the peers that stay. A replica that left keeps its row (its dots may
        still be waiting to be forgotten) but is no longer a column."""
        peers = list(peers)
        for i in peers:
            self.rows.setdefault(i, {})
        for row in self.rows.values():
            for p in [p for p in row if p not in peers]:
                del row[p]
            for p in peers:
                row.setdefault(p, 0)

    def update_peer(self, peer: str, clock: NodeClock) -> None:
        """`peer` holds what `clock` (its node clock) says."""
        for i, row in self.rows.items():
            if peer in row:
                n = clock.base(i)
                if n > row[peer]:
                    row[peer] = n

    def left_join(self, other: Watermark) -> None:
        """Take in what `other` knows, for the rows and columns this one has."""
        for i, row in self.rows.items():
            theirs = other.rows.get(i)
            if not theirs:
                continue
            for p, n in theirs.items():
                if p in row and n > row[p]:
                    row[p] = n

    def min(self, replica: str) -> int:
        """Every peer holds `replica`'s writes up to this counter."""
        row = self.rows.get(replica)
        return min(row.values()) if row else 0

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {i: dict(row) for i, row in self.rows.items()}
