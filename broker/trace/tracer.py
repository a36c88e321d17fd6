"""The node's traces: those whose reader is here (the admin API's streams), and this
node's parts of the traces other nodes' readers asked for (broker/cluster/tracing.py).

Tracing costs nothing while no trace is on: the broker's packet flows and hook chains are
its own, and no connection has a tap. The first trace swaps in flows whose CONNECT
handler looks whether a trace follows the client (one dict lookup per CONNECT) and hook
chains that write the calls made for traced clients (broker/trace/hook_calls.py); the traced
client's connection, if it is here, gets a tap (broker/trace/tap.py). The last trace to
end swaps the broker's own back. Several traces may follow one client, each with its
own options and rate limit.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from broker.client.engine import ClientEngine, PacketHandlers
from broker.connection import Connection
from broker.mountpoints import split_subscriber_id
from broker.protocol import Connect
from broker.trace.hook_calls import Watched, watch
from broker.trace.tap import Tap
from broker.trace.trace import SESSION, TRACE, Sink, Trace, TraceLine
from broker.trace_spec import TraceSpec

if TYPE_CHECKING:
    from broker.config import BrokerSettings
    from broker.hook_callers import HookCallers
    from broker.peers import ClusterTraces


class TracedNode(Protocol):
    """The node as its tracer sees it: the connections it taps, the packet flows and hook
    chains it swaps while a trace is on, the other nodes that trace too (the Broker)."""

    loop: asyncio.AbstractEventLoop
    settings: BrokerSettings  # node_name
    connections: set[Connection]
    handlers: PacketHandlers  # swapped while tracing
    chains: HookCallers  # watched while tracing

    @property
    def peers(self) -> ClusterTraces:
        """The other nodes trace too."""
        ...


class Tracer:
    def __init__(self, traced: TracedNode) -> None:
        self.traced = traced
        self.node = traced.settings.node_name
        self.watched: Watched = {}  # (mountpoint, client id) -> its traces on this node
        self.own: dict[int, Trace] = {}  # the traces read here, by id
        self._ids = itertools.count(1)
        self._handlers = traced.handlers  # the broker's own
        by_packet = {**traced.handlers.by_packet, Connect: self._connecting}
        self._traced_handlers = PacketHandlers(by_packet, traced.handlers.route_held)

    def start(self, spec: TraceSpec, sink: Sink) -> Trace:
        """A trace read here (ValueError: bad options): on this node and the others."""
        problem = spec.problem()
        if problem is not None:
            raise ValueError(problem)
        trace_id = next(self._ids)
        self.traced.peers.start_trace(trace_id, spec)  # first: a trace over at once stops them
        trace = self.follow(trace_id, spec, sink, self._own_ended)
        if not trace.over:
            self.own[trace_id] = trace
        return trace

    def follow(
        self,
        trace_id: int,
        spec: TraceSpec,
        sink: Sink,
        ended: Callable[[Trace], None] | None = None,
    ) -> Trace:
        """A trace of the client on this node: its connection here now, if any, and
        those it makes here later, until the trace ends (`ended` is told then)."""
        on_end = self._ended if ended is None else _both(self._ended, ended)
        trace = Trace(trace_id, spec, sink, self.node, self.traced.loop.time, on_end)
        if not self.watched:
            self._switch(on=True)
        traces = self.watched.setdefault(spec.key, [])
        traces.append(trace)
        connections = [c for c in self.traced.connections if _follows(c.engine, spec)]
        if connections:
            count = len(connections)
            trace.write(TRACE, f"connected here ({count} connection{'s' * (count > 1)}): traced")
        else:
            trace.write(TRACE, "not connected here: traced from its next CONNECT here")
        for connection in connections:
            if connection.engine.tap is None:  # (else another trace's tap: the same list)
                Tap(connection, traces)
        return trace

    def relay(self, trace_id: int, line: TraceLine) -> bool:
        """A line another node's part of trace `trace_id` saw; False: no such trace."""
        trace = self.own.get(trace_id)
        if trace is None:
            return False
        trace.relay(line)
        return True

    def part_ended(self, node: str, trace_id: int, reason: str) -> None:
        """Node `node`'s part of trace `trace_id` ended by itself (its rate limit)."""
        trace = self.own.get(trace_id)
        if trace is not None:
            trace.end(f"{reason} (on node {node})")

    def stop_all(self) -> int:
        """`nautilus admin trace stop-all`: every trace here, and on the other nodes.
        How many ended here."""
        stopped = self.stop_here("stopped (trace stop-all)")
        self.traced.peers.stop_all_traces()
        return stopped

    def stop_here(self, reason: str) -> int:
        """Every trace on this node (read here, or parts of others') ends."""
        traces = [trace for traces in self.watched.values() for trace in traces]
        for trace in traces:
            trace.end(reason)
        return len(traces)

    def session_event(self, key: str, what: str) -> None:
        """Something happened to a session (it moves to another node, its queue with
        it): `key` is the registry's, its subscriber id."""
        for trace in list(self.watched.get(split_subscriber_id(key), ())):
            trace.write(SESSION, what)

    # -- while tracing --------------------------------------------------------------------

    def _connecting(self, engine: ClientEngine, packet: Connect) -> None:
        """CONNECT, while some trace is on: a traced client's connection is tapped
        before anything is done with it (its CONNECT is the first line)."""
        # The listener's mountpoint: a plugin's choice comes later, with auth_on_register
        # (a client a plugin moves is traced from the trace's start, if connected then).
        mountpoint = engine.listener.settings.mountpoint
        traces = self.watched.get((mountpoint, packet.client_id))
        if traces and isinstance(engine.shell, Connection):
            Tap(engine.shell, traces, packet)
        self._handlers.by_packet[Connect](engine, packet)

    def _ended(self, trace: Trace) -> None:
        key = trace.spec.key
        traces = self.watched.get(key, [])
        if trace in traces:
            traces.remove(trace)
        if traces:
            return
        self.watched.pop(key, None)
        for connection in self.traced.connections:
            tap = connection.engine.tap
            if isinstance(tap, Tap) and tap.traces is traces:
                tap.detach()
        if not self.watched:
            self._switch(on=False)

    def _own_ended(self, trace: Trace) -> None:
        self.own.pop(trace.id, None)
        self.traced.peers.stop_trace(trace.id)

    def _switch(self, on: bool) -> None:
        """The broker's flows and chains, or the tracing ones."""
        traced = self.traced
        traced.handlers = self._traced_handlers if on else self._handlers
        traced.chains.watch(functools.partial(watch, watched=self.watched) if on else None)


def _follows(engine: ClientEngine, spec: TraceSpec) -> bool:
    client = engine.client
    return (
        not engine.closing
        and client.client_id == spec.client_id
        and client.mountpoint == spec.mountpoint
    )


def _both(first: Callable[[Trace], None], then: Callable[[Trace], None]) -> Callable[[Trace], None]:
    def ended(trace: Trace) -> None:
        first(trace)
        then(trace)

    return ended
