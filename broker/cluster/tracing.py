"""Traces across the cluster: a trace read on one node follows its client on every node
(VerneMQ's tracer saw only its own node: its issue 1277, "No sessions found").

The node whose admin API streams a trace, its origin, sends TRACE_START to the others;
each follows the client as a part of that trace (broker/trace/tracer.py's `follow`) and
sends the part's lines back over its own link to the origin (TRACE_LINE), where they join
the stream, counted by the trace's rate limit there too. A part applies the rate limit to
its own lines as well, so that a flood never crosses the link: when it triggers, TRACE_END
tells the origin, which ends the trace. The origin's TRACE_STOP ends the parts;
TRACE_STOP_ALL ends every trace of the node it is sent to.

No part outlives its reader for long: a node whose link comes up (a node new, or back) is
sent TRACE_START for the traces read here (a part already running takes no second one),
the parts of a node declared dead end, and an origin that gets lines of a trace it no
longer has (it restarted) answers TRACE_STOP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.cluster import frames
from broker.cluster.frames import (
    TRACE_END,
    TRACE_LINE,
    TRACE_START,
    TRACE_STOP,
    TRACE_STOP_ALL,
)
from broker.trace.trace import Trace, TraceLine
from broker.trace_spec import TraceSpec

if TYPE_CHECKING:
    from broker.cluster.link import PeerLink
    from broker.cluster.ports import TracedNode

FRAMES = frozenset({TRACE_START, TRACE_STOP, TRACE_LINE, TRACE_END, TRACE_STOP_ALL})


class ClusterTracing:
    def __init__(self, links: dict[str, PeerLink], traced: TracedNode) -> None:
        self.links = links  # this node's, by node name
        self.traced = traced  # its tracer
        self.read_here: dict[int, TraceSpec] = {}  # traces read on this node, by id
        self.parts: dict[tuple[str, int], Trace] = {}  # (origin, trace id) -> part here

    # -- the traces read here (broker/peers.py) --------------------------------------------

    def start(self, trace_id: int, spec: TraceSpec) -> None:
        self.read_here[trace_id] = spec
        for node in self.links:
            self._start_on(node, trace_id, spec)

    def stop(self, trace_id: int) -> None:
        if self.read_here.pop(trace_id, None) is not None:
            self._to_all(TRACE_STOP, trace_id)

    def stop_all(self) -> None:
        self._to_all(TRACE_STOP_ALL)

    def link_up(self, node: str) -> None:
        for trace_id, spec in self.read_here.items():
            self._start_on(node, trace_id, spec)

    def node_dead(self, node: str) -> None:
        for (origin, _), part in list(self.parts.items()):
            if origin == node:
                self._end(part, f"node {node} is dead")

    # -- frames from other nodes --------------------------------------------------------

    def on_frame(self, node: str, frame: list[Any]) -> None:
        kind = frame[0]
        tracer = self.traced.tracer
        if kind == TRACE_START:
            self._follow(node, frame[1], _spec(frame[2:]))
        elif kind == TRACE_STOP:
            part = self.parts.get((node, frame[1]))
            if part is not None:
                self._end(part, f"stopped by node {node}")
        elif kind == TRACE_LINE:
            if not tracer.relay(frame[1], TraceLine(*frame[2])):
                self.send(node, TRACE_STOP, frame[1])  # a trace this node no longer has
        elif kind == TRACE_END:
            tracer.part_ended(node, frame[1], str(frame[2]))
        elif kind == TRACE_STOP_ALL:
            tracer.stop_here(f"stopped (trace stop-all on node {node})")

    def _follow(self, origin: str, trace_id: int, spec: TraceSpec) -> None:
        key = (origin, trace_id)
        running = self.parts.get(key)
        if running is not None:
            if running.spec == spec:
                return  # asked again, as a link came back up
            self._end(running, f"replaced: node {origin} restarted")  # its ids start again
        problem = spec.problem()
        if problem is not None:
            raise ValueError(f"TRACE_START: {problem}")

        def ended(_: Trace) -> None:
            self.parts.pop(key, None)

        sink = _Back(self, origin, trace_id)
        self.parts[key] = self.traced.tracer.follow(trace_id, spec, sink, ended)

    def _end(self, part: Trace, reason: str) -> None:
        """End a part whose origin knows it is over (or cannot hear it): nothing goes back."""
        assert isinstance(part.sink, _Back)
        part.sink.told = True
        part.end(reason)

    def _start_on(self, node: str, trace_id: int, spec: TraceSpec) -> None:
        fields = (spec.client_id, spec.mountpoint, spec.rate_max, spec.rate_interval)
        self.send(node, TRACE_START, trace_id, *fields, spec.trunc_payload)

    def send(self, node: str, *frame: Any) -> None:
        """A frame to `node`, over this node's link to it."""
        link = self.links.get(node)
        if link is not None:
            link.send(frames.encode(*frame))

    def _to_all(self, *frame: Any) -> None:
        data = frames.encode(*frame)
        for link in self.links.values():
            link.send(data)


class _Back:
    """A part's sink: its lines go back to the trace's origin."""

    def __init__(self, tracing: ClusterTracing, origin: str, trace_id: int) -> None:
        self.tracing = tracing
        self.origin = origin
        self.trace_id = trace_id
        self.told = False  # the origin stopped the part: it need not hear that it ended

    def line(self, line: TraceLine) -> None:
        self.tracing.send(self.origin, TRACE_LINE, self.trace_id, line.fields())

    def end(self, last: TraceLine) -> None:
        if not self.told:
            self.tracing.send(self.origin, TRACE_END, self.trace_id, last.text)


def _spec(fields: list[Any]) -> TraceSpec:
    """TRACE_START's options (ValueError: not what the frame holds)."""
    client_id, mountpoint, rate_max, rate_interval, trunc_payload = fields
    if not (isinstance(client_id, str) and isinstance(mountpoint, str)):
        raise ValueError("TRACE_START: client id and mountpoint must be strings")
    if not all(type(n) is int for n in (rate_max, rate_interval, trunc_payload)):
        raise ValueError("TRACE_START: rate max, interval and trunc must be integers")
    return TraceSpec(client_id, mountpoint, rate_max, rate_interval, trunc_payload)
