"""One trace: the client it follows, its rate limit, and where its lines go.

A trace writes lines to a `Sink`: the admin API's stream on the node where it was asked
for, the link back to that node on the others (broker/cluster/tracing.py). It counts its
lines: more than `rate_max` in `rate_interval` milliseconds ends it with one last line
saying so (VerneMQ's "Trace rate limit triggered"), so that a trace of a flooding client
costs a bounded amount and the reader is never flooded. However it ends (that limit, a
stop, the reader gone), its sink hears of it once, with the last line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.trace_spec import TraceSpec

# What a line is about: a packet received or sent, a hook call, the session, the trace.
RECV, SEND, HOOK, SESSION, TRACE = "recv", "send", "hook", "session", "trace"


@dataclass(frozen=True, slots=True)
class TraceLine:
    time: float  # time.time()
    node: str  # where it was seen
    mountpoint: str
    client_id: str
    kind: str  # RECV, SEND, HOOK, SESSION or TRACE
    text: str

    def fields(self) -> list[Any]:
        """As a frame carries it (broker/cluster/frames.py's TRACE_LINE)."""
        return [self.time, self.node, self.mountpoint, self.client_id, self.kind, self.text]


class Sink(Protocol):
    def line(self, line: TraceLine) -> None:
        """A line of the trace."""

    def end(self, last: TraceLine) -> None:
        """The trace is over; `last` says why (the reason alone: `last.text`)."""


class Trace:
    __slots__ = ("_count", "_ended", "_window_end", "clock", "id", "node", "sink", "spec")

    def __init__(
        self,
        trace_id: int,
        spec: TraceSpec,
        sink: Sink,
        node: str,
        clock: Callable[[], float],
        ended: Callable[[Trace], None],
    ) -> None:
        self.id = trace_id
        self.spec = spec
        self.sink = sink
        self.node = node
        self.clock = clock  # the loop's time: the rate limit's windows
        self._ended: Callable[[Trace], None] | None = ended  # None once over
        self._window_end = 0.0
        self._count = 0

    def __repr__(self) -> str:
        return f"<Trace {self.id} {self.spec.mountpoint!r} {self.spec.client_id!r}>"

    @property
    def over(self) -> bool:
        return self._ended is None

    def write(self, kind: str, text: str) -> None:
        """A line about the traced client, seen on this node."""
        self.relay(self._line(kind, text))

    def relay(self, line: TraceLine) -> None:
        """A line for the reader (seen here or on another node), within the rate limit."""
        if self._ended is None:
            return
        now = self.clock()
        if now >= self._window_end:
            self._window_end = now + self.spec.rate_interval / 1000
            self._count = 0
        self._count += 1
        if self._count > self.spec.rate_max:
            spec = self.spec
            self.end(
                f"trace rate limit triggered: more than {spec.rate_max} lines in "
                f"{spec.rate_interval} ms; the trace stops"
            )
            return
        self.sink.line(line)

    def end(self, reason: str) -> None:
        """Stop: the sink gets `reason` as the last line (once, whoever ends it)."""
        ended, self._ended = self._ended, None
        if ended is None:
            return
        self.sink.end(self._line(TRACE, reason))
        ended(self)

    def _line(self, kind: str, text: str) -> TraceLine:
        spec = self.spec
        return TraceLine(time.time(), self.node, spec.mountpoint, spec.client_id, kind, text)
