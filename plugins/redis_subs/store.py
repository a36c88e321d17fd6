"""The cluster's metadata in Redis: the MetadataBackend of broker/cluster/metadata.py.

Every write runs in one of the Redis functions of functions.lua (atomic, with Courier's
staleness and ownership rules); reads of the whole state are pipelined. Nodes follow the
change stream (a Redis Stream whose entries carry a gap-free sequence number) with a
blocking XREAD on a connection of their own.

Every call is sent again, once and at once, when its connection turns out to be dead
(redis-py's Retry, see RETRY): a pooled connection that Redis, a restart of it or the
network closed is found only when used. Each call is safe to send twice: see RETRY.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from broker.cluster.metadata import (
    Change,
    MetadataUnavailable,
    NodeInfo,
    NotOwner,
    Registration,
    Resync,
    Snapshot,
    StaleRequest,
    Subscriber,
    Write,
    pack_subscriptions,
    unpack_subscriptions,
)

log = logging.getLogger("nautilus.redis_subs")

FUNCTIONS = resources.files("plugins.redis_subs").joinpath("functions.lua").read_text("utf-8")
BLOCK_MS = 1000  # one XREAD waits at most this long, so a closing node is not held up
READ_COUNT = 1000  # changes read per XREAD

# A call whose connection fails (ConnectionError: reset, closed, refused; or uvloop's
# RuntimeError "unable to perform operation on <TCPTransport closed=True ...>; the
# handler is closed", which a write to a connection that the peer reset raises instead
# of an OSError: MagicStack/uvloop#506) is sent once more at once, on a new connection.
# A timeout is not retried (a Redis that does not answer would only be waited for
# twice). A call may thus reach Redis twice, when the connection died after Redis ran it
# and before its answer came: each is safe so.
#   nautilus_register, _set_subscriber, _delete_subscriber, _retain: the second carries
#     the first's timestamp, so the staleness rule refuses it (stale_request) and nothing
#     is applied or announced twice. The caller sees the refusal: a registration is
#     refused (the client is refused with 0x88, as it was before the retry, and its next
#     CONNECT finds this node the owner; a node it was taken from releases it on the
#     change), a record write is written again with a new timestamp (sync.py), a retained
#     message's refusal is ignored. A delete whose record is gone answers 0, no error.
#   nautilus_heartbeat (it sets this node's entries again), nautilus_position, FUNCTION
#     LOAD REPLACE, and the reads (HGETALL, HKEYS, ZRANGE, SMEMBERS, HMGET, XREAD from
#     the same stream position) change nothing.
#   nautilus_reap: the second with the same node and timestamp gets the first's answer
#     again (functions.lua keeps it a minute), so the sessions it moved are adopted.
RETRY_ON: tuple[type[Exception], ...] = (RedisConnectionError, RuntimeError)
# redis-py types supported_errors as its own errors; it catches whatever it is given.
RETRY = Retry(NoBackoff(), 1, supported_errors=RETRY_ON)  # type: ignore[arg-type]
# What a failed call raises, turned into MetadataUnavailable (after its retry).
FAILURES = (RedisError, OSError, RuntimeError)


def _version(text: str) -> tuple[int, ...]:
    """redis-py's version as numbers ("5.0.1" -> (5, 0, 1); "5.1.0b4" -> (5, 1, 0))."""
    numbers = []
    for part in text.split(".")[:3]:
        digits = re.match(r"\d+", part)
        numbers.append(int(digits[0]) if digits else 0)
    return tuple(numbers)


# redis-py retries a pipeline on a ConnectionError from 5.0.2 on (redis-py #3134); 5.0.1,
# the lowest version allowed, only a single command: its pipelines are retried here.
PIPELINES_RETRIED = _version(redis.__version__) >= (5, 0, 2)


