"""The MySQL and MariaDB backend (asyncmy): VerneMQ's table and queries (vmq_diversity's
mysql.lua), over a pool of `pool_size` connections opened as they are needed (a database
down when the broker starts is no reason not to start).

    password: ... AND password = PASSWORD(:password)  (the database hashes and compares;
    md5:      ... AND password = MD5(:password)       MySQL 8 has no PASSWORD() any more)
    sha1:     ... AND password = SHA1(:password)
    sha256:   ... AND password = SHA2(:password, 256)
    bcrypt:   the row's password comes back; the broker checks it

`[plugins.auth_db.query]` may replace them, as with PostgreSQL.

A query cut off by query_timeout takes its connection with it (asyncmy closes one
cancelled mid-answer), so its late answer is never read as another query's. asyncmy was
chosen over aiomysql by measurement (bench/auth_db_drivers.py, docs/performance.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncmy
from asyncmy.cursors import DictCursor
from asyncmy.errors import MySQLError

from broker.config import ConfigError
from plugins.auth_db.backends import KEY, ROWS, DatabaseError, Query, SqlBackend, sql_queries

_SELECT = "SELECT client_id, publish_acl, subscribe_acl"
QUERIES = {  # VerneMQ's (mysql.lua), with the plugin's named parameters
    "password": f"{_SELECT} {ROWS} AND password = PASSWORD(:password)",
    "md5": f"{_SELECT} {ROWS} AND password = MD5(:password)",
    "sha1": f"{_SELECT} {ROWS} AND password = SHA1(:password)",
    "sha256": f"{_SELECT} {ROWS} AND password = SHA2(:password, 256)",
    "bcrypt": f"{_SELECT}, password {ROWS}",
    "acls": f"{_SELECT} {KEY}",
}


def connect_args(url: str) -> dict[str, Any]:
    """asyncmy's arguments from `mysql://user:password@host:port/database`."""
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigError(f"plugins.auth_db.url: {exc}") from None
    database = unquote(parts.path.lstrip("/"))
    if (
        parts.scheme != "mysql"
        or not parts.hostname
        or not database
        or "/" in database
        or parts.query  # no options: none would be applied
    ):
        raise ConfigError(
            f"plugins.auth_db.url: expected mysql://user:password@host:port/database, got {url!r}"
        )
    return {
        "host": parts.hostname,
        "port": port,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": database,
    }


class MysqlBackend(SqlBackend):
    name = "MySQL"

    def __init__(
        self,
        url: str,
        pool_size: int,
        password_hash: str,
        timeout: float,
        queries: Mapping[str, str] | None = None,
    ) -> None:
        self.pool_size, self.timeout = pool_size, timeout
        self.connect_args = connect_args(url)
        # asyncmy's placeholders are %s (so a literal % in a query of yours is %%).
        self.register, self.acls = sql_queries(
            password_hash, QUERIES, queries or {}, lambda _: "%s"
        )
        self._pool: Any = None

    async def start(self) -> None:
        # minsize 0: no connection is opened here. autocommit: each SELECT sees the rows
        # as they are now (in a transaction it would keep its first snapshot).
        self._pool = await asyncmy.create_pool(
            minsize=0, maxsize=self.pool_size, autocommit=True, **self.connect_args
        )

    async def stop(self) -> None:
        if self._pool is not None:
            self._pool.close()
            try:  # waits for every connection to be let go of, and says goodbye on each
                await asyncio.wait_for(self._pool.wait_closed(), self.timeout)
            except TimeoutError:
                self._pool.terminate()

    def in_use(self) -> int:
        pool = self._pool
        return 0 if pool is None else pool.size - pool.freesize

    async def _fetch(self, query: Query, values: Mapping[str, str]) -> list[Any]:
        try:
            async with asyncio.timeout(self.timeout):
                async with self._pool.acquire() as conn, conn.cursor(DictCursor) as cursor:
                    await cursor.execute(query.text, query.arguments(values))
                    return list(await cursor.fetchall())
        except TimeoutError:
            raise DatabaseError(f"{self.name} did not answer in {self.timeout:g} s") from None
        except (OSError, MySQLError) as exc:
            raise DatabaseError(f"{self.name}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """asyncmy's (code, message) as "message (code)"."""
    args = exc.args
    text = f"{args[1]} ({args[0]})" if len(args) == 2 and isinstance(args[0], int) else str(exc)
    return " ".join(text.split()) or type(exc).__name__
