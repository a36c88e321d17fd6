"""The webhooks plugin: every configured hook is served by HTTP endpoints (vmq_webhooks).

Theory of operation: the hooks a config names become methods of the instance, built in
`__init__` (the broker finds hooks with getattr, so a hook nobody configured is not a
method at all and costs nothing):

- a deciding (all_till_ok) hook is an `async` method that asks its endpoints in order of
  their names: ok or error stops, next asks the next endpoint, and when every endpoint
  said next the plugin says NEXT so the plugins after it get their turn. A transport
  error, a timeout, a status other than 200 or an answer that is not valid is a denial
  (as in VerneMQ): it never falls through to the next endpoint or plugin;
- an event (all) hook is a plain method that builds the body at once and posts it from
  a task of its own; at most `max_pending_events` such posts are in flight, beyond that
  events are dropped and counted, so a slow endpoint never holds up or bloats the broker.

For an MQTT 5 client the broker calls the `_m5` hook; when only the v4 hook has endpoints,
those serve MQTT 5 clients too, with v4 bodies (VerneMQ's compatibility layer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import logging
import types
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from broker.config import ConfigError
from hooks import HOOKS, NEXT, Error, Metric, Ok, Result
from plugins.webhooks import payloads
from plugins.webhooks.cache import ResultCache, request_key
from plugins.webhooks.client import Endpoint, Pools

log = logging.getLogger("nautilus.plugins.webhooks")

WHERE = "plugins.webhooks"
STOP_GRACE = 1.0  # seconds stop() waits for event posts still in flight


@dataclass(slots=True)
class EndpointConfig:
    hook: str = ""
    url: str = ""
    name: str = ""  # endpoints of one hook are called in the order of their names
    base64_payload: bool = True
    no_payload: bool = False  # auth_on_publish(_m5) only
    response_timeout: int = 0  # ms; 0: the plugin's response_timeout


@dataclass(slots=True)
class WebhooksConfig:
    response_timeout: int = 5000  # ms
    pool_max_connections: int = 100
    pool_timeout: int = 60000  # ms an idle keep-alive connection is kept
    cache_max_entries: int = 100_000
    max_pending_events: int = 1000
    endpoints: list[EndpointConfig] = field(default_factory=list)


@dataclass(slots=True)
class Counters:
    requests: int = 0  # HTTP calls made
    errors: int = 0  # calls that failed: transport, timeout, status, invalid answer
    timeouts: int = 0  # of which timeouts
    events_dropped: int = 0  # event posts not made: max_pending_events were in flight


class WebhooksPlugin:
    """Serves each configured hook by POSTing VerneMQ's JSON to its endpoints."""

    Config = WebhooksConfig

    def __init__(self, config: WebhooksConfig) -> None:
        self.config = config
        _check_limits(config)
        self.endpoints = [_endpoint(i, e, config) for i, e in enumerate(config.endpoints)]
        _check_unique(self.endpoints)
        self.counters = Counters()
        self.cache = ResultCache(config.cache_max_entries)
        self._pools = Pools(config.pool_max_connections, config.pool_timeout / 1000)
        self._events: set[asyncio.Task] = set()
        self._max_pending = config.max_pending_events
        by_hook: dict[str, list[Endpoint]] = {}
        for endpoint in self.endpoints:
            by_hook.setdefault(endpoint.hook, []).append(endpoint)
        self.hooks: dict[str, tuple[Endpoint, ...]] = {}
        for hook, endpoints in by_hook.items():
            ordered = tuple(sorted(endpoints, key=lambda e: e.name))
            self.hooks[hook] = ordered
            make = _event_method if payloads.is_event(hook) else _deciding_method
            setattr(self, hook, types.MethodType(make(hook, ordered), self))
        if not self.endpoints:
            log.warning("%s is enabled but has no endpoints", WHERE)

    def __repr__(self) -> str:
        return f"<WebhooksPlugin {sorted(self.hooks)}>"

    async def start(self) -> None:
        self._pools.open(self.endpoints)
        for endpoints in self.hooks.values():
            for endpoint in endpoints:
                log.info("webhook %s", endpoint.label)

    async def stop(self) -> None:
        if self._events:
            await asyncio.wait(set(self._events), timeout=STOP_GRACE)
        late = list(self._events)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        await self._pools.close(self.endpoints)

    def metrics(self) -> list[Metric]:
        """For /metrics (hooks.Metric)."""
        counters, cache = self.counters, self.cache
        return [
            Metric("webhooks_requests", counters.requests, help="HTTP calls made"),
            Metric("webhooks_errors", counters.errors, help="calls that failed"),
            Metric("webhooks_timeouts", counters.timeouts),
            Metric("webhooks_events_dropped", counters.events_dropped),
            Metric("webhooks_cache_hits", cache.hits),
            Metric("webhooks_cache_misses", cache.misses),
            Metric("webhooks_cache_evictions", cache.evictions),
            Metric("webhooks_cache_entries", len(cache), "gauge"),
        ]

    # -- deciding hooks ------------------------------------------------------------------

    async def call(self, endpoint: Endpoint, context: Any) -> Result:
        """Ask one endpoint (or the cache) about `context`."""
        hook = endpoint.hook
        body = payloads.request_body(
            hook,
            context,
            base64_payload=endpoint.base64_payload,
            no_payload=endpoint.no_payload,
        )
        key = None
        if endpoint.cache_seen:
            key = request_key(endpoint.url, hook, body)
            cached = self.cache.get(key)
            if cached is not None:
                modifiers, left = cached
                return Ok(modifiers, cache_for=left)  # the broker may keep it as long
        self.counters.requests += 1
        try:
            status, data, cache_control = await endpoint.post(payloads.encode_body(body))
        except TimeoutError:
            self.counters.timeouts += 1
            return self._failed(endpoint, "timeout", f"no answer in {endpoint.timeout_ms} ms")
        except (aiohttp.ClientError, OSError) as exc:
            return self._failed(endpoint, "request_failed", str(exc) or type(exc).__name__)
        if status != 200:
            return self._failed(endpoint, "invalid_response_code", f"HTTP {status}")
        try:
            result = payloads.decode_response(hook, data, base64_payload=endpoint.base64_payload)
        except payloads.InvalidResponse as exc:
            return self._failed(endpoint, exc.reason, exc.detail)
        endpoint.answered()
        if type(result) is Ok and payloads.cacheable(hook):
            seconds = payloads.max_age(cache_control)
            if seconds is not None:
                endpoint.cache_seen = True
                if key is None:
                    key = request_key(endpoint.url, hook, body)
                self.cache.put(key, result.modifiers, seconds)
                if "payload" not in result.modifiers:  # a payload is this message's only
                    return Ok(result.modifiers, cache_for=seconds)
        return result

    def _failed(self, endpoint: Endpoint, reason: str, detail: str) -> Error:
        self.counters.errors += 1
        endpoint.failed(reason, detail)
        return Error(reason)

    # -- event hooks ---------------------------------------------------------------------

    def post_event(self, endpoint: Endpoint, context: Any) -> None:
        """Post one event without waiting for it, unless too many are in flight."""
        if len(self._events) >= self._max_pending:
            self.counters.events_dropped += 1
            endpoint.failed("event_dropped", f"{self._max_pending} events already in flight")
            return
        body = payloads.request_body(endpoint.hook, context, base64_payload=endpoint.base64_payload)
        task = asyncio.get_running_loop().create_task(
            self._deliver_event(endpoint, payloads.encode_body(body))
        )
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _deliver_event(self, endpoint: Endpoint, data: bytes) -> None:
        self.counters.requests += 1
        try:
            status, _, _ = await endpoint.post(data)
        except TimeoutError:
            self.counters.timeouts += 1
            self._failed(endpoint, "timeout", f"no answer in {endpoint.timeout_ms} ms")
        except Exception as exc:  # an event never breaks anything: count it, go on
            self._failed(endpoint, "request_failed", str(exc) or type(exc).__name__)
        else:
            if status == 200:
                endpoint.answered()  # the body of an event answer is ignored
            else:
                self._failed(endpoint, "invalid_response_code", f"HTTP {status}")


