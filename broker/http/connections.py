"""HTTP connections held to the broker's limits, around aiohttp's own protocol.

aiohttp's server caps nothing and has no timeout on reading a request: a connection that
never finishes its headers stays open (for good with aiohttp 3.9.1; with 3.14 until its
keep-alive timeout, 3630 seconds by default). So asyncio's server here creates an
`HttpConnection` per connection, with aiohttp's RequestHandler inside it:

- over `[http] max_connections`, a new connection gets a 503 and is closed at once (one
  line when that starts, one when it stops: broker/connection_cap.py);
- a request must arrive whole (request line, headers and body) within `request_timeout`
  of the connection opening, or of its first byte on a kept-alive connection (bytes
  that follow a request's headers are its body's until its end: see `data_received`),
  unless its handler answers first; a response must be taken by the client within
  `request_timeout` of its handler returning; else the connection is dropped (one line,
  at most one a second). aiohttp has no timeout of its own on a body: a handler that
  reads one (a publish's) would wait for ever for bytes that never come. A body the
  handler answered without reading is read and thrown away for `request_timeout` at
  most (aiohttp's lingering time); an idle kept-alive connection is aiohttp's to close,
  after `keepalive_timeout`;
- what aiohttp logs about a connection goes through `ConnectionLog`: a malformed request
  is one line, at most one a second, never a traceback.

Each kind of those lines is an episode (broker/episodes.py): its first line at once, the
others counted in a line a second, until a second without one.

The handlers tell a connection where its request is through `request_started` and
`request_handled` (the app's outermost middleware: broker/http/app.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker.connection_cap import ConnectionCap
from broker.episodes import Episode

if TYPE_CHECKING:
    from aiohttp import StreamReader
    from aiohttp.web_protocol import RequestHandler

    from broker.config import HttpSettings

log = logging.getLogger("nautilus.http")

# Sent to a connection over max_connections before it is closed, so that an HTTP client
# (a Prometheus scrape, a probe) sees why rather than a reset.
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 32\r\n"
    b"Connection: close\r\n\r\nhttp.max_connections is reached\n"
)


class HttpConnections:
    """One HTTP server's open connections, its limits and its rate-limited lines; called,
    the protocol factory of its asyncio server."""

    def __init__(
        self, settings: HttpSettings, loop: asyncio.AbstractEventLoop, server: web.Server
    ) -> None:
        self.settings = settings
        self.loop = loop
        self.server = server  # aiohttp's: one RequestHandler per connection
        self.open: set[HttpConnection] = set()
        self.cap = ConnectionCap(log, "http", settings.max_connections, loop)
        self.bad_requests = _once_a_second(loop, "http: bad request", "bad requests")
        self.timeouts = _once_a_second(loop, "http: dropped", "connections dropped")
        self.errors = _once_a_second(loop, "http: error", "errors", logging.ERROR)

    def __call__(self) -> HttpConnection:
        return HttpConnection(self)

    def drop_unfinished(self) -> None:
        """At shutdown: a request still arriving is owed nothing. Its handler, if one
        reads its body, would hold the shutdown until request_timeout."""
        for connection in list(self.open):
            if connection.request_due is not None and connection.transport is not None:
                connection.transport.abort()

    def close(self) -> None:
        """What the last second counted, if anything."""
        for lines in (self.bad_requests, self.timeouts, self.errors):
            lines.close()


def _once_a_second(
    loop: asyncio.AbstractEventLoop, what: str, noun: str, level: int = logging.INFO
) -> Episode:
    """Lines `<what> <detail>`, at most one a second: the others are counted, in one line
    when the second is over (`<what>: 57 more in the last 1s, the last <detail>`)."""
    counted = f"{what}: %d more in the last %ds, the last %s"
    return Episode(log, noun, loop, interval=1.0, counted=counted, level=level, end_when_quiet=True)


class HttpConnection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, under the limits (module docstring)."""

    def __init__(self, connections: HttpConnections) -> None:
        self.connections = connections
        self.loop = connections.loop
        self.timeout = connections.settings.request_timeout
        self.transport: asyncio.Transport | None = None
        self.handler: RequestHandler | None = None  # None: refused (or not yet made)
        self.peer = "?"
        # Loop times by which a request must have arrived whole (its body too, unless its
        # handler answered first), and by which the client must have taken a response;
        # None: no such deadline now.
        self.request_due: float | None = None
        self.response_due: float | None = None
        self.body: StreamReader | None = None  # the last request's, as its handler reads it
        self._timer: asyncio.TimerHandle | None = None
        self.gone = False  # the connection is closed
        self._closed: asyncio.Future[None] | None = None  # made when a stream asks

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        connections = self.connections
        transport = cast(asyncio.Transport, transport)
        if not connections.cap.admits(len(connections.open)):
            transport.write(REFUSED)
            transport.close()
            return
        connections.open.add(self)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.handler = handler = connections.server()
        handler.logger = cast(logging.Logger, ConnectionLog(self))
        self.request_due = self.loop.time() + self.timeout
        self._watch()
        handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            return
        body = self.body
        unfinished = body is not None and not body.is_eof()  # `data` is more of it
        if self.request_due is None and not unfinished:
            self.request_due = self.loop.time() + self.timeout  # a request's first bytes
            self._watch()
        self.handler.data_received(data)
        if unfinished and body is not None and body.is_eof():  # `data` ended the body
            self.request_due = None

    def eof_received(self) -> None:  # None: the transport closes (aiohttp's answer too)
        if self.handler is not None:
            self.handler.eof_received()

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handler is None:
            return  # refused at connection_made
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        connections = self.connections
        connections.open.discard(self)
        connections.cap.closed(len(connections.open))
        self.gone = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        self.handler.connection_lost(exc)

    def closed(self) -> asyncio.Future[None]:
        """Done once the connection is closed: a stream's reader went away (aiohttp
        tells a handler only when it writes)."""
        if self._closed is None:
            self._closed = self.loop.create_future()
            if self.gone:
                self._closed.set_result(None)
        return self._closed

    # -- where the request is (the app's middleware) ----------------------------------

    def request_started(self, request: web.BaseRequest) -> None:
        self.body = request.content  # bytes that follow, until its end, are the body's
        if self.body.is_eof():  # whole: the handler may take its time
            self.request_due = None

    def request_handled(self) -> None:
        if self.body is not None and not self.body.is_eof():
            self.request_due = None  # answered unread: aiohttp lingers over it, so long
        self.response_due = self.loop.time() + self.timeout
        self._watch()

    # -- the deadlines ------------------------------------------------------------------

    def _watch(self) -> None:
        """A timer for the nearest deadline."""
        if self._timer is not None:
            self._timer.cancel()
        due = [t for t in (self.request_due, self.response_due) if t is not None]
        self._timer = self.loop.call_at(min(due), self._check) if due else None

    def _check(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        now = self.loop.time() + 0.001  # a timer may run a hair early
        if self.request_due is not None and now >= self.request_due:
            self._drop(f"no complete request within {self.timeout:g}s")
            return
        if self.response_due is not None and now >= self.response_due:
            self.response_due = None
            if self.transport.get_write_buffer_size():
                self._drop(f"its response not read within {self.timeout:g}s")
                return
        self._watch()

    def _drop(self, why: str) -> None:
        detail = f"{self.peer}: {why}"
        self.connections.timeouts.occurred("http: dropped %s", detail, reason=detail)
        assert self.transport is not None
        self.transport.abort()  # at once: nothing is owed to it, and its descriptor is freed


class ConnectionLog(logging.LoggerAdapter):
    """What aiohttp logs about one connection (its RequestHandler's `logger`).

    A malformed request (HttpProcessingError: a bad request line, a header too long, ...)
    is one INFO line with the client's address, at most one a second with all the others;
    aiohttp would log it as a traceback (3.9.1; 3.14 too, but for a bad method on a
    connection's first request, which it logs at debug). An error of a handler (a bug of
    ours: aiohttp answers 500; aiohttp logs it with logger.exception) is an ERROR line with
    its traceback, at most one a second too; but the ConnectionResetError a handler gets
    when its client goes while it reads the body is a debug line. aiohttp's debug lines
    pass through as they are."""

    def __init__(self, connection: HttpConnection) -> None:
        super().__init__(log, {})
        self.connection = connection

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        connections = self.connection.connections
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            message = one_line(exc.message).removesuffix(" ^")  # llhttp's pointer
            detail = f"from {self.connection.peer}: {exc.code} {message}"
            connections.bad_requests.occurred("http: bad request %s", detail, reason=detail)
        elif isinstance(exc, ConnectionResetError) and self.connection.gone:
            # Its handler was reading the body when the client went, or was dropped (the
            # drop has its own line): no answer is owed, and nothing of ours went wrong.
            self.logger.debug("http: %s went while its request was read", self.connection.peer)
        elif level >= logging.WARNING:
            text = str(msg) % args if args else str(msg)
            detail = f"{self.connection.peer}: {one_line(text)}"
            traceback = exc if isinstance(exc, BaseException) else None
            connections.errors.occurred("http: error %s", detail, reason=detail, exc_info=traceback)
        elif self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *args)


def one_line(text: object, limit: int = 200) -> str:
    """`text` as one printable line of at most `limit` characters (a client's bytes may be
    in it)."""
    flat = " ".join(str(text).split())
    flat = "".join(c if c.isprintable() else "?" for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
