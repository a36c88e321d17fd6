"""Fixtures of the event relay tests: a real broker (in-process, tests/conftest.py) with
the relay serving on 127.0.0.1 port 0, real MQTT clients, and the real RelayClient.

The relay is read on the test thread's own asyncio loop (`asyncio.run`) while the broker
runs on its loop in its thread; blocking MQTT steps are run with `asyncio.to_thread` so
the relay connection keeps reading meanwhile. Every wait for an event is
`asyncio.wait_for` with a timeout; broker state is awaited with `server.wait_for`.
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from event_relay import frames
from event_relay.client import RelayClient
from event_relay.plugin import EventRelay
from event_relay.server import Consumer
from plugins.passwd.hashes import make_hash
from tests.broker.helpers import RawClient, paho_client, publish_packet, raw_client, unique_id
from tests.conftest import BrokerThread
from tests.test_cli import start_process

__all__ = ["paho_client", "raw_client", "start_process"]  # fixtures, used by name

WAIT = 5.0  # the longest one expected event (or frame) may take
# No heartbeats (tests/event_relay/test_heartbeat.py has them): these tests count every
# event of the log, and a quiet second in one would add one.
RELAY = {"enabled": True, "address": "127.0.0.1:0", "heartbeat_interval": 0}
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
RELAY_LISTENING = re.compile(r"event relay listening on 127\.0\.0\.1:(\d+)\b")

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}
# `topic` lines before any `user` line hold for everyone; no rule allows secret/#.
ACL = """\
topic ev/# label fleet
topic plain/#
topic metered/# label metered
pattern write clients/%c/# label own
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- the broker


