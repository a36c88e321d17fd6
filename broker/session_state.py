"""What a session holds: the state the Session (broker/session.py) and its parts
(broker/acknowledgements.py, broker/delivery_hooks.py, broker/durability.py) work on.

One object per client id (per connection with allow_multiple_sessions), alive as long
as the session: its fields are slots, and the settings it shares with the other sessions
of the same configuration are one tuple for all of them (`_configured`), so that an
idle connection costs little.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.flow import water_marks
from broker.inflight import InflightWindow
from broker.mountpoints import split_subscriber_id
from broker.session_queue import SessionQueue
from broker.subscription_trie import SubOptions

if TYPE_CHECKING:
    import asyncio

    from broker.clock import Clock, Timer
    from broker.flow import FlowControl
    from broker.hook_callers import HookCallers
    from broker.message import Delivery, Message
    from broker.metrics import Metrics
    from broker.outlet import Outlet
    from broker.store import MessageStore
    from broker.subscription_trie import SharedGroup

# The settings sessions are configured with, one tuple per distinct set (there are few):
# shared rather than one per session, which an idle connection would pay for.
_CONFIGURED: dict[tuple[int, int, int, bool, int], tuple[int, int, int, bool, int]] = {}


class SessionState:
    __slots__ = (
        "_configured",
        "_deferred_task",
        "_expiry",
        "_restored",
        "_retry_timer",
        "chains",
        "client_id",
        "clock",
        "deferred",
        "drain_step",
        "durable",
        "expiry_timer",
        "flow",
        "group",
        "held",
        "high_water",
        "low_water",
        "max_offline",
        "max_online",
        "metrics",
        "mountpoint",
        "outlet",
        "owner",
        "pending_will",
        "progress",
        "queue",
        "retry_interval",
        "session_id",
        "shared_policy",
        "store",
        "stuck",
        "subscriber_id",
        "subscriptions",
        "username",
        "window",
    )

    # DeliveryHooks's (broker/delivery_hooks.py): the queue tells it what it lets go.
    message_dropped: Callable[[Delivery, str], None]

    def __init__(
        self,
        subscriber_id: str,
        *,
        max_inflight: int,
        max_online: int,
        max_offline: int,
        lifo: bool,
        metrics: Metrics,
        store: MessageStore,
        chains: HookCallers,
        clock: Clock,
        flow: FlowControl,
        retry_interval: int = 0,
        find_group: Callable[[str], SharedGroup | None] = lambda share: None,
        drain_step: int = 1000,
    ) -> None:
        # The registry's, the store's and the cluster's key: (mountpoint, client id) in
        # one string (broker/mountpoints.py); the client id and tree as the client knows them.
        self.subscriber_id = subscriber_id
        self.mountpoint, self.client_id = split_subscriber_id(subscriber_id)
        self.outlet: Outlet | None = None
        # The last connection's session id and username: offline events report them.
        self.session_id = ""
        self.username: str | None = None
        # Who holds the subscriptions and the offline queue: the session itself, or the
        # MultiSession whose connections share them (allow_multiple_sessions).
        # (Session, broker/session.py, names their types: a Session, a Group.)
        self.owner: SessionState = self
        self.group: object = None  # that MultiSession, when this is one of its members
        self.subscriptions: dict[str, SubOptions] = {}
        # What waits to be sent (broker/session_queue.py), and what was sent and is not
        # acknowledged yet (broker/inflight.py).
        self.queue = SessionQueue(subscriber_id, store, metrics, clock, self, lifo, find_group)
        self.window = InflightWindow(max_inflight)
        # The configured settings, which every CONNECT starts from (see apply_limits).
        configured = (max_inflight, max_online, max_offline, lifo, retry_interval)
        self._configured = _CONFIGURED.setdefault(configured, configured)  # one per config
        self.max_online = max_online
        self.high_water, self.low_water = water_marks(max_online)
        self.max_offline = max_offline
        # How this client's own PUBLISHes pick a shared subscriber (None: the broker's).
        self.shared_policy: str | None = None
        self.metrics = metrics
        self.clock = clock
        self.flow = flow
        self.held = False  # publishers wait for this queue to drain (flow control)
        self.stuck = False  # delivered nothing for slow_subscriber_timeout while held
        self.progress = 0  # messages written to the client
        self._expiry: int | None = 0  # seconds after disconnect; None: never expires
        self.durable = False  # the store keeps its messages (see the expiry property)
        self.expiry_timer: Timer | None = None
        self.pending_will: tuple[Timer, Message] | None = None
        self.store = store
        self.chains = chains  # the hook chains, resolved once for the whole broker
        self.retry_interval = retry_interval  # seconds; 0: resend only on reconnect
        self._retry_timer: Timer | None = None
        # Deliveries waiting for an async on_deliver chain: (delivery, reserved packet id);
        # made when first needed (an idle session costs less).
        self.deferred: deque[tuple[Delivery, int | None]] | None = None
        self._deferred_task: asyncio.Task[None] | None = None
        # A durable session (persistent store, expiry not 0) keeps every queued message
        # and what is in flight in the store too, each delivery under its sequence number
        # (Delivery.seq).
        self._restored = False  # in flight and inbound QoS 2 ids not yet read back
        # Messages moved to the connection, or read back from the store, per loop turn.
        self.drain_step = drain_step

    def __repr__(self) -> str:
        return f"<Session {self.subscriber_id!r} online={self.outlet is not None}>"

    @property
    def online(self) -> bool:
        return self.outlet is not None

    @property
    def inflight(self) -> dict[int, list[Any]]:
        """Packet id -> [Delivery, state] of what is in flight (the window's)."""
        return self.window.entries

    @property
    def on_disk(self) -> int:
        """Queued messages only the store holds (read back in chunks as the queue drains)."""
        return self.queue.on_disk

    @property
    def expiry(self) -> int | None:
        """Seconds the session outlives its connection; None: forever."""
        return self._expiry

    @expiry.setter
    def expiry(self, expiry: int | None) -> None:
        self._expiry = expiry
        # Whether the store keeps this session's messages (docs/storage.md).
        self.durable = self.queue.durable = self.store.persistent and expiry != 0

    def backlog(self) -> int:
        """Deliveries waiting in memory: the queue, and those an async on_deliver holds."""
        deferred = self.deferred
        queued = len(self.queue.memory)
        return queued + len(deferred) if deferred else queued
