"""What the plugin asks of a database, whichever it is.

`rows(mountpoint, client_id, username, password)`: the rows for (mountpoint, client_id
or `*`, username), as VerneMQ's scripts select them; with server-side hashing only those
whose password the database found equal (so `Row.passhash` is None), with bcrypt every
one with its hash, which the broker checks. `row(mountpoint, row_client_id, username)`:
one row again, by its key, to re-read its ACLs (no password: the client proved it when
it connected). Errors are `DatabaseError` (down, refused, timed out), said in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_ROW = "*"  # the client_id of a row that serves any client of that username


class DatabaseError(Exception):
    """The database could not answer (down, refused, timed out): one line."""


@dataclass(frozen=True, slots=True)
class Row:
    client_id: str  # the row's: the client's own, or "*"
    passhash: str | None  # the stored hash (bcrypt); None when the database compared
    publish_acl: Any  # JSON text, or already decoded by the driver; None: nothing
    subscribe_acl: Any


class Backend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def rows(
        self, mountpoint: str, client_id: str, username: str, password: str
    ) -> list[Row]: ...

    async def row(self, mountpoint: str, client_id: str, username: str) -> Row | None: ...

    def in_use(self) -> int:
        """Connections of the pool busy now (a metric)."""
        ...


def chosen(rows: list[Row], verified: list[bool] | None = None) -> Row | None:
    """VerneMQ's choice: the client's own row before the default row, among the rows
    whose password matched (all of them with server-side hashing)."""
    matched = rows if verified is None else [r for r, ok in zip(rows, verified, strict=True) if ok]
    own = [row for row in matched if row.client_id != DEFAULT_ROW]
    return (own or matched)[0] if matched else None