def _deciding_method(hook: str, endpoints: tuple[Endpoint, ...]):
    async def method(self: WebhooksPlugin, context: Any) -> Result:
        for i, endpoint in enumerate(endpoints):
            result = await self.call(endpoint, context)
            if result is not NEXT:
                # An endpoint asked before said next, which is never kept: nor is this.
                return result if i == 0 else dataclasses.replace(result, cache_for=None)
        return NEXT

    method.__name__ = method.__qualname__ = hook
    return method


def _event_method(hook: str, endpoints: tuple[Endpoint, ...]):
    def method(self: WebhooksPlugin, context: Any) -> None:
        for endpoint in endpoints:
            self.post_event(endpoint, context)

    method.__name__ = method.__qualname__ = hook
    return method


# -- config checks -----------------------------------------------------------------------


def _check_limits(config: WebhooksConfig) -> None:
    for key in ("response_timeout", "pool_max_connections", "pool_timeout", "max_pending_events"):
        if getattr(config, key) < 1:
            raise ConfigError(f"{WHERE}.{key}: must be 1 or more, got {getattr(config, key)}")
    if config.cache_max_entries < 0:
        raise ConfigError(
            f"{WHERE}.cache_max_entries: must be 0 (no cache) or more, "
            f"got {config.cache_max_entries}"
        )


def _check_unique(endpoints: list[Endpoint]) -> None:
    """Two endpoints of one hook may share neither a name nor a URL."""
    seen: dict[tuple[str, str, str], int] = {}
    for i, endpoint in enumerate(endpoints):
        for what in ("name", "url"):
            value = getattr(endpoint, what)
            earlier = seen.setdefault((endpoint.hook, what, value), i)
            if earlier != i:
                raise ConfigError(
                    f"{WHERE}.endpoints[{i}]: {endpoint.hook} already has an endpoint with "
                    f"{what} {value!r} (endpoints[{earlier}])"
                )


def _endpoint(i: int, entry: EndpointConfig, config: WebhooksConfig) -> Endpoint:
    where = f"{WHERE}.endpoints[{i}]"
    hook = entry.hook
    if not hook:
        raise ConfigError(f"{where}.hook: required (a hook name such as 'auth_on_register')")
    if hook not in HOOKS:
        close = difflib.get_close_matches(hook, HOOKS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where}.hook: {hook!r} is not a hook{hint}")
    name = entry.name or entry.url
    if not entry.url:
        raise ConfigError(f"{where}.url: required (e.g. 'http://127.0.0.1:8080/hook')")
    try:
        url = URL(entry.url)
    except ValueError as exc:
        raise ConfigError(f"{where}.url: {entry.url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{where}.url: expected http://host[:port]/path, got {entry.url!r}")
    if entry.no_payload and hook not in ("auth_on_publish", "auth_on_publish_m5"):
        raise ConfigError(f"{where}.no_payload: only auth_on_publish(_m5) can leave it out")
    if entry.response_timeout < 0:
        raise ConfigError(
            f"{where}.response_timeout: must be 0 (the plugin's) or more, "
            f"got {entry.response_timeout}"
        )
    return Endpoint(
        hook,
        entry.url,
        name,
        base64_payload=entry.base64_payload,
        no_payload=entry.no_payload,
        timeout_ms=entry.response_timeout or config.response_timeout,
    )
