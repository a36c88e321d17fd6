"""One client's session: subscriptions, the outbound queue and in-flight window, packet ids.

A Session outlives its network connections when the client asked for a persistent session
(MQTT 3: clean session off; MQTT 5: a session expiry interval). While no connection is
attached, QoS 1/2 messages wait in the queue and QoS 0 messages are discarded, as VerneMQ
does. The queue (broker/session_queue.py) is bounded: `max_online_messages` while
connected, `max_offline_messages` while not (-1: no limit); a lifo queue delivers newest
first.

Outbound QoS 1/2 messages get a packet id and stay in the in-flight `window`
(broker/inflight.py) until acknowledged. Unacknowledged ones are sent again, with DUP,
when the session resumes on a new connection [MQTT-4.4.0-1].

A session writes to an `Outlet` (broker/outlet.py), never to a connection, and takes part
in flow control (broker/flow.py): `deliver` says when its queue reached the high-water
mark, so that the publisher is held; `drain` releases the publishers once the queue is
down to the low-water mark. `progress` counts what it wrote, for the stall check.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.flow import Subscriber, water_marks
from broker.inflight import (
    AWAITING_ACK,
    AWAITING_COMP,
    MAX_PACKET_ID,
    RELEASED,
    InflightWindow,
)
from broker.message import Delivery, Message
from broker.mountpoints import outside, split_subscriber_id
from broker.protocol import PubRel, ReasonCode, hot
from broker.router import SubOptions
from broker.session_queue import SessionQueue
from hooks import Chain, MatchedAcl, Ok, PublishContext, Result
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.clock import Clock, Timer
    from broker.flow import FlowControl
    from broker.hook_callers import HookCallers
    from broker.metrics import Metrics
    from broker.outlet import Outlet
    from broker.router import SharedGroup
    from broker.store import MessageStore

log = logging.getLogger("nautilus.session")


def _rewritten(delivery: Delivery, result: Result) -> Delivery:
    """on_deliver(_m5) may rewrite topic, payload or properties; errors change nothing."""
    if type(result) is not Ok or not result.modifiers:
        return delivery
    modifiers = result.modifiers
    message = delivery.message
    rewritten = Message(
        modifiers.get("topic", message.topic),
        modifiers.get("payload", message.payload),
        message.qos,
        message.retain,
        dict(modifiers.get("properties", message.properties)),
        message.sender,
        now=0.0,  # replaced below
    )
    rewritten.expires_at = message.expires_at  # the same deadline, whatever the plugin said
    return delivery.replace(rewritten)


@functools.cache
def _matched(label: str) -> MatchedAcl:
    """The publisher's ACL label as delivery events carry it (one object per label)."""
    return MatchedAcl(label)


class Group(Protocol):
    """The sessions of one client id's connections (allow_multiple_sessions), as each of
    them tells it what happens (broker/multi_session.py)."""

    def join(self, member: Session) -> None:
        """A connection attached to `member`."""
        ...

    def wrote(self) -> None:
        """`member` wrote a message to its client."""
        ...

    def apply_limits(self, limits: dict[str, Any]) -> None: ...


# QoS 0 deliveries a drain writes in one piece at most (a bound on what goes past the
# outlet's high-water mark before it says it is full).
DRAIN_TOGETHER = 512

# The settings sessions are configured with, one tuple per distinct set (there are few):
# shared rather than one per session, which an idle connection would pay for.
_CONFIGURED: dict[tuple[int, int, int, bool, int], tuple[int, int, int, bool, int]] = {}


