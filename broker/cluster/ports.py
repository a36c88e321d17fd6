"""What the cluster uses of the node it is part of, one port per role. The Broker provides
each of them (broker/server.py hands itself in for every role), and the cluster names it
only through these protocols: it never imports broker/server.py. Each part of the
cluster is given only the ports it uses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.config import BrokerSettings
    from broker.flow import FlowControl
    from broker.ingress import Ingress
    from broker.metrics import Metrics
    from broker.registry import Registry
    from broker.retain import RetainedMessages
    from broker.routing import Routing
    from broker.store import MessageStore
    from broker.subscription_trie import SubscriptionTrie
    from broker.trace.trace import Sink, Trace, TraceLine
    from broker.trace_spec import TraceSpec


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


class TracedNode(Protocol):
    """Traces follow their clients on every node (tracing.py)."""

    @property
    def tracer(self) -> Tracing: ...


class NodeSessions(Protocol):
    """This node's sessions as the cluster hands them to and from other nodes, takes a
    dead node's and a leaving node's (handover.py, adoption.py)."""

    settings: BrokerSettings  # persistent_client_expiration, the drain step
    registry: Registry
    router: SubscriptionTrie  # moving sessions' subscriptions, as Forwarders and stand-ins
    routing: Routing  # a leaving shared member's deliveries
    store: MessageStore  # session records
    flow: FlowControl  # a migrating queue fed no faster than its session takes it
    stopping: bool  # the node is shutting down: nothing new is taken on

    @property
    def tracer(self) -> Tracing: ...


class MirroredState(Protocol):
    """What the metadata mirrors of this node (sync.py): its sessions' records and the
    retained messages, both ways."""

    registry: Registry
    retained: RetainedMessages  # kept in step with the metadata's
    store: MessageStore  # retained messages
    stopping: bool


class NodeRouting(Protocol):
    """This node's routing, for what the other nodes send (incoming.py) and the
    subscribers they hold (view.py, the links' flow control)."""

    router: SubscriptionTrie  # other nodes' subscribers go in as RemoteNodes
    ingress: Ingress  # forwarded messages
    flow: FlowControl  # links hold publishers, forwarded messages wait for subscribers


class NodeExit(Protocol):
    """What leaving the cluster does to this node (departure.py)."""

    registry: Registry  # the sessions to hand over
    shutdown_requested: asyncio.Event  # set: the process stops (the node left its cluster)

    def send_clients_away(self) -> None:
        """No new clients, and the connected ones are disconnected (their sessions stay)."""


class AdminRequests(Protocol):
    """Another node's part of a cluster-wide admin command (operations.py)."""

    def admin_request(self, command: str, arguments: dict[str, Any]) -> Any:
        """Run here: its result (ValueError or LookupError: refused, the message says
        why)."""
        ...


@dataclass(frozen=True)
class NodePorts:
    """The node, role by role, as the Cluster is made (broker/server.py)."""

    settings: BrokerSettings  # node_name
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    sessions: NodeSessions
    mirrored: MirroredState
    routing: NodeRouting
    exit: NodeExit
    admin: AdminRequests
    traced: TracedNode
