"""The HTTP server: routes to /metrics, /health, /status(.json) and the admin API.

Handlers only translate: the figures come from broker/http/prometheus.py and
broker/http/status.py, the operations from broker/admin.py. The admin API follows
VerneMQ's `/api/v1/<command path>?<arguments>`, answering `{"type": "table", "table":
[...]}`; its API key travels as the HTTP basic-auth username (empty password, as
VerneMQ's) or in an `x-api-key` header, and a request without a valid key gets 401; a
key's scope decides what it may call (broker/http/access.py). `/api/v1/publish`
publishes on behalf of a client (broker/http/publish.py).

Connections are held to `[http]`'s limits (max_connections, request_timeout,
keepalive_timeout) by broker/http/connections.py, the protocol of the asyncio server
started here around aiohttp's own.

The server reaches the node through `HttpPorts`, one port per role (broker/admin.py's,
/health's `Readiness`, the publishes' `PublishGate`, the peers, the tracer), never
through the Broker as a whole.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker import admin, admin_queries
from broker.admin_queries import Query
from broker.binding import BindError, claim
from broker.config import Config, host_port
from broker.http import prometheus, publish, status
from broker.http.access import PUBLISH_COMMAND, Refusal, refusal
from broker.http.api_keys import ApiKeys, KeysFileError
from broker.http.connections import HttpConnection, HttpConnections
from broker.http.limits import check_http_reserve, describe_reserve
from broker.http.trace_stream import stream
from broker.on_behalf import PublishGate
from broker.trace_spec import TraceSpec

if TYPE_CHECKING:
    from broker.peers import ClusterOperations
    from broker.trace.tracer import Tracer

log = logging.getLogger("nautilus.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ADMIN = "/api/v1/"
CORS_PREFLIGHT = {
    "Access-Control-Allow-Methods": "GET, POST",
    "Access-Control-Allow-Headers": "Authorization, X-Api-Key, Content-Type",
    "Access-Control-Max-Age": "600",
}
UNAUTHORIZED = (
    "an API key is needed: the basic-auth user name with an empty password (curl -u KEY:), "
    "or an x-api-key header"
)


@dataclass(frozen=True, slots=True)
class HttpPorts:
    """What the HTTP side reaches the node through, one port per role (the Broker plays
    them all: broker/server.py makes this)."""

    commands: admin.CommandRunner  # sessions and settings, on every node
    listeners: admin.ListenerControl
    retained: admin.RetainedKeeper
    figures: admin.FigureSource  # /metrics, /status.json, metrics/show
    plugins: admin.PluginSwitchboard
    readiness: status.Readiness  # /health
    publishing: PublishGate  # /api/v1/publish
    peers: ClusterOperations  # the cluster commands
    tracer: Tracer  # trace/client, trace/stop-all


class HttpServer:
    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop, ports: HttpPorts) -> None:
        self.config = config
        self.loop = loop
        self.ports = ports
        self.settings = config.http
        self.keys = ApiKeys(self.settings.api_keys_file)
        check_http_reserve(config)  # ConfigError: HTTP could starve MQTT
        self.address: tuple[str, int] | None = None  # bound (host, port), once started
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.connections: HttpConnections | None = None  # while started
        self.app = web.Application(middlewares=[self._watch, self._cors, self._authenticate])
        self.origins = frozenset(self.settings.cors_origins)
        routes: list[tuple[str, Handler]] = [
            ("/metrics", self.metrics),
            ("/health", self.health),
            ("/health/ping", self.ping),
            ("/status", self.status_page),
            ("/status.json", self.status_json),
        ]
        for path, handler in routes:
            self.app.router.add_get(path, handler)
        for command, handler in self._admin_commands().items():
            self.app.router.add_route("*", ADMIN + command, handler)
        publishing = publish.handler(ports.publishing)
        for method in ("POST", "PUT"):  # both, as VerneMQ's
            self.app.router.add_route(method, ADMIN + PUBLISH_COMMAND, publishing)
        self.app.router.add_route("*", ADMIN + "trace/client", self.trace)

    async def bind(self) -> None:
        """Claim `[http] address`, not accepting yet (BindError: it cannot be had)."""
        host, port = host_port(self.settings.address)
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            keepalive_timeout=self.settings.keepalive_timeout,
            # A body no handler reads: thrown away for this long.
            lingering_time=self.settings.request_timeout,
        )
        await self._runner.setup()
        loop = self.loop
        assert self._runner.server is not None  # made by setup()
        self.connections = HttpConnections(self.settings, loop, self._runner.server)
        # Our own asyncio server rather than aiohttp's TCPSite: its protocol caps and
        # times out connections (broker/http/connections.py).
        try:
            self._server = await claim(
                loop, self.connections, host, port, reuse_address=True, backlog=1024
            )
        except OSError as exc:
            change = "[http] address, or enabled = false"
            raise BindError("http.address", self.settings.address, exc, change) from None
        bound = self._server.sockets[0].getsockname()  # the port chosen for port 0
        self.address = (bound[0], bound[1])

    async def start(self) -> None:
        """Serve on the address `bind` claimed."""
        assert self._server is not None and self.address is not None  # bind() first
        await self._server.start_serving()
        log.info(
            "HTTP on %s:%s (/metrics, /health, /status, /api/v1); max_connections %d, "
            "request_timeout %gs, keepalive_timeout %gs",
            *self.address,
            self.settings.max_connections,
            self.settings.request_timeout,
            self.settings.keepalive_timeout,
        )
        log.log(*describe_reserve(self.config))  # what that leaves MQTT

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # no new connections; aiohttp closes the open ones
        if self.connections is not None:
            self.connections.drop_unfinished()  # (aiohttp would wait for their handlers)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self.connections is not None:
            self.connections.close()

    @property
    def open_connections(self) -> int:
        return len(self.connections.open) if self.connections is not None else 0

    @web.middleware
    async def _watch(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Tells the connection its request reached a handler, and when it is handled
        (request_timeout: broker/http/connections.py)."""
        transport = request.transport
        connection = transport.get_protocol() if transport is not None else None
        if not isinstance(connection, HttpConnection):
            return await handler(request)
        connection.request_started(request)
        try:
            return await handler(request)
        finally:
            connection.request_handled()

    @web.middleware
    async def _cors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Pages of `[http] cors_origins` may read the answers: a preflight (OPTIONS, which
        carries no key) is answered here; other answers get the origin's header."""
        origin = request.headers.get("Origin")
        if origin is None or not (origin in self.origins or "*" in self.origins):
            return await handler(request)
        allowed = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204, headers={**allowed, **CORS_PREFLIGHT})
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a refusal is readable by the page too
            exc.headers.update(allowed)
            raise
        response.headers.update(allowed)
        return response

    # -- open to anyone who can reach the port ------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        body = prometheus.render(
            prometheus.collect(self.ports.figures),
            self.config.broker.node_name,
            self.settings.prometheus_namespace,
        )
        return web.Response(body=body.encode(), headers={"Content-Type": prometheus.CONTENT_TYPE})

    async def health(self, request: web.Request) -> web.Response:
        problems = status.problems(self.ports.readiness)
        if problems:
            return web.json_response({"status": "not ready", "reasons": problems}, status=503)
        return web.json_response({"status": "ok"})

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="pong")

    async def status_page(self, request: web.Request) -> web.Response:
        return web.Response(text=status.PAGE, content_type="text/html")

    async def status_json(self, request: web.Request) -> web.Response:
        ports = self.ports
        return web.json_response(status.nodes(ports.readiness, ports.figures, ports.plugins))

    # -- the admin API --------------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(ADMIN):
            return await handler(request)
        try:
            key = self.keys.find(_api_key(request))
        except KeysFileError as exc:  # refused, and said once per request in the log
            log.error("admin API refused: %s", exc)
            return web.json_response({"type": "error", "error": str(exc)}, status=503)
        if key is None:
            refused: Refusal | None = Refusal(401, UNAUTHORIZED)
        else:  # expired, or its scope does not reach the command (broker/http/access.py)
            now = datetime.datetime.now(datetime.UTC)
            command = request.path.removeprefix(ADMIN)
            refused = refusal(key.id, key.scope, key.expires, command, now)
        if refused is not None:
            challenge = {"WWW-Authenticate": 'Basic realm="nautilus"'}
            return web.json_response(
                {"type": "error", "error": refused.error},
                status=refused.status,
                headers=challenge if refused.status == 401 else None,
            )
        return await handler(request)

    async def trace(self, request: web.Request) -> web.StreamResponse:
        """`nautilus admin trace client`: the trace's lines as server-sent events
        (broker/http/trace_stream.py)."""
        if request.method not in ("GET", "POST"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        try:
            spec = _trace_spec(Arguments(request))
            return await stream(request, self.ports.tracer, spec)
        except ValueError as exc:
            return web.json_response({"type": "error", "error": str(exc)}, status=400)

    def _admin_commands(self) -> dict[str, Handler]:
        ports = self.ports
        node, listeners, retained = ports.commands, ports.listeners, ports.retained
        figures, plugins, peers = ports.figures, ports.plugins, ports.peers
        commands: dict[str, Callable[[Arguments], Any]] = {
            "session/show": lambda a: admin.session_show(node, _query(a)),
            "session/client": lambda a: [
                admin.client(node, a.required("client_id"), a.text("mountpoint"))
            ],
            "session/disconnect": lambda a: admin.session_disconnect(
                node, _query(a, "cleanup"), bool(a.flag("cleanup"))
            ),
            "session/unsubscribe": lambda a: admin.session_unsubscribe(node, _query(a)),
            "set": lambda a: admin.set_settings(node, a.pairs),
            "settings/show": lambda a: admin.show_settings(node),
            "listener/show": lambda a: admin.listeners(listeners),
            "listener/start": lambda a: admin.start_listener(listeners, a.required("address")),
            "listener/stop": lambda a: admin.stop_listener(
                listeners, a.required("address"), bool(a.flag("kill_sessions"))
            ),
            "retain/show": lambda a: admin.retained(
                retained, a.text("topic") or "#", a.number("limit", 1000), a.text("mountpoint")
            ),
            "retain/delete": lambda a: [
                admin.delete_retained(retained, a.required("topic"), a.text("mountpoint"))
            ],
            "retain/delete-expired": lambda a: [admin.delete_expired_retained(retained)],
            "metrics/show": lambda a: [admin.metrics(figures)],
            "metrics/reset": lambda a: [admin.reset_metrics(figures)],
            "plugin/show": lambda a: admin.plugins(plugins),
            "cluster/show": lambda a: admin.cluster_nodes(peers),
            "cluster/status": lambda a: [admin.cluster_status(peers)],
            "cluster/join": lambda a: [admin.cluster_join(peers, a.required("address"))],
            "cluster/leave": lambda a: _one(admin.cluster_leave(peers, a.text("node"))),
            "plugin/enable": lambda a: admin.set_plugin_enabled(plugins, a.required("name"), True),
            "plugin/disable": lambda a: admin.set_plugin_enabled(
                plugins, a.required("name"), False
            ),
            "auth/invalidate": lambda a: admin.invalidate_auth(plugins, node, *_whose(a)),
            "bridge/show": lambda a: admin.bridges(plugins),
            "bridge/start": lambda a: admin.run_bridge(plugins, a.required("name"), True),
            "bridge/stop": lambda a: admin.run_bridge(plugins, a.required("name"), False),
            "trace/stop-all": lambda a: [admin.stop_traces(ports.tracer)],
        }
        commands["sessions"] = commands["session/show"]  # VerneMQ's aliases
        commands["plugins"] = commands["plugin/show"]
        return {path: _table(command) for path, command in commands.items()}


class Arguments:
    """A command's arguments: `key=value` query parameters (`client-id` and `client_id`
    alike) and VerneMQ's flags (`--cleanup`, or `cleanup=true`)."""

    def __init__(self, request: web.Request) -> None:
        # In order, repeats kept (a session query may name a field twice).
        self.pairs = [
            (key.lstrip("-").replace("-", "_"), value) for key, value in request.query.items()
        ]
        self.values = dict(self.pairs)

    def text(self, name: str) -> str:
        return self.values.get(name, "")

    def required(self, name: str) -> str:
        value = self.values.get(name)
        if not value:
            raise ValueError(f"{name} is required")
        return value

    def number(self, name: str, default: int) -> int:
        value = self.values.get(name)
        if value is None:
            return default
        if not value.isdigit():
            raise ValueError(f"{name}: expected a number, got {value!r}")
        return int(value)

    def flag(self, name: str, default: bool | None = False) -> bool | None:
        if name not in self.values:
            return default
        value = self.values[name].lower()
        if value in ("", "true", "1", "yes", "on"):
            return True
        if value in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{name}: expected true or false, got {value!r}")


def _table(command: Callable[[Arguments], Any]) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        if request.method not in ("GET", "POST"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        try:
            rows = command(Arguments(request))
            if inspect.isawaitable(rows):
                rows = await rows
        except admin.NotFound as exc:
            return web.json_response({"type": "error", "error": str(exc)}, status=404)
        except ValueError as exc:
            return web.json_response({"type": "error", "error": str(exc)}, status=400)
        if isinstance(rows, admin.Gathered):  # a cluster-wide command: who did not answer
            return web.json_response(_gathered(rows), dumps=_dumps)
        return web.json_response({"type": "table", "table": rows}, dumps=_dumps)

    return handle


def _gathered(gathered: admin.Gathered) -> dict[str, Any]:
    answer: dict[str, Any] = {"type": "table", "table": gathered.rows, "errors": gathered.errors}
    if gathered.truncated:
        answer["truncated"] = True
    return answer


def _query(arguments: Arguments, *options: str) -> Query:
    """A session query from the arguments, but for the command's own `options`."""
    return admin_queries.parse([(k, v) for k, v in arguments.pairs if k not in options])


def _whose(arguments: Arguments) -> tuple[str | None, str | None]:
    """auth/invalidate's clients: client_id and/or username, or all=true (never none by
    omission: a request that names nobody is refused)."""
    client_id, username = arguments.text("client_id") or None, arguments.text("username") or None
    if arguments.flag("all"):
        if client_id or username:
            raise ValueError("all: not with client_id or username")
        return None, None
    if client_id is None and username is None:
        raise ValueError("client_id, username or all=true is required")
    return client_id, username


async def _one(row: Awaitable[Any]) -> list[Any]:
    """A command that awaits, answering one row."""
    return [await row]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _api_key(request: web.Request) -> str:
    """The key a request presents; "" (never a key) for none, or for basic-auth
    credentials that are not exactly `KEY:` (the user name, an empty password: what the
    docs and `nautilus admin` send): a key as the password, a password beside the key,
    no colon at all, or anything but strict base64 is refused."""
    header = request.headers.get("x-api-key")
    if header:
        return header
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    user, colon, password = decoded.partition(":")
    if not colon or password:
        return ""
    return user


def _trace_spec(arguments: Arguments) -> TraceSpec:
    """A trace's options, under VerneMQ's names (ValueError: a bad one)."""
    defaults = TraceSpec("")
    return TraceSpec(
        client_id=arguments.required("client_id"),
        mountpoint=arguments.text("mountpoint"),
        rate_max=arguments.number("rate_max", defaults.rate_max),
        rate_interval=arguments.number("rate_interval", defaults.rate_interval),
        trunc_payload=arguments.number("trunc_payload", defaults.trunc_payload),
    )
