"""HTTP side of the webhooks: one configured endpoint, and the keep-alive pools.

Each distinct URL gets one aiohttp ClientSession over a TCPConnector holding up to
`pool_max_connections` keep-alive connections (hackney's pool per endpoint in VerneMQ), so
a call reuses a warm connection instead of paying a TCP handshake. The sessions are made
in `Pools.open()` (on the broker's loop, from the plugin's start()) and closed in
`Pools.close()`.

An endpoint that fails is reported at once, then at most every LOG_INTERVAL seconds with
the number of failures in between, and once more when it answers again: a dead endpoint
under load says so clearly without flooding the log.
"""

from __future__ import annotations

import logging
import time

import aiohttp

log = logging.getLogger("nautilus.plugins.webhooks")

LOG_INTERVAL = 10.0  # seconds between two reports of one endpoint's failures


class Endpoint:
    """One `[[plugins.webhooks.endpoints]]` entry, ready to be called."""

    __slots__ = (
        "_quiet_until",
        "_suppressed",
        "base64_payload",
        "cache_seen",
        "failing",
        "failures",
        "headers",
        "hook",
        "label",
        "name",
        "no_payload",
        "session",
        "timeout",
        "timeout_ms",
        "url",
    )

    def __init__(
        self,
        hook: str,
        url: str,
        name: str,
        *,
        base64_payload: bool = True,
        no_payload: bool = False,
        timeout_ms: int = 5000,
    ) -> None:
        self.hook = hook
        self.url = url
        self.name = name
        self.label = f"{hook} {url}" if name == url else f"{hook} {name} ({url})"
        self.base64_payload = base64_payload
        self.no_payload = no_payload
        self.timeout_ms = timeout_ms
        self.timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self.headers = {"Content-Type": "application/json", "vernemq-hook": hook}
        self.session: aiohttp.ClientSession | None = None
        self.cache_seen = False  # has it ever answered with max-age? (else skip lookups)
        self.failing = False
        self.failures = 0
        self._quiet_until = 0.0
        self._suppressed = 0

    def __repr__(self) -> str:
        return f"<webhook {self.name!r} {self.hook} {self.url}>"

    async def post(self, data: bytes) -> tuple[int, bytes, str | None]:
        """POST one JSON body: (status, response body, cache-control header)."""
        session = self.session
        if session is None or session.closed:
            raise aiohttp.ClientConnectionError("the webhooks plugin is not running")
        async with session.post(
            self.url, data=data, headers=self.headers, timeout=self.timeout
        ) as response:
            body = await response.read()
            return response.status, body, response.headers.get("Cache-Control")

    def failed(self, reason: str, detail: str) -> None:
        self.failures += 1
        self.failing = True
        now = time.monotonic()
        if now < self._quiet_until:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more failures since the last report)"
        log.warning(
            "webhook %s: %s: %s%s",
            self.label,
            reason,
            detail,
            more if self._suppressed else "",
        )
        self._suppressed = 0
        self._quiet_until = now + LOG_INTERVAL

    def answered(self) -> None:
        if self.failing:
            self.failing = False
            self._quiet_until = 0.0
            self._suppressed = 0
            log.info("webhook %s: answering again", self.label)


class Pools:
    """One keep-alive ClientSession per distinct URL."""

    def __init__(self, max_connections: int, idle_timeout: float) -> None:
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.sessions: dict[str, aiohttp.ClientSession] = {}

    def open(self, endpoints: list[Endpoint]) -> None:
        for endpoint in endpoints:
            session = self.sessions.get(endpoint.url)
            if session is None:
                connector = aiohttp.TCPConnector(
                    limit=self.max_connections,
                    keepalive_timeout=self.idle_timeout,
                    enable_cleanup_closed=False,
                )
                session = aiohttp.ClientSession(
                    connector=connector,
                    headers={"User-Agent": "nautilus-webhooks"},
                    skip_auto_headers=("Accept-Encoding",),
                    auto_decompress=False,
                    raise_for_status=False,
                )
                self.sessions[endpoint.url] = session
            endpoint.session = session

    async def close(self, endpoints: list[Endpoint]) -> None:
        for endpoint in endpoints:
            endpoint.session = None
        sessions, self.sessions = self.sessions, {}
        for session in sessions.values():
            await session.close()
