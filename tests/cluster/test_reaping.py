"""The reaping node takes a dead node's persistent session without a gap, whichever way
round it hears about it: the reap's answer (its own Redis call) and the change stream
announcing the move (another connection) arrive in either order, and other nodes route
the session's messages to it from the moment their change stream names it.

Regression tests: the change stream came first (nearly always, on loopback), dropped the
route to the dead node, and until the reap's answer adopted the session nothing matched
its messages: test_kill_9_under_qos1_load lost what was published in that gap. And a
message another node forwarded before this node had the session matched nothing either.

One node, `a`, runs in-process (tests/conftest.py's start_broker) against the session's
redis-server; the dead node `c` is only a record written there as `c` would write it.
RedisStore.reap and RedisStore.changes are wrapped to hold the reap's answer and the
change for the session until the test lets them go, so the order is the test's choice."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from broker.cluster import frames
from broker.cluster.frames import PING, PONG, PUBLISH, WELCOME
from broker.cluster.metadata import Change, SubOptions, Subscriber, Write
from broker.message import Message
from plugins.redis_subs.store import RedisStore
from tests.broker.helpers import PahoClient
from tests.cluster.nodes import cluster_of, handshake, read_frames, start_in_process_node

CLIENT = "reaped-sub"
WAIT = 10.0
DEAD_AFTER = 1.0


class Gates:
    """Points where the reaping node waits for the test: `held[name]` is set when it
    gets there, and it goes on once `release[name]` is set (set up front: no wait)."""

    def __init__(self, *names: str) -> None:
        self.held = {name: threading.Event() for name in names}
        self.release = {name: threading.Event() for name in names}

    async def wait(self, name: str) -> None:
        self.held[name].set()
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, self.release[name].wait, WAIT), name

    def reached(self, name: str) -> None:
        assert self.held[name].wait(WAIT), f"the reaping node did not get to {name}"

    def open(self) -> None:
        for event in self.release.values():
            event.set()


@pytest.fixture
def gates(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gates]:
    """The reap's answer ("answer") and the change that names `a` as the owner of CLIENT
    ("change") wait for the test."""
    gates = Gates("answer", "change")
    reap, changes = RedisStore.reap, RedisStore.changes

    async def held_reap(self: RedisStore, dead: str, limit: int) -> Any:
        moved = await reap(self, dead, limit)
        if moved:
            await gates.wait("answer")
        return moved

    async def held_changes(self: RedisStore, after: int) -> AsyncIterator[Change]:
        async for change in changes(self, after):
            record = change.subscriber
            if change.client_id == CLIENT and record is not None and record.node == "a":
                await gates.wait("change")
            yield change

    monkeypatch.setattr(RedisStore, "reap", held_reap)
    monkeypatch.setattr(RedisStore, "changes", held_changes)
    try:
        yield gates
    finally:
        gates.open()  # a failed test leaves nothing waiting


def write_dead_node(redis_url: str) -> None:
    """Node c's record of CLIENT (persistent, subscribed to load/#), and c's liveness
    entry, refreshed once: c is dead DEAD_AFTER later."""

    async def write() -> None:
        store = RedisStore(redis_url, dead_after=DEAD_AFTER)
        await store.open("c", "c-boot", "127.0.0.1:9")  # nothing listens there
        await store.heartbeat()
        record = Subscriber("c", False, {"load/#": SubOptions(1)})
        assert await store.write([Write(CLIENT, record, time.time_ns())]) == [None]
        await store.close()

    asyncio.run(write())


def adopted(server: Any) -> bool:
    return CLIENT in server.broker.registry


def reaped(server: Any) -> bool:
    """The reap's answer is in: the session adopted and counted."""
    return adopted(server) and server.broker.metrics.cluster_sessions_reaped == 1


def resume(server: Any) -> PahoClient:
    client = PahoClient(server.host, server.port, client_id=CLIENT)
    assert client.connect(clean=False).session_present
    return client


def test_a_publish_between_the_change_and_the_reap_answer_is_queued(
    start_broker: Any, redis_url: str, gates: Gates
) -> None:
    write_dead_node(redis_url)
    server = start_in_process_node(start_broker, redis_url, dead_after=DEAD_AFTER)
    cluster = cluster_of(server)
    server.wait_for(lambda: CLIENT in cluster.view.records)  # routed to c
    gates.release["change"].set()
    gates.reached("answer")  # c reaped in Redis, the answer held
    server.wait_for(lambda: CLIENT not in cluster.view.records)  # the change is applied
    publisher = PahoClient(server.host, server.port)
    publisher.connect()
    publisher.publish("load/1", b"between", 1)  # acknowledged: it must arrive
    gates.release["answer"].set()
    server.wait_for(lambda: reaped(server))
    subscriber = resume(server)
    try:
        assert subscriber.expect_message().payload == b"between"
    finally:
        subscriber.close()
        publisher.close()


def test_a_message_forwarded_before_the_adoption_is_kept(
    start_broker: Any, redis_url: str, gates: Gates
) -> None:
    write_dead_node(redis_url)
    server = start_in_process_node(start_broker, redis_url, dead_after=DEAD_AFTER)
    cluster = cluster_of(server)
    server.wait_for(lambda: CLIENT in cluster.view.records)
    gates.reached("answer")
    gates.reached("change")
    assert not adopted(server)
    # Another node, b, already knows that a owns the session (its change stream was
    # quicker) and forwards a message for it; the PONG says a has read it.
    message = Message("load/2", b"forwarded", 1, sender="elsewhere")
    data = frames.encode(PUBLISH, frames.pack_message(message, time.monotonic())) + frames.encode(
        PING, 1
    )
    with socket.create_connection(cluster.address, timeout=WAIT) as sock:
        welcome, _ = handshake(sock, "b", cluster.node)
        assert welcome[0][0] == WELCOME, welcome
        sock.sendall(data)
        got, closed = read_frames(sock, WAIT, lambda got: [PONG, 1] in got)
        assert [PONG, 1] in got, (got, closed)
    gates.open()
    server.wait_for(lambda: reaped(server))
    subscriber = resume(server)
    try:
        assert subscriber.expect_message().payload == b"forwarded"
    finally:
        subscriber.close()
