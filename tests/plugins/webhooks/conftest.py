"""Fixtures for the webhooks tests: a real aiohttp endpoint and brokers that call it.

`hook_server` is an aiohttp web server on 127.0.0.1 (ephemeral port) running on its own
event loop in a thread. It records every request per path, thread-safely, and answers
each path as the test told it (`answer(path, ...)`); a test waits for a request with
`expect(path)`, which blocks on a queue with a timeout, never on a sleep. An answer with
`hold=True` never comes (until teardown): that is how a slow endpoint is made.

`webhooks_broker(*endpoints, ...)` starts a Nautilus with the plugin enabled;
`paho_client(...)` makes paho clients that can send a username and password.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import queue
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.broker.helpers import (
    QUIET,
    TIMEOUT,
    paho_client,
    raw_client,
)

__all__ = ["paho_client", "raw_client"]

OK = {"result": "ok"}
NEXT = {"result": "next"}


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


@dataclass
class Recorded:
    """One request the endpoint received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: tuple[str, int]  # the caller's address: one port per connection

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def hook(self) -> str | None:
        return self.headers.get("vernemq-hook")


@dataclass
class Answer:
    body: Any = field(default_factory=lambda: OK)  # dict/list: JSON; bytes/str: as is
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: bool = False  # never answer (until teardown)


Responder = Answer | Callable[[Recorded], Answer]


class HookServer:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._queues: dict[str, queue.Queue[Recorded]] = defaultdict(queue.Queue)
        self._counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._answers: dict[str, Responder] = {}
        self._release: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(TIMEOUT), "the webhook endpoint did not start"

    # -- the server (its own loop and thread)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._runner.cleanup())
        self.loop.close()

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        recorded = Recorded(
            request.method,
            request.path,
            dict(request.headers),
            await request.read(),
            request.transport.get_extra_info("peername")[:2],
        )
        responder = self._answers.get(request.path, Answer())
        answer = responder(recorded) if callable(responder) else responder
        with self._lock:
            self._counts[request.path] += 1
        self._queues[request.path].put(recorded)
        if answer.hold:
            await self._release.wait()
        body = answer.body
        if isinstance(body, dict | list):
            body = json.dumps(body)
        return web.Response(body=body, status=answer.status, headers=answer.headers)

    # -- the test's side

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path: str, responder: Responder | dict | None = None, **kw: Any) -> str:
        """Answer `path` with a JSON body / Answer / function; returns the path's URL."""
        if responder is None or isinstance(responder, dict | list):
            responder = Answer(OK if responder is None else responder, **kw)
        self._answers[path] = responder
        return self.url(path)

    def expect(self, path: str, timeout: float = TIMEOUT) -> Recorded:
        try:
            return self._queues[path].get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no request to {path} arrived in time") from None

    def expect_none(self, path: str, timeout: float = QUIET) -> None:
        with contextlib.suppress(queue.Empty):
            got = self._queues[path].get(timeout=timeout)
            raise AssertionError(f"unexpected request to {path}: {got.body!r}")

    def count(self, path: str) -> int:
        with self._lock:
            return self._counts[path]

    def close(self) -> None:
        def stop() -> None:
            self._release.set()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self._thread.join(TIMEOUT)


@pytest.fixture
def hook_server() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def refused_url(path: str = "/hook") -> str:
    """A URL on a loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


@pytest.fixture
def webhooks_broker(start_broker):
    """webhooks_broker(*endpoints, anonymous=False, broker={}, **plugin keys)."""

    def start(*endpoints: dict, anonymous: bool = False, broker=None, **keys: Any):
        plugin = {"enabled": True, "endpoints": list(endpoints), **keys}
        settings = {"allow_anonymous": anonymous, **(broker or {})}
        return start_broker(broker=settings, plugins={"webhooks": plugin})

    return start


def plugin_of(server) -> Any:
    """The running WebhooksPlugin of a broker started by webhooks_broker."""
    return dict(server.broker.plugins)["webhooks"]


def settle_events(server) -> None:
    """Wait (on the broker's loop) until the event posts in flight have finished."""

    async def settle() -> None:
        plugin = plugin_of(server)
        while plugin._events:
            await asyncio.wait(set(plugin._events))

    server.call(settle)
