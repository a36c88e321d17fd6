"""The PostgreSQL backend (asyncpg): VerneMQ's table and queries (vmq_diversity's
postgres.lua), over a pool of `pool_size` connections opened as they are needed (a
database down when the broker starts is no reason not to start).

    crypt:  ... AND password = crypt(:password, password)  (pgcrypto: the database compares)
    bcrypt: the row's password comes back; the broker checks it

`[plugins.auth_db.query]` may replace them (`auth_on_register`, `acls`: the re-read of
one row), with the same named parameters and columns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import asyncpg

from plugins.auth_db.backends import KEY, ROWS, DatabaseError, Query, SqlBackend, sql_queries

_SELECT = "SELECT client_id, publish_acl::TEXT, subscribe_acl::TEXT"
QUERIES = {  # VerneMQ's (postgres.lua), with the plugin's named parameters
    "crypt": f"{_SELECT} {ROWS} AND password = crypt(:password, password)",
    "bcrypt": f"{_SELECT}, password {ROWS}",
    "acls": f"{_SELECT} {KEY}",
}


class PostgresBackend(SqlBackend):
    name = "PostgreSQL"

    def __init__(
        self,
        url: str,
        pool_size: int,
        password_hash: str,
        timeout: float,
        queries: Mapping[str, str] | None = None,
    ) -> None:
        self.url, self.pool_size, self.timeout = url, pool_size, timeout
        self.register, self.acls = sql_queries(password_hash, QUERIES, queries or {}, "${}".format)
        self._pool: Any = None

    async def start(self) -> None:
        self._pool = await asyncpg.create_pool(
            self.url, min_size=0, max_size=self.pool_size, timeout=self.timeout
        )

    async def stop(self) -> None:
        if self._pool is not None:
            try:  # close() waits for every connection to be let go of
                await asyncio.wait_for(self._pool.close(), self.timeout)
            except TimeoutError:
                self._pool.terminate()

    def in_use(self) -> int:
        pool = self._pool
        return 0 if pool is None else pool.get_size() - pool.get_idle_size()

    async def _fetch(self, query: Query, values: Mapping[str, str]) -> list[Any]:
        # asyncpg's own timeouts, for the pool and for the query: it cancels a query that
        # times out by itself (cancelling it from outside waits on the database).
        args = query.arguments(values)
        try:
            async with self._pool.acquire(timeout=self.timeout) as connection:
                return list(await connection.fetch(query.text, *args, timeout=self.timeout))
        except TimeoutError:
            raise DatabaseError(f"{self.name} did not answer in {self.timeout:g} s") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise DatabaseError(f"{self.name}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