@dataclass
class RelayBroker:
    """A started in-process broker with the relay; passed to paho_client / raw_client."""

    server: BrokerThread
    plugin: EventRelay

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> tuple[str, int]:
        assert self.plugin.server is not None and self.plugin.server.address is not None
        return self.plugin.server.address

    def next_seq(self) -> int:
        return self.server.call(lambda: self.plugin.log.next_seq)

    def consumer(self, name: str) -> Consumer:
        """The server side of the consumer named `name` (waited for)."""
        assert self.plugin.server is not None
        relay_server = self.plugin.server
        self.server.wait_for(lambda: any(c.name == name for c in relay_server.consumers))
        return next(c for c in list(relay_server.consumers) if c.name == name)

    async def connect(self, **kwargs: Any) -> RelayClient:
        kwargs.setdefault("name", unique("consumer"))
        return await RelayClient.connect(*self.address, **kwargs)

    def read_all(
        self, until: Callable[[dict[str, Any]], bool] | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """Every event from the earliest on: up to the first one `until` accepts, then on
        to the last one the log held at that moment."""

        async def scenario() -> list[dict[str, Any]]:
            kwargs.setdefault("start", "earliest")
            async with await self.connect(**kwargs) as client:
                stream = Stream(client)
                events = await stream.until(until) if until is not None else []
                last = await asyncio.to_thread(self.next_seq) - 1
                if not events or events[-1]["seq"] < last:
                    events += await stream.until(lambda e: e["seq"] >= last)
                return events

        return asyncio.run(scenario())


@pytest.fixture
def relay_broker(start_broker) -> Callable[..., RelayBroker]:
    """relay_broker(relay={...event_relay keys}, **other config sections)."""

    def start(relay: dict[str, Any] | None = None, **sections: Any) -> RelayBroker:
        server = start_broker(event_relay={**RELAY, **(relay or {})}, **sections)
        plugin = dict(server.broker.plugins)["event_relay"]
        return RelayBroker(server, plugin)

    return start


# A sampling rule makes the relay record with the Python recorder (event_relay/recorder.py)
# instead of the compiled one; this one samples nothing out (no message has the label).
PYTHON_RECORDER = {"sample": {"on_publish": {"no-such-label": 0}}}


RECORDERS = ["compiled", "python"]


def with_recorder(relay_broker: Any, recorder: str, **sections: Any) -> RelayBroker:
    """A relay broker recording with `recorder` (the compiled one when it was built)."""
    relay = PYTHON_RECORDER if recorder == "python" else None
    broker: RelayBroker = relay_broker(relay=relay, **sections)
    module = type(broker.plugin._recorder).__module__
    if recorder == "python":
        assert module == "event_relay.recorder"
    elif module == "event_relay.recorder":
        pytest.skip("the compiled recorder is not built")
    return broker


@pytest.fixture
def fleet_files(tmp_path: Path) -> dict[str, str]:
    """A password file (alice, bob) and an ACL file with labels."""
    passwd = tmp_path / "passwd"
    passwd.write_text("".join(f"{u}:{make_hash(p.encode())}\n" for u, p in PASSWORDS.items()))
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return {"passwd": str(passwd), "acl": str(acl)}


def fleet_plugins(files: dict[str, str]) -> dict[str, Any]:
    return {
        "passwd": {"enabled": True, "password_file": files["passwd"]},
        "acl": {"enabled": True, "acl_file": files["acl"]},
    }


# --------------------------------------------------------------------------- traffic


def flood(broker: RelayBroker, count: int, payload: bytes = b"x", topic: str = "flood/x") -> int:
    """A raw client connects, sends `count` QoS 0 publishes nobody subscribed to in one
    write, and disconnects: 3 + 2 * count events (register, wakeup, on_publish and
    on_message_drop each, gone). Returns once the relay has them all: the next sequence."""
    target = broker.next_seq() + 3 + 2 * count
    pub = RawClient(broker.host, broker.port)
    try:
        pub.connect(unique_id("flood"))
        pub.send(b"".join(publish_packet(topic, payload) for _ in range(count)))
        pub.disconnect()
    finally:
        pub.close()
    plugin = broker.plugin
    broker.server.wait_for(lambda: plugin.log.next_seq >= target)
    assert broker.next_seq() == target
    return target


def one_publish(broker: RelayBroker, topic: str = "sentinel/x", payload: bytes = b"s") -> None:
    pub = RawClient(broker.host, broker.port)
    try:
        pub.connect(unique_id("one"))
        pub.publish(topic, payload, qos=1)
        pub.disconnect()
    finally:
        pub.close()


# --------------------------------------------------------------------------- reading


class Stream:
    """A streaming RelayClient's events, one at a time, each awaited with a timeout.
    (One iterator for the connection's life: a batch is never dropped half read.)"""

    def __init__(self, client: RelayClient) -> None:
        self.client = client
        self._events: AsyncIterator[dict[str, Any]] = aiter(client)

    async def next(self, timeout: float = WAIT) -> dict[str, Any]:
        return await asyncio.wait_for(anext(self._events), timeout)

    async def take(self, count: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        return [await self.next(timeout) for _ in range(count)]

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT
    ) -> list[dict[str, Any]]:
        """The events up to and including the first `predicate` accepts."""
        events = []
        while True:
            event = await self.next(timeout)
            events.append(event)
            if predicate(event):
                return events


def fields(event: dict[str, Any]) -> dict[str, Any]:
    """An event without the fields no test can know in advance (seq, ts, session_id),
    and without `node`, which the client adds to each event: the broker's default name."""
    assert event["node"] == "nautilus"
    return {k: v for k, v in event.items() if k not in ("seq", "ts", "session_id", "node")}


def assert_gap_free(events: list[dict[str, Any]], first: int | None = None) -> None:
    seqs = [e["seq"] for e in events]
    start = seqs[0] if first is None else first
    assert seqs == list(range(start, start + len(seqs))), seqs


# --------------------------------------------------------------------------- raw frames


class RawConsumer:
    """A consumer speaking the frames over a plain blocking socket."""

    def __init__(self, address: tuple[str, int], rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect(address)
        self.reader = frames.FrameReader(frames.MAX_EVENTS_FRAME)
        self.received: list[tuple[bytes, Any]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, **body: Any) -> None:
        self.send(frames.frame(frames.HELLO, {"version": frames.VERSION, **body}))

    def frame(self) -> tuple[bytes, Any]:
        """The next frame (fails on EOF or timeout)."""
        while not self.received:
            data = self.sock.recv(1 << 20)
            assert data, "the relay closed the connection"
            self.received += self.reader.feed(data)
        return self.received.pop(0)

    def until_eof(self) -> list[tuple[bytes, Any]]:
        """Every frame until the relay closes the connection (fails after WAIT)."""
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                got, self.received = self.received, []
                return got
            self.received += self.reader.feed(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_consumer() -> Iterator[Callable[..., RawConsumer]]:
    made: list[RawConsumer] = []

    def make(address: tuple[str, int], rcvbuf: int | None = None) -> RawConsumer:
        consumer = RawConsumer(address, rcvbuf)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()
