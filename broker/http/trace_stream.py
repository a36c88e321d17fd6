"""The admin API's trace stream: `/api/v1/trace/client` as server-sent events.

    GET|POST /api/v1/trace/client?client_id=C[&mountpoint=M][&rate_max=10]
             [&rate_interval=100][&trunc_payload=200]

answers `text/event-stream`: each line of the trace is an event whose data is the line
as JSON (time, node, mountpoint, client_id, kind, text); the last one, when the trace
ends, is an `end` event. While nothing happens a comment goes out every HEARTBEAT
seconds, so that a reader (and any proxy between) keeps the stream open. The trace ends
when the reader goes away: its connection closing is noticed at once (HttpConnection's
`closed`), not at the next write.

Lines wait here for the reader at most BACKLOG deep: a reader that does not keep up ends
the trace (the rate limit keeps a normal one far below that).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import fields
from typing import TYPE_CHECKING

from aiohttp import web

from broker.http.connections import HttpConnection
from broker.trace.trace import TraceLine
from broker.trace_spec import TraceSpec

if TYPE_CHECKING:
    from broker.trace.tracer import Tracer

HEARTBEAT = 10.0  # seconds between comments on a quiet stream
FIELDS = [field.name for field in fields(TraceLine)]
BACKLOG = 100_000  # lines waiting for a slow reader, at most


class StreamSink:
    """A trace's lines, waiting for the stream to write them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lines: deque[TraceLine] = deque()
        self.last: TraceLine | None = None  # the trace is over
        self.overflowed = False
        self.waiter: asyncio.Future[None] | None = None  # the stream waits for lines

    def line(self, line: TraceLine) -> None:
        if len(self.lines) >= BACKLOG:
            self.overflowed = True
        else:
            self.lines.append(line)
        self._wake()

    def end(self, last: TraceLine) -> None:
        self.last = last
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, gone: asyncio.Future[None]) -> None:
        """Until there is something to write, the reader is gone, or HEARTBEAT."""
        if self.lines or self.last is not None or self.overflowed:
            return
        self.waiter = self.loop.create_future()
        either = asyncio.FIRST_COMPLETED
        await asyncio.wait((self.waiter, gone), timeout=HEARTBEAT, return_when=either)


async def stream(request: web.Request, tracer: Tracer, spec: TraceSpec) -> web.StreamResponse:
    """Start the trace and stream it until it ends or the reader goes away."""
    loop = asyncio.get_running_loop()
    sink = StreamSink(loop)
    trace = tracer.start(spec, sink)  # ValueError: bad options (before any answer)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    gone = _gone(request, loop)
    try:
        await response.prepare(request)
        while True:
            await sink.wait(gone)
            if gone.done():
                break
            if sink.overflowed:
                trace.end(f"the reader did not keep up ({BACKLOG} lines waiting)")
            if not sink.lines and sink.last is None:
                await response.write(b": quiet\n\n")
            if sink.lines:  # all in one write: a busy client's lines come by thousands
                lines, sink.lines = sink.lines, deque()
                await response.write(b"".join(_event(line) for line in lines))
            if sink.last is not None:
                await response.write(_event(sink.last, "end"))
                break
    except ConnectionError:
        pass  # the reader went away while a line was written
    finally:
        trace.end("the reader went away")  # (nothing if the trace is over)
    return response


def _gone(request: web.Request, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    """Done when the request's connection closes."""
    transport = request.transport
    connection = transport.get_protocol() if transport is not None else None
    if isinstance(connection, HttpConnection):
        return connection.closed()
    return loop.create_future()  # (not the broker's server: the writes notice it)


def _event(line: TraceLine, name: str = "") -> bytes:
    data = json.dumps(dict(zip(FIELDS, line.fields(), strict=True)), ensure_ascii=False)
    return (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()