class RedisStore:
    """One node's connection to the cluster's Redis (or to its Sentinel-managed master)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "nautilus:",
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_master: str = "mymaster",
        database: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
        dead_after: float = 3.0,
    ) -> None:
        self.prefix = prefix
        self.timeout = timeout
        self.dead_ms = int(dead_after * 1000)
        self.where = (
            f"Redis Sentinel {sentinel_master} via {sentinels[0][0]}:{sentinels[0][1]}"
            if sentinels
            else _without_credentials(url)
        )
        options: dict[str, Any] = dict(
            socket_connect_timeout=timeout,
            socket_timeout=None,
            username=username,
            password=password,
            # No PING before a command on an idle connection: it would cost a round trip
            # on a CONNECT's path and still miss a connection that dies under a command;
            # the retry covers both.
            health_check_interval=0,
            retry=RETRY,
            retry_on_error=list(RETRY_ON),  # 5.0.x retries a command only on these
        )
        if sentinels:
            sentinel = Sentinel(sentinels, **options)
            self.redis = sentinel.master_for(sentinel_master, db=database)
        else:
            self.redis = aioredis.from_url(url, **options)
        self.node = ""
        self._info = ""
        self._stream_id = "0-0"
        # register() calls waiting for this loop turn's pipeline, and pipelines under way
        self._registrations: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._register_tasks: set[asyncio.Task[None]] = set()

    async def _call(self, function: str, *args: Any) -> Any:
        try:
            return await self.redis.fcall(function, 0, self.prefix, *args)
        except ResponseError as exc:
            message = str(exc)
            if "stale_request" in message:
                raise StaleRequest(message) from None
            if "unauthorized" in message:
                raise NotOwner(message) from None
            if "Function not found" in message:  # Redis restarted empty: load them again
                await self._load_functions()
                return await self._call(function, *args)
            raise MetadataUnavailable(f"{self.where}: {message}") from None
        except FAILURES as exc:
            raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None

    async def _load_functions(self) -> None:
        try:
            await self.redis.function_load(FUNCTIONS, replace=True)
        except ResponseError as exc:
            raise MetadataUnavailable(
                f"{self.where}: cannot load the cluster's functions ({exc}); Redis 7 or "
                "later is needed"
            ) from None
        except FAILURES as exc:
            raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None

    # -- MetadataBackend ---------------------------------------------------------------

    async def open(self, node: str, boot_id: str, address: str) -> None:
        self.node = node
        self._info = f"{address}\n{boot_id}"
        log.info("cluster metadata: Redis at %s", self.where)
        try:  # a Redis that takes the connection and never answers would hold the start
            await asyncio.wait_for(self._load_functions(), self.timeout)
        except TimeoutError:
            raise MetadataUnavailable(
                f"{self.where}: no answer within {self.timeout:g} s "
                "(plugins.redis_subs.connect_timeout)"
            ) from None

    async def close(self) -> None:
        await self.redis.aclose()

    async def heartbeat(self) -> list[NodeInfo]:
        now, live, nodes = await self._call("nautilus_heartbeat", self.node, self._info)
        seen = {
            name.decode(): float(score) for name, score in zip(live[::2], live[1::2], strict=True)
        }
        infos = []
        for name, info in zip(nodes[::2], nodes[1::2], strict=True):
            name = name.decode()
            address, _, boot_id = info.decode().partition("\n")
            last = seen.get(name)
            age = (now - last) / 1000 if last is not None else float("inf")
            infos.append(NodeInfo(name, address, boot_id, age))
        return infos

    async def register(self, client_id: str, clean: bool, ts: int) -> Registration:
        """Registrations of one event-loop turn go to Redis in one pipeline: a connect
        storm costs a round trip per turn, not per client."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = ("nautilus_register", client_id, self.node, int(clean), ts)
        self._registrations.append((call, future))
        if len(self._registrations) == 1:
            task = loop.create_task(self._register_batch())
            self._register_tasks.add(task)
            task.add_done_callback(self._register_tasks.discard)
        reply = await future
        if isinstance(reply, Exception):
            if "stale_request" in str(reply):
                raise StaleRequest(str(reply))
            if isinstance(reply, MetadataUnavailable):
                raise reply
            raise MetadataUnavailable(f"{self.where}: {reply}")
        previous, existed, subs = reply
        return Registration(previous.decode() or None, bool(existed), unpack_subscriptions(subs))

    async def _register_batch(self) -> None:
        await asyncio.sleep(0)  # the rest of this turn's registrations join the batch
        batch, self._registrations = self._registrations, []
        replies: list[Any]
        try:
            replies = await self._pipeline([call for call, _ in batch])
        except Exception as exc:  # whatever it is, no CONNECT may wait for ever
            if not isinstance(exc, MetadataUnavailable):
                log.exception("%s: registering %d clients failed", self.where, len(batch))
            replies = [exc] * len(batch)
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)

    async def _execute(
        self, build: Callable[[Pipeline], None], *, raise_on_error: bool = True
    ) -> list[Any]:
        """One pipeline (not a transaction) that `build` fills, and its replies. Sent once
        more on a dead connection, as every call is."""
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=False)
            build(pipe)
            try:
                return await pipe.execute(raise_on_error=raise_on_error)
            except RETRY_ON:
                if PIPELINES_RETRIED or attempt == 2:  # redis-py has sent it again already
                    raise
        raise AssertionError("unreachable")

    async def _pipeline(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """FCALLs in one round trip; the functions are loaded again if Redis lost them."""

        def build(pipe: Pipeline) -> None:
            for function, *args in calls:
                pipe.fcall(function, 0, self.prefix, *args)

        for attempt in (1, 2):
            try:
                replies = await self._execute(build, raise_on_error=False)
            except FAILURES as exc:
                raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None
            lost = any(
                isinstance(r, ResponseError) and "Function not found" in str(r) for r in replies
            )
            if not lost or attempt == 2:
                return replies
            await self._load_functions()
        raise AssertionError("unreachable")

    async def write(self, writes: list[Write]) -> list[Exception | None]:
        calls: list[tuple[Any, ...]] = []
        for write in writes:
            record = write.subscriber
            if record is None:
                calls.append(("nautilus_delete_subscriber", write.client_id, self.node, write.ts))
            else:
                subscriptions = pack_subscriptions(record.subscriptions)
                calls.append(
                    (
                        "nautilus_set_subscriber",
                        write.client_id,
                        self.node,
                        int(record.clean),
                        write.ts,
                        subscriptions,
                    )
                )
        results: list[Exception | None] = []
        for reply in await self._pipeline(calls):
            if not isinstance(reply, Exception):
                results.append(None)
            elif "stale_request" in str(reply):
                results.append(StaleRequest(str(reply)))
            elif "unauthorized" in str(reply):
                results.append(NotOwner(str(reply)))
            else:
                raise MetadataUnavailable(f"{self.where}: {reply}")
        return results

    async def retain(self, changes: list[tuple[str, bytes | None, int]]) -> None:
        calls: list[tuple[Any, ...]] = []
        for topic, message, ts in changes:
            args = (topic, ts) if message is None else (topic, ts, message)
            calls.append(("nautilus_retain", *args))
        for reply in await self._pipeline(calls):
            if isinstance(reply, Exception) and "stale_request" not in str(reply):
                raise MetadataUnavailable(f"{self.where}: {reply}")

    async def snapshot(self) -> Snapshot:
        seq, stream_id = await self._call("nautilus_position")
        subscribers = await self.subscribers()
        try:
            retained = await self.redis.hgetall(self.prefix + "retain")
        except FAILURES as exc:
            raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None
        self._stream_id = stream_id.decode()  # changes() reads on from here
        return Snapshot(
            seq, subscribers, {topic.decode(): message for topic, message in retained.items()}
        )

    async def subscribers(self) -> dict[str, Subscriber]:
        try:
            nodes = {n.decode() for n in await self.redis.hkeys(self.prefix + "nodes")}
            nodes.update(
                n.decode() for n in await self.redis.zrange(self.prefix + "cluster", 0, -1)
            )

            def owned_by_each(pipe: Pipeline) -> None:
                for node in sorted(nodes):
                    pipe.smembers(f"{self.prefix}node:{node}")

            owned = await self._execute(owned_by_each)
            client_ids = sorted({m.decode() for members in owned for m in members})

            def records_of_each(pipe: Pipeline) -> None:
                for client_id in client_ids:
                    pipe.hmget(f"{self.prefix}sub:{client_id}", "node", "clean", "subs")

            records = await self._execute(records_of_each)
        except FAILURES as exc:
            raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None
        return {
            client_id: Subscriber(node.decode(), clean == b"1", unpack_subscriptions(subs))
            for client_id, (node, clean, subs) in zip(client_ids, records, strict=True)
            if node is not None
        }

    async def changes(self, after: int) -> AsyncIterator[Change]:
        """The changes after number `after`, read from the last snapshot's position in
        the stream (or from its start, without a snapshot); Resync on a gap."""
        expected = after + 1
        stream = self.prefix + "changes"
        # Only a read from the stream's start meets changes the caller has already: after
        # a snapshot's position every entry follows its number, and one that does not
        # means the stream was trimmed past us or Redis lost its data.
        may_skip = self._stream_id == "0-0"
        while True:
            try:
                reply = await self.redis.xread(
                    {stream: self._stream_id}, count=READ_COUNT, block=BLOCK_MS
                )
            except FAILURES as exc:
                raise MetadataUnavailable(f"{self.where}: {exc or type(exc).__name__}") from None
            for _, entries in reply:
                for entry_id, fields in entries:
                    seq = int(fields[b"s"])
                    if seq < expected and may_skip:
                        self._stream_id = entry_id.decode()
                        continue
                    if seq != expected:
                        raise Resync(f"change {expected} expected, {seq} found")
                    may_skip = False
                    self._stream_id = entry_id.decode()
                    expected += 1
                    yield _change(seq, fields)

    async def reap(self, dead: str, limit: int) -> list[tuple[str, Subscriber]] | None:
        # Only a node dead for dead_after is reaped: the caller's own view of that is
        # checked again inside Redis, against Redis's clock (a node that came back wins).
        ts = time.time_ns()
        reply = await self._call("nautilus_reap", dead, self.node, limit, self.dead_ms, ts)
        kind = reply[0]
        if kind == b"done":
            return None
        if kind == b"alive":
            return []
        return [
            (client_id.decode(), Subscriber(self.node, False, unpack_subscriptions(subs)))
            for client_id, subs in zip(reply[1::2], reply[2::2], strict=True)
        ]


def _without_credentials(url: str) -> str:
    """Where a url points, for messages: no user, password or query (which may hold one)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    where = f"{parts.hostname}:{parts.port or 6379}"
    return where + parts.path if parts.path not in ("", "/") else where


def _change(seq: int, fields: dict[bytes, bytes]) -> Change:
    if b"t" in fields:
        return Change(seq, topic=fields[b"t"].decode(), retained=fields.get(b"d"))
    client_id = fields[b"c"].decode()
    if b"n" not in fields:
        return Change(seq, client_id=client_id)
    record = Subscriber(
        fields[b"n"].decode(), fields[b"k"] == b"1", unpack_subscriptions(fields[b"d"])
    )
    return Change(seq, client_id=client_id, subscriber=record)
