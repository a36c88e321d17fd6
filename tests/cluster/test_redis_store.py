"""plugins/redis_subs/store.py's RedisStore against a real redis-server: the functions of
functions.lua (Courier's staleness and ownership rules), the snapshot and the change
stream, liveness, reaping a dead node, what an unreachable Redis looks like, and calls
on a connection that died under the pool (reset through tests/cluster/proxy.py, or
CLIENT KILL): each is sent again once.

Each test runs one coroutine with `run()` (asyncio.run under a deadline); stores are
opened with `opened()` and closed at the end of the coroutine. Waits poll with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis

from broker.cluster.metadata import (
    Change,
    MetadataUnavailable,
    NotOwner,
    Resync,
    StaleRequest,
    Subscriber,
    Write,
)
from broker.subscription_trie import SubOptions
from plugins.redis_subs.store import FUNCTIONS, RedisStore
from testing.redis_server import RedisServer
from tests.cluster.proxy import TcpProxy

T = TypeVar("T")
TIMEOUT = 5.0  # the longest anything expected may take
PREFIX = "nautilus:"

S1 = SubOptions(1)
S2 = SubOptions(2, no_local=True, retain_as_published=True, retain_handling=2, subscription_id=7)


def run(coroutine: Coroutine[Any, Any, T], timeout: float = 10.0, loop: str = "asyncio") -> T:
    """Run `coroutine` on a new event loop: asyncio's, or uvloop's (the broker's, when
    installed; it fails writes to a dead connection differently)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, timeout)

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(bounded())
    return asyncio.run(bounded())


class Clock:
    """Write timestamps: wall-clock ns, never twice the same (as the Cluster's _ts)."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last = max(time.time_ns(), self.last + 1)
        return self.last


@contextlib.asynccontextmanager
async def opened(url: str, *nodes: str, **options: Any) -> AsyncIterator[list[RedisStore]]:
    """One opened store per node name (each has sent its first heartbeat), all closed
    on the way out."""
    stores = []
    try:
        for node in nodes:
            store = RedisStore(url, **options)
            stores.append(store)
            await store.open(node, f"boot-{node}", f"127.0.0.1:{1000 + len(stores)}")
            await store.heartbeat()
        yield stores
    finally:
        for store in stores:
            await store.close()


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = TIMEOUT) -> T:
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)
    return result


async def take(changes: AsyncIterator[Change], count: int) -> list[Change]:
    """The next `count` changes of the stream, within TIMEOUT."""

    async def collect() -> list[Change]:
        out = []
        async for change in changes:
            out.append(change)
            if len(out) == count:
                break
        return out

    return await asyncio.wait_for(collect(), TIMEOUT)


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def function_libraries(url: str) -> dict[str, dict[bytes, Any]]:
    """name -> FUNCTION LIST's fields (RESP2: flat key, value lists), with the code."""
    with sync_client(url) as client:
        listed = client.function_list(withcode=True)
    out = {}
    for flat in listed:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        out[fields[b"library_name"].decode()] = fields
    return out


def libraries(url: str) -> list[str]:
    return sorted(function_libraries(url))


# --------------------------------------------------------------------------- open


def test_open_loads_the_functions_and_a_second_open_replaces_them(redis_url: str) -> None:
    assert libraries(redis_url) == []

    async def main() -> None:
        async with opened(redis_url, "a", "b") as (a, _):  # b's open loads them again
            assert libraries(redis_url) == ["nautilus"]
            await a.open("a", "boot-a2", "127.0.0.1:1")  # and again, by the same store
            nodes = {info.name: info for info in await a.heartbeat()}
            assert (nodes["a"].address, nodes["a"].boot_id) == ("127.0.0.1:1", "boot-a2")
            assert (nodes["b"].address, nodes["b"].boot_id) == ("127.0.0.1:1002", "boot-b")

    run(main())
    library = function_libraries(redis_url)["nautilus"]
    assert library[b"library_code"].decode() == FUNCTIONS
    names = {dict(zip(f[::2], f[1::2], strict=True))[b"name"] for f in library[b"functions"]}
    assert names == {
        b"nautilus_" + name
        for name in (
            *(b"register", b"set_subscriber", b"delete_subscriber", b"retain"),
            *(b"heartbeat", b"position", b"reap"),
        )
    }


