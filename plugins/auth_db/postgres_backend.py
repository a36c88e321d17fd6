"""The PostgreSQL backend (asyncpg): VerneMQ's table and queries (vmq_diversity's
postgres.lua), over a pool of `pool_size` connections opened as they are needed (a
database down when the broker starts is no reason not to start).

    crypt:  ... AND password = crypt($4, password)    (pgcrypto: the database compares)
    bcrypt: the row's password comes back; the broker checks it
"""

from __future__ import annotations

from typing import Any

import asyncpg

from plugins.auth_db.backends import DatabaseError, Row

_COLUMNS = "client_id, publish_acl::TEXT, subscribe_acl::TEXT"
_WHERE = "mountpoint = $1 AND (client_id = $2 OR client_id = '*') AND username = $3"
CRYPT = f"SELECT {_COLUMNS} FROM vmq_auth_acl WHERE {_WHERE} AND password = crypt($4, password)"
BCRYPT = f"SELECT {_COLUMNS}, password FROM vmq_auth_acl WHERE {_WHERE}"
_KEY = "mountpoint = $1 AND client_id = $2 AND username = $3"
ONE = f"SELECT {_COLUMNS} FROM vmq_auth_acl WHERE {_KEY}"


class PostgresBackend:
    def __init__(self, url: str, pool_size: int, password_hash: str, timeout: float) -> None:
        self.url, self.pool_size, self.timeout = url, pool_size, timeout
        self.client_side = password_hash == "bcrypt"
        self._pool: Any = None

    async def start(self) -> None:
        self._pool = await asyncpg.create_pool(
            self.url, min_size=0, max_size=self.pool_size, timeout=self.timeout
        )

    async def stop(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def rows(
        self, mountpoint: str, client_id: str, username: str, password: str
    ) -> list[Row]:
        if self.client_side:
            found = await self._fetch(BCRYPT, mountpoint, client_id, username)
            return [Row(r[0], r[3], r[1], r[2]) for r in found]
        found = await self._fetch(CRYPT, mountpoint, client_id, username, password)
        return [Row(r[0], None, r[1], r[2]) for r in found]

    async def row(self, mountpoint: str, client_id: str, username: str) -> Row | None:
        found = await self._fetch(ONE, mountpoint, client_id, username)
        return Row(found[0][0], None, found[0][1], found[0][2]) if found else None

    def in_use(self) -> int:
        pool = self._pool
        return 0 if pool is None else pool.get_size() - pool.get_idle_size()

    async def _fetch(self, query: str, *args: str) -> list[Any]:
        # asyncpg's own timeouts, for the pool and for the query: it cancels a query that
        # times out by itself (cancelling it from outside waits on the database).
        try:
            async with self._pool.acquire(timeout=self.timeout) as connection:
                return list(await connection.fetch(query, *args, timeout=self.timeout))
        except TimeoutError:
            raise DatabaseError(f"PostgreSQL did not answer in {self.timeout:g} s") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise DatabaseError(f"PostgreSQL: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
