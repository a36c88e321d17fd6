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

This module holds connecting, delivering and the session's side of flow control. What a
session holds is SessionState's (broker/session_state.py), and the rest of its work is
in parts, one module per job, each a SessionState too, that the Session class is made of:
- broker/acknowledgements.py: PUBACK, PUBREC, PUBCOMP and PUBREL; resending what is
  unacknowledged (on reconnect, and every retry_interval for MQTT 3);
- broker/delivery_hooks.py: on_deliver (an async chain's deliveries wait in `deferred`)
  and the message events;
- broker/durability.py: what was in flight read back from the store after a restart,
  and everything undelivered handed on (another node, a MultiSession, memory).
The parts are plain methods of the one object: a delivery goes through no extra call.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from broker.acknowledgements import Acknowledgements
from broker.delivery_hooks import DeliveryHooks, rewritten
from broker.durability import Durability
from broker.flow import Subscriber, water_marks
from broker.inflight import AWAITING_ACK, MAX_PACKET_ID
from broker.protocol import MQTT5, hot

if TYPE_CHECKING:
    from broker.client_state import ClientState
    from broker.message import Delivery
    from broker.outlet import Outlet


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


class Session(Acknowledgements, DeliveryHooks, Durability):
    __slots__ = ()  # the fields are SessionState's (broker/session_state.py)

    local = True  # a session on this node (the router also holds other nodes' stand-ins)

    # The types of two of its fields, which SessionState cannot name.
    owner: Session  # the session itself, or the MultiSession whose member it is
    group: Group | None  # that MultiSession

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
            (client.protocol_level == MQTT5) == (level == MQTT5)
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
            and not self.chains.on_deliver[client.protocol_level == MQTT5]
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
        on_deliver = chains.on_deliver[outlet.client.protocol_level == MQTT5]
        if on_deliver:
            if not on_deliver.synchronous:
                return self._defer(on_deliver, delivery)
            delivery = rewritten(delivery, on_deliver.run_sync(self._context(delivery)))
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