# --------------------------------------------------------------------------- register


def test_register_a_new_client(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            registration = await a.register("c1", False, clock())
            assert registration.previous_node is None
            assert registration.existed is False
            assert registration.subscriptions == {}
            snapshot = await a.snapshot()
            assert snapshot.subscribers == {"c1": Subscriber("a", False, {})}
            again = await a.register("c1", True, clock())  # its own client, again, clean
            assert (again.previous_node, again.existed) == ("a", False)  # nothing resumes
            assert (await a.snapshot()).subscribers["c1"].clean is True

    run(main())


@pytest.mark.parametrize("clean", [False, True])
def test_register_takes_a_client_from_another_node(redis_url: str, clean: bool) -> None:
    async def main() -> None:
        clock = Clock()
        subs = {"x/#": S1, "$share/g/y": S2}
        async with opened(redis_url, "a", "b") as (a, b):
            await a.register("c1", False, clock())
            assert await a.write([Write("c1", Subscriber("a", False, subs), clock())]) == [None]
            registration = await b.register("c1", clean, clock())
            assert registration.previous_node == "a"
            assert registration.existed is not clean  # a clean connect resumes nothing
            assert registration.subscriptions == ({} if clean else subs)
            snapshot = await b.snapshot()
            assert snapshot.subscribers == {"c1": Subscriber("b", clean, {} if clean else subs)}
            # a does not own it any more: its writes about it are refused
            (refused,) = await a.write([Write("c1", Subscriber("a", False, {}), clock())])
            assert isinstance(refused, NotOwner)
            (refused,) = await a.write([Write("c1", None, clock())])
            assert isinstance(refused, NotOwner)
            with sync_client(redis_url) as client:
                assert client.smembers(PREFIX + "node:a") == set()
                assert client.smembers(PREFIX + "node:b") == {b"c1"}

    run(main())


def test_a_clean_session_is_not_resumed_by_a_persistent_register(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            await a.register("c1", True, clock())
            assert await a.write([Write("c1", Subscriber("a", True, {"x": S1}), clock())]) == [None]
            registration = await b.register("c1", False, clock())
            assert registration.previous_node == "a"
            assert registration.existed is False  # MQTT-3.1.2-6: session present 0
            assert registration.subscriptions == {}
            assert (await b.snapshot()).subscribers["c1"] == Subscriber("b", False, {})

    run(main())


def test_register_with_an_older_or_equal_timestamp_is_stale(redis_url: str) -> None:
    async def main() -> None:
        async with opened(redis_url, "a", "b") as (a, b):
            ts = time.time_ns()
            await a.register("c1", False, ts)
            for stale in (ts, ts - 1, ts // 10):  # equal, older, older with fewer digits
                with pytest.raises(StaleRequest):
                    await b.register("c1", False, stale)
            assert (await a.snapshot()).subscribers["c1"].node == "a"
            registration = await b.register("c1", False, ts + 1)
            assert registration.previous_node == "a"

    run(main())


def test_timestamps_compare_as_numbers_not_as_strings(redis_url: str) -> None:
    # Nanoseconds do not fit Lua's doubles: they are compared as digit strings, length
    # first. As plain strings "1000" < "999" and "999" > "1000".
    async def main() -> None:
        async with opened(redis_url, "a") as (a,):
            await a.register("c1", False, 999)
            await a.register("c1", False, 1000)  # newer, though "1000" < "999"
            with pytest.raises(StaleRequest):
                await a.register("c1", False, 999)  # older, though "999" > "1000"
            assert await a.write([Write("c1", Subscriber("a", False, {}), 10**19)]) == [None]
            (refused,) = await a.write([Write("c1", None, 9 * 10**18)])
            assert isinstance(refused, StaleRequest)
            await a.retain([("t", b"m", 1000)])
            await a.retain([("t", None, 999)])  # older: ignored
            assert (await a.snapshot()).retained == {"t": b"m"}
            await a.retain([("t", None, 10**19)])
            assert (await a.snapshot()).retained == {}

    run(main())


# --------------------------------------------------------------------------- write


def test_write_stores_and_deletes_records(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            results = await a.write(
                [
                    Write("c1", Subscriber("a", False, {"x": S1, "y/+": S2}), clock()),
                    Write("c2", Subscriber("a", True, {"z": S1}), clock()),  # created
                    Write("c3", None, clock()),  # not there: nothing to delete
                ]
            )
            assert results == [None, None, None]
            snapshot = await a.snapshot()
            assert snapshot.subscribers == {
                "c1": Subscriber("a", False, {"x": S1, "y/+": S2}),
                "c2": Subscriber("a", True, {"z": S1}),
            }
            assert await a.write([Write("c2", None, clock())]) == [None]
            assert set((await a.snapshot()).subscribers) == {"c1"}

    run(main())


def test_write_refusals_come_back_per_write_in_order(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            await b.register("theirs", False, clock())
            ts = clock()
            await a.write([Write("mine", Subscriber("a", False, {"x": S1}), ts)])
            results = await a.write(
                [
                    Write("mine", Subscriber("a", False, {"y": S1}), ts),  # equal ts
                    Write("theirs", Subscriber("a", False, {"z": S1}), clock()),
                    Write("mine", Subscriber("a", False, {"w": S1}), ts - 5),  # older
                    Write("theirs", None, clock()),
                    Write("mine", Subscriber("a", True, {"v": S2}), clock()),
                    Write("mine", None, ts),  # older than the write just above
                ]
            )
            kinds = [type(r).__name__ if r else None for r in results]
            assert kinds == [
                "StaleRequest",
                "NotOwner",
                "StaleRequest",
                "NotOwner",
                None,
                "StaleRequest",
            ]
            snapshot = await a.snapshot()
            assert snapshot.subscribers == {
                "mine": Subscriber("a", True, {"v": S2}),
                "theirs": Subscriber("b", False, {}),
            }

    run(main())


# --------------------------------------------------------------------------- retain


def test_retain_set_clear_and_staleness(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            ts = clock()
            await a.retain([("r/1", b"\x00one", ts), ("r/2", b"two", clock())])
            assert (await a.snapshot()).retained == {"r/1": b"\x00one", "r/2": b"two"}
            seq = (await a.snapshot()).seq
            await b.retain([("r/1", b"late", ts)])  # equal ts: ignored
            await b.retain([("r/1", None, ts - 1)])  # an older clear: ignored
            assert (await a.snapshot()).retained == {"r/1": b"\x00one", "r/2": b"two"}
            assert (await a.snapshot()).seq == seq  # and no change was emitted
            await b.retain([("r/1", None, clock())])
            assert (await a.snapshot()).retained == {"r/2": b"two"}
            await a.retain([("r/1", b"older", ts + 1)])  # the clear's ts is kept: ignored
            assert (await a.snapshot()).retained == {"r/2": b"two"}
            # In one batch the stale ones are skipped and the others applied, in order.
            await a.retain(
                [
                    ("r/1", b"back", clock()),
                    ("r/2", None, ts),  # stale
                    ("r/3", b"three", clock()),
                    ("r/3", b"three-again", clock()),
                ]
            )
            assert (await a.snapshot()).retained == {
                "r/1": b"back",
                "r/2": b"two",
                "r/3": b"three-again",
            }
            await a.retain([])  # nothing to do

    run(main())


# --------------------------------------------------------------------------- snapshot


def test_snapshot_has_every_record_and_retained_message_and_the_seq(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b", "c") as (a, b, c):
            empty = await a.snapshot()
            assert (empty.seq, empty.subscribers, empty.retained) == (0, {}, {})
            await a.register("ca", False, clock())  # 1
            await a.write([Write("ca", Subscriber("a", False, {"x": S1}), clock())])  # 2
            await b.register("cb", True, clock())  # 3
            await c.write([Write("cc", Subscriber("c", False, {"$share/g/y": S2}), clock())])
            await c.retain([("t", b"m", clock()), ("gone", b"m", clock())])  # 5, 6
            await c.retain([("gone", None, clock())])  # 7
            await c.write([Write("deleted", Subscriber("c", False, {}), clock())])  # 8
            await c.write([Write("deleted", None, clock())])  # 9
            await c.retain([("t", b"refused", 1)])  # stale: no change
            snapshot = await b.snapshot()
            assert snapshot.seq == 9
            assert snapshot.subscribers == {
                "ca": Subscriber("a", False, {"x": S1}),
                "cb": Subscriber("b", True, {}),
                "cc": Subscriber("c", False, {"$share/g/y": S2}),
            }
            assert snapshot.retained == {"t": b"m"}

    run(main())


# --------------------------------------------------------------------------- changes


def test_changes_follow_the_snapshot_in_order(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            await a.register("before", False, clock())  # in the snapshot, not a change
            snapshot = await b.snapshot()
            changes = b.changes(snapshot.seq)
            try:
                # The reader waits in XREAD first: the writes come while it blocks.
                first = asyncio.ensure_future(take(changes, 1))
                await asyncio.sleep(0)
                await a.register("c1", False, clock())
                (change,) = await first
                assert change == Change(
                    snapshot.seq + 1, client_id="c1", subscriber=Subscriber("a", False, {})
                )
                await a.write(
                    [
                        Write("c1", Subscriber("a", False, {"x/+": S1, "$share/g/y": S2}), clock()),
                        Write("c2", Subscriber("a", False, {}), clock()),
                    ]
                )
                await a.retain([("r", b"msg", clock()), ("r", None, clock())])
                await a.write([Write("c2", None, clock())])
                await b.register("c1", False, clock())  # moved to b, subscriptions kept
                got = await take(changes, 6)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]
            assert [c.seq for c in got] == list(range(snapshot.seq + 2, snapshot.seq + 8))
            assert got[0].client_id == "c1"
            assert got[0].subscriber == Subscriber("a", False, {"x/+": S1, "$share/g/y": S2})
            assert (got[1].client_id, got[1].subscriber) == ("c2", Subscriber("a", False, {}))
            assert (got[2].topic, got[2].retained, got[2].client_id) == ("r", b"msg", "")
            assert (got[3].topic, got[3].retained) == ("r", None)
            assert (got[4].client_id, got[4].subscriber) == ("c2", None)
            assert got[5].subscriber == Subscriber("b", False, {"x/+": S1, "$share/g/y": S2})

    run(main())


def test_changes_after_a_seq_skip_what_the_snapshot_had(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            for i in range(3):
                await a.register(f"c{i}", False, clock())
            # A store that took no snapshot reads the stream from its start.
            changes = b.changes(2)
            try:
                got = await take(changes, 1)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]
            assert [(c.seq, c.client_id) for c in got] == [(3, "c2")]

    run(main())


def test_a_missing_change_raises_resync(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            await a.register("c1", False, clock())
            snapshot = await b.snapshot()
            changes = b.changes(snapshot.seq)
            try:
                await a.register("c2", False, clock())
                (change,) = await take(changes, 1)
                assert (change.seq, change.client_id) == (snapshot.seq + 1, "c2")
                with sync_client(redis_url) as client:
                    client.incr(PREFIX + "seq")  # a change that never reaches the stream
                await a.register("c3", False, clock())
                with pytest.raises(Resync, match=f"{snapshot.seq + 2} expected"):
                    await take(changes, 1)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]

    run(main())


def test_a_change_stream_that_starts_again_from_one_raises_resync(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            for i in range(3):
                await a.register(f"old{i}", False, clock())
            snapshot = await b.snapshot()
            changes = b.changes(snapshot.seq)
            try:
                with sync_client(redis_url) as client:
                    client.flushall()  # the functions survive FLUSHALL; keys do not
                for i in range(5):
                    await a.register(f"new{i}", False, clock())
                with pytest.raises(Resync):
                    await take(changes, 1)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]

    run(main())


# --------------------------------------------------------------------------- liveness


def test_heartbeat_lists_every_node_with_its_age(redis_url: str) -> None:
    async def main() -> None:
        async with opened(redis_url, "a", "b") as (a, b):
            infos = {info.name: info for info in await a.heartbeat()}
            assert set(infos) == {"a", "b"}
            assert (infos["b"].address, infos["b"].boot_id) == ("127.0.0.1:1002", "boot-b")
            assert 0 <= infos["a"].age < 0.5
            assert 0 <= infos["b"].age < 1.0
            first = infos["b"].age

            async def b_older() -> float:
                ages = {info.name: info.age for info in await a.heartbeat()}
                assert ages["a"] < 0.5  # refreshed by every call
                return ages["b"] if ages["b"] >= first + 0.1 else 0.0

            grown = await eventually(b_older)
            # It keeps growing while b is silent; b's heartbeat resets it.
            await eventually(lambda: _age_above(a, "b", grown))
            await b.heartbeat()
            ages = {info.name: info.age for info in await a.heartbeat()}
            assert ages["b"] < grown

    run(main())


async def _age_above(store: RedisStore, node: str, age: float) -> bool:
    return {i.name: i.age for i in await store.heartbeat()}[node] > age


# --------------------------------------------------------------------------- reaping


async def _populate_b(b: RedisStore, clock: Clock) -> None:
    await b.register("clean1", True, clock())
    await b.register("clean2", True, clock())
    await b.write([Write("clean2", Subscriber("b", True, {"c": S1}), clock())])
    await b.register("p1", False, clock())
    await b.write([Write("p1", Subscriber("b", False, {"x/#": S1, "$share/g/y": S2}), clock())])
    await b.write([Write("p2", Subscriber("b", False, {}), clock())])


def test_reap_refused_while_the_node_is_fresh_then_takes_its_sessions(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with (
            opened(redis_url, "a", dead_after=0.2) as (a,),
            opened(redis_url, "b", "c") as (b, c),
        ):
            await _populate_b(b, clock)
            await c.register("elsewhere", False, clock())
            assert await a.reap("b", 100) == []  # b's heartbeat is fresh
            assert set((await a.snapshot()).subscribers) == {
                "clean1",
                "clean2",
                "p1",
                "p2",
                "elsewhere",
            }
            snapshot = await a.snapshot()
            changes = a.changes(snapshot.seq)
            try:
                # b stays silent: once dead_after (0.2 s) has passed, a may reap it.
                moved = await eventually(lambda: a.reap("b", 100))
                assert moved is not None
                assert sorted(moved, key=lambda item: item[0]) == [
                    ("p1", Subscriber("a", False, {"x/#": S1, "$share/g/y": S2})),
                    ("p2", Subscriber("a", False, {})),
                ]
                got = await take(changes, 4)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]
            assert [change.seq for change in got] == list(range(snapshot.seq + 1, snapshot.seq + 5))
            assert {change.client_id: change.subscriber for change in got} == {
                "clean1": None,
                "clean2": None,
                "p1": Subscriber("a", False, {"x/#": S1, "$share/g/y": S2}),
                "p2": Subscriber("a", False, {}),
            }
            snapshot = await a.snapshot()
            assert snapshot.subscribers == {
                "p1": Subscriber("a", False, {"x/#": S1, "$share/g/y": S2}),
                "p2": Subscriber("a", False, {}),
                "elsewhere": Subscriber("c", False, {}),
            }
            assert "b" in {info.name for info in await a.heartbeat()}  # not forgotten yet
            assert await a.reap("b", 100) is None  # nothing left: b is forgotten
            assert {info.name for info in await a.heartbeat()} == {"a", "c"}
            # b, back with its old view, owns nothing any more
            (refused,) = await b.write([Write("p1", Subscriber("b", False, {}), clock())])
            assert isinstance(refused, NotOwner)
            # a owns the moved sessions: it may write them, and a register finds them there
            assert await a.write([Write("p2", Subscriber("a", False, {"z": S1}), clock())]) == [
                None
            ]
            registration = await c.register("p1", False, clock())
            assert (registration.previous_node, registration.existed) == ("a", True)
            assert registration.subscriptions == {"x/#": S1, "$share/g/y": S2}

    run(main())


def test_reap_in_batches_and_refused_once_the_node_is_back(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b", dead_after=60) as (a, b):
            for i in range(5):
                await b.write([Write(f"p{i}", Subscriber("b", False, {}), clock())])
            with sync_client(redis_url) as client:  # b last seen 10 minutes ago
                seconds, micros = client.time()
                now_ms = seconds * 1000 + micros // 1000
                client.zadd(PREFIX + "cluster", {"b": now_ms - 600_000})
            assert {i.name: i.age for i in await a.heartbeat()}["b"] >= 600
            first = await a.reap("b", 2)
            assert first is not None and len(first) == 2
            second = await a.reap("b", 2)
            assert second is not None and len(second) == 2
            assert not {cid for cid, _ in first} & {cid for cid, _ in second}
            await b.heartbeat()  # b is back before the last one was taken
            assert await a.reap("b", 2) == []
            snapshot = await a.snapshot()
            owners = sorted(record.node for record in snapshot.subscribers.values())
            assert owners == ["a", "a", "a", "a", "b"]
            assert "b" in {info.name for info in await a.heartbeat()}

    run(main())


def test_reaping_a_node_that_owns_nothing_forgets_it(redis_url: str) -> None:
    async def main() -> None:
        async with opened(redis_url, "a", "b", dead_after=60) as (a, b):
            with sync_client(redis_url) as client:
                client.zadd(PREFIX + "cluster", {"b": 0})
            assert await a.reap("b", 10) is None
            assert {i.name for i in await a.heartbeat()} == {"a"}
            await b.heartbeat()  # a forgotten node that comes back is known again
            assert {i.name for i in await a.heartbeat()} == {"a", "b"}

    run(main())


# --------------------------------------------------------------------------- functions gone


def test_functions_are_loaded_again_when_redis_lost_them(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: a.heartbeat(),
                lambda: a.register("c1", False, clock()),
                lambda: a.reap("nobody", 10),
                lambda: a.snapshot(),
            ]
            for call in calls:
                with sync_client(redis_url) as client:
                    client.function_flush()
                assert libraries(redis_url) == []
                await call()
                assert libraries(redis_url) == ["nautilus"]
            snapshot = await a.snapshot()
            assert snapshot.subscribers == {"c1": Subscriber("a", False, {})}

    run(main())


def test_write_loads_the_functions_again_when_redis_lost_them(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            with sync_client(redis_url) as client:
                client.function_flush()
            assert await a.write([Write("c1", Subscriber("a", False, {}), clock())]) == [None]
            assert (await a.snapshot()).subscribers == {"c1": Subscriber("a", False, {})}

    run(main())


def test_retain_loads_the_functions_again_when_redis_lost_them(redis_url: str) -> None:
    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            with sync_client(redis_url) as client:
                client.function_flush()
            await a.retain([("t", b"m", clock())])
            assert (await a.snapshot()).retained == {"t": b"m"}

    run(main())


# --------------------------------------------------------------------------- unreachable


def _assert_one_line_naming(exc: BaseException, where: str) -> str:
    message = str(exc)
    assert where in message
    assert "\n" not in message
    return message


def test_unavailable_when_redis_stops(own_redis: RedisServer) -> None:
    where = f"127.0.0.1:{own_redis.port}"

    async def main() -> None:
        clock = Clock()
        async with opened(own_redis.url, "a") as (a,):
            await a.register("c1", False, clock())
            snapshot = await a.snapshot()
            await asyncio.to_thread(own_redis.stop)
            operations: list[Callable[[], Awaitable[Any]]] = [
                lambda: a.heartbeat(),
                lambda: a.register("c2", False, clock()),
                lambda: a.write([Write("c1", None, clock())]),
                lambda: a.retain([("t", b"m", clock())]),
                lambda: a.snapshot(),
                lambda: a.reap("b", 1),
                lambda: take(a.changes(snapshot.seq), 1),
                lambda: a.open("a", "boot", "127.0.0.1:1"),
            ]
            for operation in operations:
                with pytest.raises(MetadataUnavailable) as caught:
                    await operation()
                _assert_one_line_naming(caught.value, where)

    run(main())


def test_unavailable_message_has_no_credentials(own_redis: RedisServer) -> None:
    url = f"redis://user:secret@127.0.0.1:{own_redis.port}/0"
    own_redis.stop()

    async def main() -> None:
        store = RedisStore(url)
        try:
            with pytest.raises(MetadataUnavailable) as caught:
                await store.open("a", "boot", "127.0.0.1:1")
            message = _assert_one_line_naming(caught.value, f"127.0.0.1:{own_redis.port}")
            assert "secret" not in message
            assert "user" not in message
        finally:
            await store.close()

    run(main())


def test_wrong_credentials_are_unavailable_without_the_password(redis_url: str) -> None:
    url = redis_url.replace("redis://", "redis://user:secret@")

    async def main() -> None:
        store = RedisStore(url)
        try:
            with pytest.raises(MetadataUnavailable) as caught:
                await store.open("a", "boot", "127.0.0.1:1")
            assert "secret" not in str(caught.value)
        finally:
            await store.close()

    run(main())


def test_unavailable_message_has_no_password_from_the_query(own_redis: RedisServer) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0?password=secret"
    own_redis.stop()

    async def main() -> None:
        store = RedisStore(url)
        try:
            with pytest.raises(MetadataUnavailable) as caught:
                await store.open("a", "boot", "127.0.0.1:1")
            assert "secret" not in str(caught.value)
        finally:
            await store.close()

    run(main())


# --------------------------------------------------------------------------- dead connections


def _through(proxy: TcpProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


async def _reset_connections(proxy: TcpProxy) -> None:
    """Every connection through the proxy reset (an RST each way), then new ones pass.
    The store's pooled connection is dead but looks fine to its pool until used."""
    await asyncio.to_thread(proxy.reset)
    await asyncio.to_thread(proxy.pass_through)


# Each kind of call: a function (FCALL), a pipeline of functions, plain commands and
# pipelines of them (snapshot), and the one that keeps an answer for a second sending.
DEAD_CONNECTION_CALLS: dict[str, Callable[[RedisStore, Clock], Awaitable[Any]]] = {
    "heartbeat (FCALL)": lambda a, clock: a.heartbeat(),
    "register (pipeline)": lambda a, clock: a.register("c1", False, clock()),
    "write (pipeline)": lambda a, clock: a.write(
        [Write("c1", Subscriber("a", False, {}), clock())]
    ),
    "retain (pipeline)": lambda a, clock: a.retain([("t", b"m", clock())]),
    "snapshot (commands, pipelines)": lambda a, clock: a.snapshot(),
    "subscribers (pipelines)": lambda a, clock: a.subscribers(),
    "reap (FCALL)": lambda a, clock: a.reap("gone", 10),
}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("call", DEAD_CONNECTION_CALLS)
def test_a_call_on_a_connection_reset_under_the_pool_is_sent_again(
    redis_server: RedisServer,
    redis_url: str,
    start_proxy: Callable[..., TcpProxy],
    call: str,
    loop: str,
) -> None:
    """The probe's "Error UNKNOWN while writing to socket. Connection lost.": a pooled
    connection that died while idle made the next call fail, and a CONNECT with it.
    (Under uvloop the write raises RuntimeError "... the handler is closed" instead.)"""
    proxy = start_proxy(("127.0.0.1", redis_server.port))

    async def main() -> None:
        clock = Clock()
        async with opened(_through(proxy), "a") as (a,):
            await _reset_connections(proxy)
            await DEAD_CONNECTION_CALLS[call](a, clock)
            await _reset_connections(proxy)  # and again: each call gets its retry
            await DEAD_CONNECTION_CALLS[call](a, clock)

    run(main(), loop=loop)


def test_a_call_is_sent_again_once_only(
    redis_server: RedisServer, redis_url: str, start_proxy: Callable[..., TcpProxy]
) -> None:
    """With every connection reset as it comes, the call fails (MetadataUnavailable) at
    once: one retry, no backoff, no loop."""
    proxy = start_proxy(("127.0.0.1", redis_server.port))

    async def main() -> None:
        clock = Clock()
        async with opened(_through(proxy), "a") as (a,):
            await asyncio.to_thread(proxy.reset)  # and stays so
            for operation in (
                lambda: a.heartbeat(),
                lambda: a.register("c1", False, clock()),
                lambda: a.snapshot(),
            ):
                started = time.monotonic()
                with pytest.raises(MetadataUnavailable):
                    await operation()
                assert time.monotonic() - started < 1.0

    run(main())


def test_a_blocked_change_read_whose_connection_is_killed_reads_on(redis_url: str) -> None:
    """CLIENT KILL of the connection waiting in XREAD: the read is sent again from the
    same position, and the change written meanwhile arrives (no MetadataUnavailable,
    which would make the node reload everything)."""

    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b") as (a, b):
            seq = (await a.snapshot()).seq
            changes = a.changes(seq)
            reading = asyncio.ensure_future(take(changes, 2))
            with sync_client(redis_url) as admin:

                async def blocked() -> list[int]:
                    listed = await asyncio.to_thread(admin.client_list)
                    return [int(c["id"]) for c in listed if c.get("cmd") == "xread"]

                (xread,) = await eventually(blocked)
                assert await asyncio.to_thread(admin.client_kill_filter, _id=xread) == 1
                await b.register("c1", False, clock())
                await eventually(lambda: blocked())  # it reads again, on a new connection
                await b.register("c2", False, clock())
            got = await reading
            assert [(change.seq, change.client_id) for change in got] == [
                (seq + 1, "c1"),
                (seq + 2, "c2"),
            ]

    run(main())


def test_client_kill_of_every_pooled_connection(redis_url: str) -> None:
    """CLIENT KILL TYPE normal from another connection: the store's calls go on."""

    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            await a.register("c1", False, clock())
            with sync_client(redis_url) as admin:
                assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            assert (await a.register("c1", False, clock())).previous_node == "a"
            assert set((await a.snapshot()).subscribers) == {"c1"}

    run(main())


def test_a_reap_sent_twice_answers_the_same(redis_url: str) -> None:
    """A reap whose answer was lost with its connection is sent again with the same
    timestamp: the second gets the first's answer (the sessions it moved), not the next
    batch nor "done"."""

    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a", "b", dead_after=60) as (_, b):
            for i in range(3):
                await b.write([Write(f"p{i}", Subscriber("b", False, {"t": S1}), clock())])
            with sync_client(redis_url) as client:
                client.zadd(PREFIX + "cluster", {"b": 0})  # long dead
                ts = clock()

                def reap() -> Any:
                    return client.fcall("nautilus_reap", 0, PREFIX, "b", "a", 2, 60_000, ts)

                first = reap()
                assert first[0] == b"moved" and len(first) == 5
                assert reap() == first  # the same call again: the same answer
                ts = clock()  # a new call: the next batch, then done
                third = reap()
                assert third[0] == b"moved" and len(third) == 3
                assert set(third[1::2]).isdisjoint(first[1::2])
                ts = clock()
                assert reap() == [b"done"]
                assert client.exists(PREFIX + "reaped:b") == 0

    run(main())


def test_a_cleared_retained_topic_leaves_nothing_once_its_clear_is_old(redis_url: str) -> None:
    """A clear is remembered 60 s (an older set arriving late is refused meanwhile), then
    the topic has no key or field left: no tombstone per topic ever retained."""

    async def main() -> None:
        clock = Clock()
        async with opened(redis_url, "a") as (a,):
            await a.retain([("gone", b"m", clock()), ("kept", b"k", clock())])
            cleared_at = clock()
            await a.retain([("gone", None, cleared_at)])
            redis = a.redis
            p = a.prefix
            assert not await redis.hexists(p + "retain_ts", "gone")
            assert await redis.hget(p + "retain_cleared_ts", "gone") == str(cleared_at).encode()
            await a.retain([("gone", b"late", cleared_at - 1)])  # older than the clear
            assert (await a.snapshot()).retained == {"kept": b"k"}
            # 61 s later (the clear's time moved back instead of waiting): the next
            # retain call forgets it.
            await redis.zadd(p + "retain_cleared", {"gone": 0})
            await a.retain([("kept", b"k2", clock())])
            assert not await redis.hexists(p + "retain_cleared_ts", "gone")
            assert await redis.zcard(p + "retain_cleared") == 0
            assert await redis.hkeys(p + "retain_ts") == [b"kept"]

    run(main())
