"""The hooks a session calls for its deliveries: on_deliver(_m5), which may rewrite what
goes out, and the message events (on_offline_message, on_message_drop,
on_delivery_complete, and the recorder's `completed`).

A synchronous on_deliver chain runs inside `Session._send`. A chain that awaits (a
webhook) does not hold up the loop: `_defer` queues the delivery behind it in `deferred`,
and one task per session works through that queue in order, writing each delivery once
its chain has answered. A QoS 1/2 delivery takes its in-flight slot when it is deferred,
so the window stays exact and a reconnect resends it.

A context (the receiver's view of a delivery) is built only when a chain listens.

`DeliveryHooks` is a part of the Session (broker/session.py): it works on the session's
state (broker/session_state.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.message import Delivery, Message
from broker.mountpoints import outside
from broker.session_state import SessionState
from hooks import Chain, MatchedAcl, Ok, PublishContext, Result
from hooks.spec import new_publish_context

if TYPE_CHECKING:
    from broker.flow import Subscriber
    from broker.outlet import Outlet

log = logging.getLogger("nautilus.session")


def rewritten(delivery: Delivery, result: Result) -> Delivery:
    """on_deliver(_m5) may rewrite topic, payload or properties; errors change nothing."""
    if type(result) is not Ok or not result.modifiers:
        return delivery
    modifiers = result.modifiers
    message = delivery.message
    changed = Message(
        modifiers.get("topic", message.topic),
        modifiers.get("payload", message.payload),
        message.qos,
        message.retain,
        dict(modifiers.get("properties", message.properties)),
        message.sender,
        now=0.0,  # replaced below
    )
    changed.expires_at = message.expires_at  # the same deadline, whatever the plugin said
    return delivery.replace(changed)


@functools.cache
def _matched(label: str) -> MatchedAcl:
    """The publisher's ACL label as delivery events carry it (one object per label)."""
    return MatchedAcl(label)


class DeliveryHooks(SessionState):
    __slots__ = ()

    # The Session's (broker/session.py): writing a delivery, and (for flow control) the
    # subscribers whose draining releases its publishers.
    _write: Callable[[Outlet, Delivery, int | None], None]
    watched: Callable[[], tuple[Subscriber, ...]]

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

    def _event(self, chain: Chain, delivery: Delivery, reason: str = "") -> None:
        """Fire a message event hook, building its context only if someone listens."""
        if chain:
            self.chains.notify(chain, self._context(delivery, reason))

    def _completed(self, delivery: Delivery) -> None:
        """The receiver has the delivery (PUBACK, or PUBREC for QoS 2): on_delivery_complete."""
        chains = self.chains
        if chains.recorder is not None:
            chains.recorder.completed(self, delivery)
        self._event(chains.on_delivery_complete, delivery)

    def message_dropped(self, delivery: Delivery, reason: str) -> None:
        """The queue let a message go (full, or its expiry passed): on_message_drop."""
        self._event(self.chains.on_message_drop, delivery, reason)

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
            self._write(outlet, rewritten(delivery, result), packet_id)
            if self.held and self.backlog() <= self.low_water:
                self.flow.release(self)

    def _deferred_done(self, task: asyncio.Task[None]) -> None:
        self.chains.tasks.discard(task)
        self._deferred_task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("on_deliver failed for %r", self.subscriber_id, exc_info=task.exception())
