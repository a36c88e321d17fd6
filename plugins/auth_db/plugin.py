"""auth_on_register, auth_on_publish and auth_on_subscribe (and their _m5 twins) from a
database: VerneMQ's vmq_diversity auth scripts, without Lua.

- CONNECT: NEXT without a username and password, or when no row of (mountpoint,
  client_id or `*`, username) has that password (another plugin may know the client;
  an exhausted chain refuses). Ok when one has: its ACLs are cached for the connection.
  Error("server_unavailable") (CONNACK 3 / 0x88), and one log line, when the database
  cannot answer within query_timeout: never a hang.
- PUBLISH / SUBSCRIBE of a client this plugin let in: decided from the cached ACLs, with
  no query (so they go on while the database is down). A PUBLISH no ACL allows:
  Error("not_authorized"); an allowed one with the ACL's modifiers, if it has any. A
  SUBSCRIBE: each filter on its own (refused ones get 0x87 / 0x80). A client another
  plugin let in: NEXT.
- The cache entry goes with the session (on_client_offline, on_client_gone,
  on_session_expired); `invalidate()` re-reads connected clients' ACLs at once, and with
  cache_ttl they are re-read in the background when older than that.
- A PUBLISH decision holds (`cache_for`, hooks/decisions.py) until the client's ACLs are
  due to be re-read (cache_ttl; for ever without one), and ACLs re-read different call
  `forget_decisions()`. A client with a `max_payload_size` ACL is decided per message
  (the answer depends on the payload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

from broker.protocol import ReasonCode
from hooks import (
    FOREVER,
    NEXT,
    ClientContext,
    Error,
    Metric,
    Ok,
    PublishContext,
    RegisterContext,
    Result,
    SubscribeContext,
    forget_decisions,
)
from plugins.auth_db.acl import NO_LIMIT, AclError, Acls, parse_acls
from plugins.auth_db.backends import Backend, DatabaseError, Row, chosen
from plugins.auth_db.cache import AclCache, Entry, Key
from plugins.auth_db.config import AuthDbConfig
from plugins.auth_db.passwords import bcrypt_matches

log = logging.getLogger("nautilus.plugins.auth_db")

UNAVAILABLE = Error("server_unavailable", int(ReasonCode.SERVER_UNAVAILABLE))
INVALID_ACL = Error("invalid_acl")
NOT_AUTHORIZED = Error("not_authorized")
REFUSED = int(ReasonCode.NOT_AUTHORIZED)
_OK = Ok()
T = TypeVar("T")


def make_backend(config: AuthDbConfig) -> Backend:
    """The configured backend; its driver is imported here, only when chosen (a missing
    one: the plugin is skipped with one line naming the fix)."""
    args = (config.url, config.pool_size, config.password_hash, float(config.query_timeout))
    if config.backend == "postgres":
        from plugins.auth_db.postgres_backend import PostgresBackend

        return PostgresBackend(*args, config.query)
    if config.backend == "mysql":
        from plugins.auth_db.mysql_backend import MysqlBackend

        return MysqlBackend(*args, config.query)
    from plugins.auth_db.redis_backend import RedisBackend  # the config allows no other

    return RedisBackend(*args)


class AuthDbPlugin:
    Config = AuthDbConfig

    def __init__(self, config: AuthDbConfig, backend: Backend | None = None) -> None:
        self.config = config
        self.backend = backend if backend is not None else make_backend(config)
        self.cache = AclCache()
        self.counts: Counter[str] = Counter()  # metrics: queries, errors, hits, misses
        self.query_seconds = 0.0
        self.timeout = float(config.query_timeout)
        self._refresher: asyncio.Task[None] | None = None
        self._down = False  # the last query failed: log the next success once
        self._abandoned: set[asyncio.Task[Any]] = set()  # queries nobody waits for

    async def start(self) -> None:
        await self.backend.start()
        if self.config.cache_ttl:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        for query in list(self._abandoned):
            query.cancel()  # still letting go of their connections: the pool closes them
        await self.backend.stop()

    # -- hooks ----------------------------------------------------------------------------

    async def auth_on_register(self, ctx: RegisterContext) -> Result:
        if ctx.username is None or ctx.password is None:
            return NEXT
        password = ctx.password.decode("utf-8", "replace")
        try:
            rows = await self._query(
                self.backend.rows(ctx.mountpoint, ctx.client_id, ctx.username, password)
            )
        except DatabaseError:
            return UNAVAILABLE
        if self.config.password_hash != "bcrypt":
            row = chosen(rows)  # the database compared: only the matching rows came back
        else:
            # Every row, with its hash: one without a hash (NULL) matches no password.
            verified = await asyncio.to_thread(_verify, ctx.password, rows)
            row = chosen(rows, verified)
        if row is None:
            return NEXT
        try:
            acls = _acls(row, ctx.mountpoint, ctx.client_id, ctx.username)
        except AclError as exc:
            log.error(
                "auth_db: the row (%r, %r, %r): %s",
                ctx.mountpoint,
                row.client_id,
                ctx.username,
                exc,
            )
            return INVALID_ACL
        key = (ctx.mountpoint, ctx.client_id)
        self.cache.put(
            key, Entry(ctx.username, row.client_id, ctx.session_id, acls, time.monotonic())
        )
        return _OK

    auth_on_register_m5 = auth_on_register

    def auth_on_publish(self, ctx: PublishContext) -> Result:
        entry = self.cache.get((ctx.mountpoint, ctx.client_id))
        if entry is None:
            self.counts["cache_misses"] += 1
            return NEXT
        self.counts["cache_hits"] += 1
        acl = entry.acls.for_publish(ctx.topic, ctx.qos, len(ctx.payload), ctx.retain)
        holds = self._holds(entry)
        if holds is None:
            if acl is None:
                return NOT_AUTHORIZED
            return Ok(acl.modifiers) if acl.modifiers else _OK
        if acl is None:
            return Error("not_authorized", cache_for=holds)
        return Ok(acl.modifiers, cache_for=holds)

    def _holds(self, entry: Entry) -> float | None:
        """How long a publish decision from `entry` holds: until its ACLs are due to be
        re-read; None when it depends on the payload (a max_payload_size)."""
        if any(acl.max_payload_size != NO_LIMIT for acl in entry.acls.publish):
            return None
        ttl = float(self.config.cache_ttl)
        if not ttl:
            return FOREVER
        return max(entry.loaded_at + ttl - time.monotonic(), 0.0)

    auth_on_publish_m5 = auth_on_publish

    def auth_on_subscribe(self, ctx: SubscribeContext) -> Result:
        entry = self.cache.get((ctx.mountpoint, ctx.client_id))
        if entry is None:
            self.counts["cache_misses"] += 1
            return NEXT
        self.counts["cache_hits"] += 1
        granted = [
            (t.topic, t.qos if entry.acls.for_subscribe(t.topic, t.qos) else REFUSED)
            for t in ctx.topics
        ]
        if all(code == REFUSED for _, code in granted):
            return NOT_AUTHORIZED
        if any(code == REFUSED for _, code in granted):
            return Ok({"topics": granted})
        return _OK

    auth_on_subscribe_m5 = auth_on_subscribe

    def on_client_offline(self, ctx: ClientContext) -> None:
        self.cache.drop((ctx.mountpoint, ctx.client_id), ctx.session_id)

    on_client_gone = on_session_expired = on_client_offline

    # -- run-time control -----------------------------------------------------------------

    async def invalidate(self, client_id: str | None = None, username: str | None = None) -> int:
        """Re-read the ACLs of the connected clients of `client_id` and/or `username` (all
        without either) now; the number re-read (the `invalidate` side door: `nautilus
        admin auth invalidate`). A row that is gone leaves the client nothing to publish
        or subscribe to; a database that cannot answer: DatabaseError, the ACLs kept."""
        entries = list(self.cache.select(client_id, username))
        for key, entry in entries:
            await self._reload(key, entry)
        return len(entries)

    async def _refresh_forever(self) -> None:
        ttl = float(self.config.cache_ttl)
        while True:
            await asyncio.sleep(min(ttl, 1.0))
            for key, entry in self.cache.older_than(time.monotonic() - ttl):
                with contextlib.suppress(DatabaseError):  # kept as it is; next round
                    await self._reload(key, entry)

    async def _reload(self, key: Key, entry: Entry) -> None:
        row = await self._query(self.backend.row(key[0], entry.row_client_id, entry.username))
        try:
            acls = Acls() if row is None else _acls(row, key[0], key[1], entry.username)
        except AclError as exc:
            log.error("auth_db: re-reading %r: %s; the client keeps nothing", key, exc)
            acls = Acls()
        current = self.cache.get(key)
        if current is entry:  # still that connection's (not replaced meanwhile)
            if acls != entry.acls:
                forget_decisions()  # the broker's kept publish decisions used the old ones
            entry.acls, entry.loaded_at = acls, time.monotonic()

    async def _query(self, call: Coroutine[Any, Any, T]) -> T:
        started = time.perf_counter()
        self.counts["queries"] += 1
        try:
            result = await self._within_timeout(call)
        except DatabaseError as exc:
            self.counts["errors"] += 1
            if not self._down:
                log.error(
                    "auth_db: %s; CONNECTs are refused (server unavailable) until it answers", exc
                )
            self._down = True
            raise
        finally:
            self.query_seconds += time.perf_counter() - started
        if self._down:
            log.warning("auth_db: the database answers again")
            self._down = False
        return result

    async def _within_timeout(self, call: Coroutine[Any, Any, T]) -> T:
        """`call`'s answer within query_timeout, whatever the driver waits on. The
        backends bound each step with it (acquiring a pooled connection, connecting, the
        query), but a driver may wait on the database again to let go of a connection
        whose query timed out (asyncpg's cancel request and reset, asyncmy's cursor
        reading what is left): on a hung database a CONNECT waited twice query_timeout
        and more. So the query runs as a task of its own; one that is late is cancelled
        and left to let go of its connection in the background."""
        query = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({query}, timeout=self.timeout)
        except asyncio.CancelledError:  # the CONNECT went (its client closed)
            self._abandon(query)
            raise
        if not done:
            self._abandon(query)
            raise DatabaseError(f"{self.backend.name} did not answer in {self.timeout:g} s")
        return query.result()

    def _abandon(self, query: asyncio.Task[Any]) -> None:
        query.cancel()
        self._abandoned.add(query)
        query.add_done_callback(self._forget)

    def _forget(self, query: asyncio.Task[Any]) -> None:
        self._abandoned.discard(query)
        if not query.cancelled():
            query.exception()  # an answer, or an error, too late for anyone: not logged

    # -- metrics --------------------------------------------------------------------------

    def metrics(self) -> list[Metric]:
        counts = self.counts
        return [
            Metric("auth_db_queries", counts["queries"], help="queries sent to the database"),
            Metric(
                "auth_db_query_errors", counts["errors"], help="queries that failed or timed out"
            ),
            Metric(
                "auth_db_query_seconds", self.query_seconds, help="time spent waiting for queries"
            ),
            Metric(
                "auth_db_cache_hits",
                counts["cache_hits"],
                help="publishes and subscribes decided from the cache",
            ),
            Metric(
                "auth_db_cache_misses",
                counts["cache_misses"],
                help="publishes and subscribes of clients not in the cache",
            ),
            Metric(
                "auth_db_cache_entries",
                len(self.cache),
                "gauge",
                help="connected clients with cached ACLs",
            ),
            Metric(
                "auth_db_pool_in_use",
                self.backend.in_use(),
                "gauge",
                help="database connections busy",
            ),
        ]


def _verify(password: bytes, rows: list[Row]) -> list[bool]:
    """Each row's bcrypt hash against the password (in a thread: bcrypt is slow)."""
    return [bcrypt_matches(password, row.passhash) for row in rows]


def _acls(row: Row, mountpoint: str, client_id: str, username: str) -> Acls:
    return Acls(
        parse_acls(row.publish_acl, "publish_acl", mountpoint, client_id, username),
        parse_acls(row.subscribe_acl, "subscribe_acl", mountpoint, client_id, username),
    )
