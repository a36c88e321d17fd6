"""A JWKS endpoint for the tests: aiohttp on 127.0.0.1, an ephemeral port, its own loop.

The test thread changes what it serves (`serve`, `fail`) and waits for requests
(`wait_requests`) without sleeping: every request notifies a condition.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

TIMEOUT = 5.0


class JwksServer:
    def __init__(self) -> None:
        self.requests = 0
        self._keys: list[dict[str, Any]] = []
        self._status = 200
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="jwks", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/jwks.json"

    def start(self) -> JwksServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(TIMEOUT)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _handle(self, request: web.Request) -> web.Response:
        with self._cond:
            self.requests += 1
            keys, status = list(self._keys), self._status
            self._cond.notify_all()
        if status != 200:
            return web.Response(status=status, text="unavailable")
        return web.json_response({"keys": keys})

    def serve(self, *jwks: dict[str, Any]) -> None:
        """From now on, answer with these keys."""
        with self._cond:
            self._keys, self._status = list(jwks), 200

    def fail(self, status: int = 503) -> None:
        with self._cond:
            self._status = status

    def wait_requests(self, count: int, timeout: float = TIMEOUT) -> None:
        with self._cond:
            reached = self._cond.wait_for(lambda: self.requests >= count, timeout)
        assert reached, f"{self.requests} JWKS requests, expected {count}"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT)
        self._loop.close()
