"""The Redis backend (redis-py): VerneMQ's keys (vmq_diversity's redis.lua). The key is
the JSON array `[mountpoint, client_id, username]` (`*` as client_id: the default
entry), the value a JSON object `{"passhash": <bcrypt>, "publish_acl": [...],
"subscribe_acl": [...]}`; passwords are bcrypt, checked by the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from plugins.auth_db.backends import DEFAULT_ROW, DatabaseError, Row


def key(mountpoint: str, client_id: str, username: str) -> str:
    """The key as VerneMQ's Lua json.encode writes it: no spaces."""
    return json.dumps([mountpoint, client_id, username], separators=(",", ":"))


class RedisBackend:
    name = "Redis"

    def __init__(self, url: str, pool_size: int, password_hash: str, timeout: float) -> None:
        self.url, self.pool_size, self.timeout = url, pool_size, timeout
        self._client: Any = None

    async def start(self) -> None:
        # A blocking pool: a request beyond pool_size waits for a connection (redis-py's
        # default pool raises "Too many connections" instead).
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=self.pool_size,
            timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            socket_timeout=self.timeout,
        )
        self._client = aioredis.Redis(connection_pool=pool)

    async def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(TimeoutError):  # its connections are dropped anyway
                await asyncio.wait_for(self._client.aclose(), self.timeout)

    async def rows(
        self, mountpoint: str, client_id: str, username: str, password: str
    ) -> list[Row]:
        keys = [key(mountpoint, client_id, username), key(mountpoint, DEFAULT_ROW, username)]
        values = await self._call(self._client.mget(keys))
        return [
            _row(cid, value)
            for cid, value in zip((client_id, DEFAULT_ROW), values, strict=True)
            if value is not None
        ]

    async def row(self, mountpoint: str, client_id: str, username: str) -> Row | None:
        value = await self._call(self._client.get(key(mountpoint, client_id, username)))
        return None if value is None else _row(client_id, value)

    def in_use(self) -> int:
        pool = None if self._client is None else self._client.connection_pool
        return len(getattr(pool, "_in_use_connections", ()))

    async def _call(self, command: Any) -> Any:
        try:
            return await asyncio.wait_for(command, self.timeout)
        except TimeoutError:
            raise DatabaseError(f"{self.name} did not answer in {self.timeout:g} s") from None
        except (OSError, RedisError) as exc:
            raise DatabaseError(f"{self.name}: {' '.join(str(exc).split())}") from None


def _row(client_id: str, value: bytes) -> Row:
    try:
        entry = json.loads(value)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        raise DatabaseError(f"Redis: the value of {client_id!r} is not a JSON object")
    return Row(
        client_id, entry.get("passhash"), entry.get("publish_acl"), entry.get("subscribe_acl")
    )
