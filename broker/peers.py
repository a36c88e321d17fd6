"""What the core tells the other nodes of a cluster, and asks of them: the interfaces
between this node and `broker/cluster/`'s Cluster, one per role, as each of the core's
users sees the other nodes (a client's engine, routing and the registry, the server,
the admin side, the tracer).

A node not in a cluster has `ALONE`, which has nothing to tell and nothing to ask: the
core never asks whether there is a cluster, it tells its peers and goes on.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from broker.message import Message
    from broker.session import Session
    from broker.subscription_trie import SubOptions
    from broker.trace_spec import TraceSpec
    from hooks import Metric

# -- what crosses: the answers the core gets from the other nodes ----------------------


class MetadataUnavailable(Exception):
    """The cluster's metadata cannot be reached; the message says why in one line."""


class StaleRequest(Exception):
    """A write with a timestamp not newer than the stored one."""


@dataclass(slots=True)
class Registration:
    """What registering a client id on this node found: the node that owned it before
    (None: nobody), whether a session resumes (there was one, and neither it nor the new
    connection is clean) and the subscriptions it resumes with."""

    previous_node: str | None
    existed: bool  # a session resumes: CONNACK's session present
    subscriptions: dict[str, SubOptions]


class Answer(NamedTuple):
    """One node's answer to an operator's request (`ask_others`): its result, or why
    there is none."""

    node: str
    error: str | None
    result: Any


class NetsplitSwitches(Protocol):
    """What a netsplit refuses: the ingress (publishes) and the subscribe flow ask."""

    # A member of the cluster cannot be reached (metadata = "swc"): the netsplit switches
    # apply (`refuses`). Read on the hot path before anything else is asked.
    split: bool

    def refuses(self, action: str) -> str | None:
        """Why `action` ("register", "publish", "subscribe", "unsubscribe") is refused
        now (a netsplit, and its allow_*_during_netsplit off), or None. Counted."""
        ...


class ClientOwnership(NetsplitSwitches, Protocol):
    """What a client's engine tells and asks as it connects and subscribes
    (broker/client/): its client id owned here cluster-wide."""

    def register(
        self, client_id: str, clean: bool
    ) -> Coroutine[Any, Any, Registration | None] | None:
        """Before a CONNACK: what makes this node the owner of `client_id` cluster-wide
        (the node that held it releases it, its queue follows), to be awaited; None when
        nothing is to be done."""
        ...

    def registered(
        self, client_id: str, session: Session, registration: Registration | None, fresh: bool
    ) -> None:
        """The session a connection of `client_id` attached to, after `register`."""
        ...


class SharedRecords(NetsplitSwitches, Protocol):
    """What routing, the registry and the ingress tell the other nodes, or ask
    (`Routing.peers`): sessions' and retained messages' changes, and the netsplit."""

    def changed(self, client_id: str) -> None:
        """The session of `client_id` changed: its subscriptions, or it ended."""
        ...

    def retained(self, message: Message) -> None:
        """A retained message was published on this node."""
        ...


class ClusterOverview(Protocol):
    """What /health, /metrics, $SYS and `cluster status` show of the cluster."""

    def problem(self) -> str | None:
        """What keeps the cluster from working as it should (for /health), if anything."""
        ...

    def status(self) -> dict[str, Any] | None:
        """The cluster's nodes, links and routing score; None when not in a cluster."""
        ...

    def alive(self) -> list[str] | None:
        """This node and the other members alive now, sorted; None when not in a cluster."""
        ...

    def figures(self) -> dict[str, int]:
        """Gauges for /metrics and $SYS (the leaderless metadata's); none alone."""
        ...

    def group_metrics(self) -> list[Metric]:
        """/metrics' labelled figures (the leaderless metadata's, per group)."""
        ...


class ClusterOperations(ClusterOverview, Protocol):
    """What an operator asks of the cluster (broker/admin.py, broker/http/): what it
    shows, members joining and leaving, and a command run on every node."""

    def join(self, address: str) -> str:
        """Join the cluster of the node listening at `address` (ValueError: cannot)."""
        ...

    async def leave(self, node: str) -> str:
        """Member `node` (empty: this node) leaves the cluster: a live one with its
        sessions, one that cannot be reached is removed (ValueError: cannot)."""
        ...

    async def ask_others(
        self, command: str, arguments: dict[str, Any], nodes: Iterable[str] | None = None
    ) -> list[Answer]:
        """Run an admin command (broker/admin.py's `HERE`) on every other node alive
        (or on those of `nodes` that are), at once; a node that does not answer within
        ADMIN_TIMEOUT is one Answer with that error, not a wait. Alone: nobody to ask."""
        ...


class ClusterTraces(Protocol):
    """Traces read on this node follow their client on the others (broker/trace/)."""

    def start_trace(self, trace_id: int, spec: TraceSpec) -> None:
        """Trace `trace_id`, read on this node, follows its client on the others too:
        their lines come back here."""
        ...

    def stop_trace(self, trace_id: int) -> None:
        """Trace `trace_id` is over: the others stop their part of it."""
        ...

    def stop_all_traces(self) -> None:
        """`trace stop-all`: the others end every trace they have."""
        ...


class Alone:
    """The other nodes of a node that is not in a cluster: every role above, with
    nothing to tell and nothing to ask."""

    split = False

    async def bind(self) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def register(self, client_id: str, clean: bool) -> None:
        return None

    def registered(
        self, client_id: str, session: Session, registration: Registration | None, fresh: bool
    ) -> None:
        pass

    def changed(self, client_id: str) -> None:
        pass

    def retained(self, message: Message) -> None:
        pass

    def problem(self) -> None:
        return None

    def status(self) -> None:
        return None

    def alive(self) -> None:
        return None

    def figures(self) -> dict[str, int]:
        return {}

    def join(self, address: str) -> str:
        raise ValueError("this node is not in a cluster ([cluster] address is empty)")

    def refuses(self, action: str) -> None:
        return None

    def group_metrics(self) -> list[Metric]:
        return []

    async def leave(self, node: str) -> str:
        raise ValueError("this node is not in a cluster ([cluster] address is empty)")

    async def ask_others(
        self, command: str, arguments: dict[str, Any], nodes: Iterable[str] | None = None
    ) -> list[Answer]:
        return []

    def start_trace(self, trace_id: int, spec: TraceSpec) -> None:
        pass

    def stop_trace(self, trace_id: int) -> None:
        pass

    def stop_all_traces(self) -> None:
        pass


ALONE = Alone()