class Session:
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

    local = True  # a session on this node (the router also holds other nodes' stand-ins)

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
        self.owner: Session = self
        self.group: Group | None = None  # that MultiSession, when this is one of its members
        self.subscriptions: dict[str, SubOptions] = {}
        # What waits to be sent (broker/session_queue.py), and what was sent and is not
        # acknowledged yet (broker/inflight.py).
        self.queue = SessionQueue(
            subscriber_id, store, metrics, clock, self._dropped, lifo, find_group
        )
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

    # -- what the store keeps ------------------------------------------------------------

    def restore(self, queued: int, next_seq: int) -> None:
        """A session a previous run stored: its queue stays in the store until it is
        delivered; what was in flight is read back when the client connects."""
        self.queue.restore(queued, next_seq)
        self._restored = True

    def _read_back_state(self) -> None:
        """The messages in flight and the inbound QoS 2 ids a previous run stored."""
        self._restored = False
        store, client_id, queue = self.store, self.subscriber_id, self.queue
        found: list[tuple[int, Delivery, int]] = []
        for packet_id, seq, state, inline in store.load_inflight(client_id):
            if state == AWAITING_COMP:
                found.append((packet_id, RELEASED, AWAITING_COMP))
                continue
            entry = inline or store.get_entry(client_id, seq)
            if entry is None or entry.delivery is None:
                store.delete_inflight(client_id, packet_id)
                continue
            found.append((packet_id, queue.rejoined(entry), AWAITING_ACK))
            if inline is None:
                queue.on_disk -= 1  # it was counted with the queue's entries
        self.window.restore(found)
        received = store.load_received(client_id)
        if received:
            self.window.received = received

    def _inflight_seqs(self) -> list[int]:
        """The store's sequence numbers of what is in flight (reading the queue back from
        the store steps over them); what a previous run had in flight is read back first."""
        if self._restored:
            self._read_back_state()
        return [delivery.seq for delivery, _ in self.window.entries.values()]

    def stored_backlog(self) -> list[Delivery]:
        """Everything only the store holds (when the session ends, for shared groups)."""
        return self.queue.stored(self._inflight_seqs())

    # -- leaving for another node (broker/cluster) --------------------------------------

    def holds_messages(self) -> bool:
        """Whether anything waits to be delivered: in flight, queued or in the store."""
        queue = self.queue
        return bool(self.window.entries or queue.memory or queue.on_disk or self._restored)

    def leaving_chunk(self, count: int) -> list[Delivery]:
        """The next `count` undelivered messages of a session handed to another node,
        oldest first: in flight and unacknowledged, then queued, then what only the store
        holds (read a chunk at a time). They stay until `forget_sent`."""
        if self._restored:
            self._read_back_state()
        chunk = self.window.unacknowledged()[:count]
        return chunk or self.queue.leaving_chunk(count)

    def forget_sent(self, chunk: list[Delivery]) -> None:
        """A chunk from `leaving_chunk` reached the other node: it is done with here."""
        sent = {id(delivery) for delivery in chunk}
        for packet_id in self.window.remove_sent(sent):
            self.store.delete_inflight(self.subscriber_id, packet_id)
        self.queue.forget_sent(sent)
        for delivery in chunk:
            self.queue.forget(delivery)

    def make_volatile(self) -> None:
        """The session will end with its connection (expiry 0 now): what the store holds
        for it comes back into memory, and the store forgets it (the caller deletes it)."""
        self.queue.extend(self.stored_backlog())  # reads back what was in flight too
        for delivery, _ in self.window.entries.values():
            delivery.seq = -1
        for delivery in self.queue:
            delivery.seq = -1

    # -- attaching connections ---------------------------------------------------------

    def attach(self, outlet: Outlet, receive_maximum: int) -> None:
        """Resume on a new connection: resend what was in flight, then drain the queue."""
        self.outlet = outlet
        self.session_id = outlet.client.session_id
        self.username = outlet.client.username
        self.window.open(receive_maximum)
        if self._restored:
            self._read_back_state()
        inflight = self.window.entries
        for packet_id in inflight:
            self._resend(outlet, packet_id)
        if inflight:
            self._arm_retry(outlet)
        self.drain()
        if self.group is not None:
            self.group.join(self)

    def _resend(self, outlet: Outlet, packet_id: int) -> None:
        """Send an unacknowledged PUBLISH again with DUP, or its PUBREL [MQTT-4.4.0-1]."""
        delivery, state = self.window.entries[packet_id]
        if state == AWAITING_ACK:
            template = delivery.message.template(
                outlet.client.protocol_level,
                delivery.qos,
                delivery.retain,
                delivery.sub_ids,
                self.clock.time(),
            )
            outlet.write(template.with_packet_id(packet_id, dup=True))
        else:
            outlet.send(PubRel(packet_id))

    # -- retry_interval: MQTT 3 clients only ---------------------------------------------

    def _arm_retry(self, outlet: Outlet) -> None:
        """VerneMQ's retry_interval: resend what a 3.x client left unacknowledged that long.
        MQTT 5 forbids resending within a connection [MQTT-4.4.0-1], so never for 5.0."""
        if self.retry_interval and outlet.client.protocol_level < 5 and self._retry_timer is None:
            self.window.mark_for_retry()
            self._retry_timer = self.clock.call_later(self.retry_interval, self._retry)

    def _retry(self) -> None:
        """Resend what was in flight at the last tick and still is: unacknowledged for
        between one and two intervals."""
        self._retry_timer = None
        outlet = self.outlet
        if outlet is None:
            return
        for packet_id in self.window.due_for_retry():
            self.metrics.queue_message_retried += 1
            self._resend(outlet, packet_id)
        if self.window.entries:
            self._arm_retry(outlet)

    def apply_limits(self, limits: dict[str, Any]) -> None:
        """The settings an auth_on_register plugin chose for this connection (VerneMQ's
        modifiers). Every CONNECT starts again from the configured ones, so a resumed
        session does not keep what a plugin said the last time."""
        max_inflight, max_online, max_offline, lifo, retry_interval = self._configured
        self.window.limit = limits.get("max_inflight_messages", max_inflight) or MAX_PACKET_ID
        self.max_online = limits.get("max_online_messages", max_online)
        self.high_water, self.low_water = water_marks(self.max_online)
        self.max_offline = limits.get("max_offline_messages", max_offline)
        self.queue.lifo = limits["queue_type"] == "lifo" if "queue_type" in limits else lifo
        self.retry_interval = limits.get("retry_interval", retry_interval)
        # None: the broker's policy
        self.shared_policy = limits.get("shared_subscription_policy")
        if self.group is not None:
            self.group.apply_limits(limits)  # queue limits belong to the client id

    def _completed(self, delivery: Delivery) -> None:
        """The receiver has the delivery (PUBACK, or PUBREC for QoS 2): on_delivery_complete."""
        chains = self.chains
        if chains.recorder is not None:
            chains.recorder.completed(self, delivery)
        self._event(chains.on_delivery_complete, delivery)

    def _event(self, chain: Chain, delivery: Delivery, reason: str = "") -> None:
        """Fire a message event hook, building its context only if someone listens."""
        if chain:
            self.chains.notify(chain, self._context(delivery, reason))

    def detach(self) -> None:
        """Go offline. A persistent session's undelivered messages are written to the store;
        the publishers waiting for this queue go on."""
        self.outlet = None
        if self.held:
            self.flow.release(self)  # its messages go to the offline queue now
        self.stuck = False
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self.durable:  # the queue is in the store already: memory lets go of it
            queue = self.queue
            queue.on_disk += len(queue.memory)
            queue.clear()

    # -- outbound messages -------------------------------------------------------------

    def deliver(self, delivery: Delivery) -> Subscriber | None:
        """Offer one routed message to this session (the hot path of fan-out).

        Returns the subscriber the publisher must wait for, this session, when its queue
        reached the high-water mark (flow control); None otherwise. Nothing is dropped
        for that.
        """
        outlet = self.outlet
        if outlet is None:
            if delivery.qos == 0:
                self.metrics.queue_message_unhandled += 1
            else:
                self._event(self.chains.on_offline_message, delivery)
                if self.durable:
                    self.queue.put_stored(delivery, self.max_offline, self._inflight_seqs)
                else:
                    self.queue.put(delivery, self.max_offline)
            return None
        queue = self.queue
        if queue.on_disk:  # a backlog waits in the store: this joins it, in order
            queue.put_stored(delivery, self.max_offline, self._inflight_seqs)
            return None
        window = self.window
        if (
            not queue.memory
            and outlet.writable
            and (delivery.qos == 0 or len(window.entries) < window.size)
        ):
            self._send(outlet, delivery)
            deferred = self.deferred  # waiting for an async on_deliver: counted as queued
            if deferred and len(deferred) >= self.high_water and not self.stuck:
                return self
            return None
        queue.put(delivery, self.max_online)
        queued = len(queue.memory)  # backlog(), inlined: this runs for every queued delivery
        if self.deferred:
            queued += len(self.deferred)
        if queued >= self.high_water and not self.stuck:
            return self
        return None

    def takes_run(self, level: int, longest: int) -> bool:
        """Whether a run of QoS 0 messages, unretained and without properties, published
        at protocol `level` in packets of at most `longest` bytes, would go out to this
        session now exactly as published (Routing.publish_run): online and writable with
        nothing queued before them, the same protocol family (so the same encoding), no
        Topic Alias, Maximum Packet Size or plugin on the delivery to change a byte.
        A writable session with messages still queued sends them first (a drain step): if
        that empties the queue, the run follows them directly. (Without it, a publisher
        released while a few messages remained would have every later message queued
        behind them, one by one, for as long as it keeps the queue from emptying.)"""
        outlet = self.outlet
        if outlet is None or not outlet.writable or self.queue.on_disk:
            return False
        if self.queue.memory:
            self.drain()
            if self.queue.memory or not outlet.writable:
                return False
        client = outlet.client
        limit = client.max_packet_out
        return (
            (client.protocol_level == 5) == (level == 5)
            and (not limit or longest <= limit)
            and self._as_published(client)
        )

    def _as_published(self, client: ClientState) -> bool:
        """Whether nothing on the way to this client changes a byte of what was published
        (at its protocol family and QoS): no Topic Alias and no plugin on the delivery.
        (Maximum Packet Size is the caller's to check: it drops, it does not change.)"""
        return (
            client.aliases_out is None
            and not self.deferred
            and self.group is None
            and not self.chains.on_deliver[client.protocol_level == 5]
        )

    def write_run(self, data: bytes, count: int) -> None:
        """Write `count` QoS 0 deliveries at once (the packets of a run, see takes_run)."""
        assert self.outlet is not None
        self.outlet.write(data)
        self._wrote(count)

    def _wrote(self, count: int) -> None:
        self.progress += count
        self.metrics.queue_message_out += count
        self.metrics.mqtt_publish_sent += count

    def full(self) -> bool:
        """Whether a publisher must wait before routing to this session (flow control)."""
        return self.outlet is not None and not self.stuck and self.backlog() >= self.high_water

    def backlog(self) -> int:
        """Deliveries waiting in memory: the queue, and those an async on_deliver holds."""
        deferred = self.deferred
        queued = len(self.queue.memory)
        return queued + len(deferred) if deferred else queued

    def must_wait_for(self) -> Session | None:
        """The session whose queue a publisher must wait for before routing here."""
        return self if self.full() else None

    def watched(self) -> tuple[Session, ...]:
        return ()  # flow.Subscriber: a session releases its publishers itself

    def has_room(self, qos: int) -> bool:
        """Whether a message would go out now rather than wait in the queue."""
        outlet = self.outlet
        window = self.window
        return (
            outlet is not None
            and not self.queue.memory
            and outlet.writable
            and (qos == 0 or len(window.entries) < window.size)
        )

    def _dropped(self, delivery: Delivery, reason: str) -> None:
        """The queue let a message go (full, or its expiry passed): on_message_drop."""
        self._event(self.chains.on_message_drop, delivery, reason)

    def _send(self, outlet: Outlet, delivery: Delivery) -> None:
        message = delivery.message
        if message.expires_at is not None and message.expired(self.clock.time()):
            # Not yet on its way to this subscriber: the copy is deleted [MQTT-3.3.2-5].
            self.metrics.queue_message_expired += 1
            self.queue.forget(delivery)
            return self._event(self.chains.on_message_drop, delivery, "expired")
        chains = self.chains
        recorder = chains.recorder
        if recorder is not None:
            recorder.delivered(self, delivery)
        on_deliver = chains.on_deliver[outlet.client.protocol_level == 5]
        if on_deliver:
            if not on_deliver.synchronous:
                return self._defer(on_deliver, delivery)
            delivery = _rewritten(delivery, on_deliver.run_sync(self._context(delivery)))
        self._write(outlet, delivery, None)

    def _write(self, outlet: Outlet, delivery: Delivery, packet_id: int | None) -> None:
        """Encode and send one delivery (packet_id: a slot reserved by _defer)."""
        message, qos = delivery.message, delivery.qos
        client = outlet.client
        now = self.clock.time() if message.expires_at is not None else 0.0
        alias = None
        aliases = client.aliases_out
        if aliases is not None:
            alias, known = aliases.lookup(message.topic)
        # QoS 1/2 as received: one copy with its packet id patched, no template to make
        # (each subscriber's bytes differ anyway).
        raw = None
        if qos and alias is None:
            raw = message.as_received(client.protocol_level, qos, delivery.sub_ids)
        if raw is not None:
            size = len(raw)
        else:
            if alias is None:
                template = message.template(
                    client.protocol_level, qos, delivery.retain, delivery.sub_ids, now
                )
            else:
                template = message.aliased(
                    qos, delivery.retain, delivery.sub_ids, now, alias, known
                )
            size = len(template.data)
        limit = client.max_packet_out
        if limit and size > limit:
            # Larger than the client accepts: dropped for this client only [MQTT-3.1.2-25].
            self.metrics.queue_message_drop += 1
            if packet_id is not None:
                self.window.remove(packet_id)
            self.queue.forget(delivery)
            return self._event(self.chains.on_message_drop, delivery, "max_packet_size_exceeded")
        if qos == 0:
            outlet.write(template.data)
            if delivery.seq >= 0:
                self.queue.forget(delivery)
        else:
            if packet_id is None:
                packet_id = self.window.add(delivery)
            else:  # reserved by _defer: on_deliver may have rewritten the message
                self.window.entries[packet_id] = [delivery, AWAITING_ACK]
            if self.durable:
                if delivery.seq < 0:  # sent at once: one record carries it
                    self.store.put_inflight_entry(self.subscriber_id, packet_id, delivery)
                else:
                    self.store.put_inflight(
                        self.subscriber_id, packet_id, delivery.seq, AWAITING_ACK
                    )
            if raw is not None:
                outlet.write(hot.publish_with_id(raw, packet_id, delivery.retain))
            else:
                outlet.write(template.with_packet_id(packet_id))
            if self._retry_timer is None and self.retry_interval:
                self._arm_retry(outlet)
        if alias is not None and not known:
            assert aliases is not None
            aliases.learned(message.topic, alias)
        self.progress += 1
        if self.group is not None:
            self.group.wrote()
        self.metrics.queue_message_out += 1
        self.metrics.mqtt_publish_sent += 1

    def _context(self, delivery: Delivery, reason: str = "") -> PublishContext:
        """The receiver's view of a delivery, for on_deliver and the message events."""
        outlet = self.outlet
        message = delivery.message
        label = message.acl_name
        return new_publish_context(
            self.client_id,
            self.username,
            outlet.client.attributes if outlet is not None else {},
            self.session_id,
            outside(message.topic) if self.mountpoint else message.topic,
            message.payload,
            delivery.qos,
            delivery.retain,
            message.properties,
            _matched(label) if label else None,
            delivery.seq >= 0,
            reason,
            self.mountpoint,
        )

    # -- on_deliver served by an async plugin (e.g. a webhook) ---------------------------

    def _defer(self, chain: Chain, delivery: Delivery) -> None:
        """Queue a delivery behind the async on_deliver chain; one task per session works
        through them in order. A QoS 1/2 delivery takes its in-flight slot (and packet id)
        now, so the window stays exact and a reconnect resends it. A stuck session (which
        holds no publisher back) keeps at most max_online_messages waiting here too."""
        if self.stuck and 0 <= self.max_online <= self.backlog():
            self.metrics.queue_message_drop += 1
            self.queue.forget(delivery)
            return self._event(self.chains.on_message_drop, delivery, "queue_full")
        packet_id = None
        if delivery.qos:
            packet_id = self.window.add(delivery)
            if self.durable and delivery.seq < 0:
                self.queue.keep(delivery)
        if self.deferred is None:
            self.deferred = deque()
        self.deferred.append((delivery, packet_id))
        if self._deferred_task is None:
            task = asyncio.ensure_future(self._deliver_deferred(chain))
            self._deferred_task = task
            self.chains.tasks.add(task)
            task.add_done_callback(self._deferred_done)

    async def _deliver_deferred(self, chain: Chain) -> None:
        deferred = self.deferred
        while deferred:
            delivery, packet_id = deferred.popleft()
            if self.outlet is None:
                continue  # QoS 1/2 wait in flight for the reconnect; QoS 0 is lost
            result = await chain.run(self._context(delivery))
            outlet = self.outlet
            gone = packet_id is not None and packet_id not in self.window.entries
            if outlet is None or gone:
                continue  # gone meanwhile, or the session ended
            self._write(outlet, _rewritten(delivery, result), packet_id)
            if self.held and self.backlog() <= self.low_water:
                self.flow.release(self)

    def _deferred_done(self, task: asyncio.Task[None]) -> None:
        self.chains.tasks.discard(task)
        self._deferred_task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("on_deliver failed for %r", self.subscriber_id, exc_info=task.exception())

    def drain(self) -> None:
        """Move queued messages to the connection while the window and the outlet allow,
        then let the held publishers go on once the queue is down to the low-water mark.

        At most `drain_step` (max_msgs_per_drain_step) per call: the connection asks for
        the next step after it has flushed, so a long queue goes out in bounded writes, one
        per loop turn; a stored backlog is read back one such step at a time.
        """
        outlet = self.outlet
        queued = self.queue
        progress = self.progress
        if outlet is not None and not queued.memory and queued.on_disk and outlet.writable:
            queued.read_chunk(self.drain_step, self._inflight_seqs())
        queue = queued.memory
        if outlet is not None and queue:
            assert isinstance(queue, deque)  # not the shared empty queue: it holds something
            lifo = queued.lifo
            pop = queue.pop if lifo else queue.popleft
            inflight = self.window.entries
            size = self.window.size
            # QoS 0 deliveries that go out as they were published are written together.
            client = outlet.client
            level = client.protocol_level
            plain = not client.max_packet_out and self._as_published(client)
            recorder = self.chains.recorder
            together: list[bytes] = []
            for _ in range(self.drain_step):
                if not queue or not outlet.writable:
                    break
                delivery = queue[-1] if lifo else queue[0]
                raw = None
                if delivery.qos:
                    if len(inflight) >= size:
                        break
                elif plain:
                    raw = delivery.message.as_received(level, 0, delivery.sub_ids)
                    if raw is not None and (raw[0] & 1) != delivery.retain:
                        raw = None  # the retain flag differs: the template's bytes
                pop()
                if raw is None:
                    if together:  # in order: those first
                        self._write_together(outlet, together)
                    self._send(outlet, delivery)
                    continue
                if recorder is not None:  # as _send tells it
                    recorder.delivered(self, delivery)
                together.append(raw)
                if delivery.seq >= 0:
                    queued.forget(delivery)
                if len(together) >= DRAIN_TOGETHER:
                    self._write_together(outlet, together)
            if together:
                self._write_together(outlet, together)
        if self.stuck and self.progress != progress:
            self.stuck = False  # it reads again: it may hold publishers back again
        if self.held and self.backlog() <= self.low_water:
            self.flow.release(self)

    def _write_together(self, outlet: Outlet, together: list[bytes]) -> None:
        outlet.write(b"".join(together))
        self._wrote(len(together))
        together.clear()

    # -- inbound QoS 2 -------------------------------------------------------------------

    def receive_qos2(self, packet_id: int) -> None:
        """An inbound QoS 2 PUBLISH was routed: a resend of it must not be [MQTT-4.3.3]."""
        self.window.receive_qos2(packet_id)
        if self.durable:
            self.store.put_received(self.subscriber_id, packet_id)

    def release_qos2(self, packet_id: int) -> bool:
        """PUBREL: False when the packet id was not awaiting one."""
        if not self.window.release_qos2(packet_id):
            return False
        if self.durable:
            self.store.delete_received(self.subscriber_id, packet_id)
        return True

    # -- acknowledgements from the client ----------------------------------------------

    def on_pubacks(self, packet_ids: list[int]) -> None:
        """PUBACKs, in order: their deliveries are complete, and the window's free slots
        are refilled from the queue in one drain."""
        window = self.window
        completed = False
        for packet_id in packet_ids:
            delivery = window.puback(packet_id)
            if delivery is not None:
                if self.durable:
                    self.store.delete_inflight(self.subscriber_id, packet_id)
                    self.queue.forget(delivery)
                self._completed(delivery)
                completed = True
        if completed:
            self.drain()

    def on_pubrec(self, packet_id: int, reason_code: int) -> int:
        """Returns the reason code for our PUBREL [MQTT-4.3.3]."""
        delivery = self.window.pubrec(packet_id)
        if delivery is None:
            return ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        stored = self.durable
        if stored:
            self.queue.forget(delivery)  # the receiver has it (or refused it): the body goes
        if reason_code >= 0x80:  # the receiver refused the message: the exchange ends here
            self.window.remove(packet_id)
            if stored:
                self.store.delete_inflight(self.subscriber_id, packet_id)
            self.drain()
            return -1
        if stored:  # only the packet id is kept now, for the PUBREL
            self.store.put_inflight(self.subscriber_id, packet_id, 0, AWAITING_COMP)
        self._completed(delivery)  # Courier: on PUBREC for QoS 2
        return ReasonCode.SUCCESS

    def on_pubcomp(self, packet_id: int) -> None:
        if self.window.pubcomp(packet_id):
            if self.durable:
                self.store.delete_inflight(self.subscriber_id, packet_id)
            self.drain()

    # -- a connection of several (allow_multiple_sessions) -----------------------------

    def take_back(self) -> list[Delivery]:
        """What this session was given and the client did not acknowledge, oldest first:
        PUBLISHes awaiting PUBACK/PUBREC, deliveries waiting for on_deliver, the queue.
        They leave the session (a MultiSession hands them on)."""
        unacked = self.window.unacknowledged()
        if self.deferred:
            unacked.extend(d for d, packet_id in self.deferred if packet_id is None)
            self.deferred.clear()
        unacked.extend(self.queue)
        self.window.entries.clear()
        self.queue.clear()
        return unacked
