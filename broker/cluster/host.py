"""What the cluster uses of the node it is part of: the Broker provides it, and the
cluster names it only through this protocol (it never imports broker/server.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.config import BrokerSettings
    from broker.flow import FlowControl
    from broker.ingress import Ingress
    from broker.metrics import Metrics
    from broker.registry import Registry
    from broker.retain import RetainedMessages
    from broker.router import Router
    from broker.routing import Routing
    from broker.store import MessageStore
    from broker.trace.trace import Sink, Trace, TraceLine, TraceSpec


class Tracing(Protocol):
    """What the cluster uses of the node's tracer (broker/trace/tracer.py): tracing.py's
    parts of other nodes' traces, and the sessions moving (handover.py)."""

    def follow(
        self,
        trace_id: int,
        spec: TraceSpec,
        sink: Sink,
        ended: Callable[[Trace], None] | None = None,
    ) -> Trace: ...

    def relay(self, trace_id: int, line: TraceLine) -> bool: ...

    def part_ended(self, node: str, trace_id: int, reason: str) -> None: ...

    def stop_here(self, reason: str) -> int: ...

    def session_event(self, key: str, what: str) -> None: ...


class Host(Protocol):
    settings: BrokerSettings  # node_name, persistent_client_expiration, drain step
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    router: Router  # other nodes' subscribers go in as RemoteNodes, moving ones as Forwarders
    routing: Routing  # a leaving shared member's deliveries
    ingress: Ingress  # forwarded messages
    registry: Registry  # sessions: taken from dead nodes, handed to and from other nodes
    retained: RetainedMessages  # kept in step with the metadata's
    store: MessageStore  # session records and retained messages
    flow: FlowControl  # links hold publishers, forwarded messages wait for subscribers
    stopping: bool  # the node is shutting down: nothing new is taken on
    shutdown_requested: asyncio.Event  # set: the process stops (the node left its cluster)

    def send_clients_away(self) -> None:
        """No new clients, and the connected ones are disconnected (their sessions stay)."""

    def admin_request(self, command: str, arguments: dict[str, Any]) -> Any:
        """Another node's ADMIN request, run here: its result (ValueError or LookupError:
        refused, the message says why)."""
        ...

    @property
    def tracer(self) -> Tracing:
        """Traces follow their clients on every node (tracing.py)."""
        ...
