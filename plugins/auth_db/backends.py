"""What the plugin asks of a database, whichever it is.

`rows(mountpoint, client_id, username, password)`: the rows for (mountpoint, client_id
or `*`, username), as VerneMQ's scripts select them; with server-side hashing only those
whose password the database found equal (so `Row.passhash` is None), with bcrypt every
one with its hash, which the broker checks. `row(mountpoint, row_client_id, username)`:
one row again, by its key, to re-read its ACLs (no password: the client proved it when
it connected). Errors are `DatabaseError` (down, refused, timed out), said in one line.
Each step is bound by the query timeout (acquiring a pooled connection, connecting, the
query); the plugin bounds the whole of it too (plugin.py: `_within_timeout`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.config import ConfigError

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
    name: str  # the database, as errors name it ("PostgreSQL")

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Close the pool, within the query timeout: a hung database's connections are
        cut rather than waited for."""
        ...

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


# -- SQL queries with named parameters ----------------------------------------------------

PARAMETERS = ("mountpoint", "client_id", "username", "password")
# VerneMQ's lookups (its postgres.lua and mysql.lua): a CONNECT's rows (the client's own
# and the default `*`), and one row by its key.
ROWS = (
    "FROM vmq_auth_acl WHERE mountpoint = :mountpoint"
    " AND (client_id = :client_id OR client_id = '*') AND username = :username"
)
KEY = (
    "FROM vmq_auth_acl WHERE mountpoint = :mountpoint AND client_id = :client_id"
    " AND username = :username"
)
_NAMED = re.compile(r"(?<![:\w]):(\w+)")  # :name, not PostgreSQL's ::cast


@dataclass(frozen=True, slots=True)
class Query:
    """A query as a driver takes it: positional placeholders, and the parameters' names
    in their order."""

    text: str
    names: tuple[str, ...]

    def arguments(self, values: Mapping[str, str]) -> list[str]:
        return [values[name] for name in self.names]


def prepare(sql: str, placeholder: Callable[[int], str], where: str) -> Query:
    """`sql` with :mountpoint, :client_id, :username and :password made the driver's
    placeholders (`placeholder(1)` is the first: `$1`, `%s`); another :name is a
    ConfigError naming `where`."""
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in PARAMETERS:
            raise ConfigError(
                f"{where}: unknown parameter :{name} (known: "
                f"{', '.join(':' + p for p in PARAMETERS)})"
            )
        names.append(name)
        return placeholder(len(names))

    return Query(_NAMED.sub(replace, sql), tuple(names))


def sql_queries(
    password_hash: str,
    defaults: Mapping[str, str],
    custom: Mapping[str, str],
    placeholder: Callable[[int], str],
) -> tuple[Query, Query]:
    """A SQL backend's two queries, each the user's (`[plugins.auth_db.query]`) or the
    backend's own: auth_on_register's for `password_hash`, and `acls`. A query of the
    user's that compares no :password where the database must compare: ConfigError."""
    where = "plugins.auth_db.query."
    register_sql = custom.get("auth_on_register") or defaults[password_hash]
    register = prepare(register_sql, placeholder, where + "auth_on_register")
    acls = prepare(custom.get("acls") or defaults["acls"], placeholder, where + "acls")
    if password_hash != "bcrypt" and "password" not in register.names:
        raise ConfigError(
            f"{where}auth_on_register: compares no :password, so any password would do "
            f"(password_hash = {password_hash!r}: the query compares)"
        )
    return register, acls


def row_of(record: Mapping[str, Any]) -> Row:
    """A row by its columns' names (a custom query names them so too); `password` is
    there only when the broker checks it (bcrypt)."""
    return Row(
        record["client_id"],
        record.get("password"),
        record["publish_acl"],
        record["subscribe_acl"],
    )


class SqlBackend:
    """What the SQL backends share: VerneMQ's two lookups (or the user's), by named
    parameters, over the driver's `_fetch` (rows as mappings of their columns)."""

    register: Query  # auth_on_register's rows
    acls: Query  # one row again, by its key

    async def _fetch(self, query: Query, values: Mapping[str, str]) -> list[Any]:
        raise NotImplementedError

    async def rows(
        self, mountpoint: str, client_id: str, username: str, password: str
    ) -> list[Row]:
        values = {"mountpoint": mountpoint, "client_id": client_id, "username": username}
        found = await self._fetch(self.register, {**values, "password": password})
        return [row_of(record) for record in found]

    async def row(self, mountpoint: str, client_id: str, username: str) -> Row | None:
        values = {"mountpoint": mountpoint, "client_id": client_id, "username": username}
        found = await self._fetch(self.acls, values)
        return row_of(found[0]) if found else None
