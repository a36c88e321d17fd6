"""Flow control: a publisher is read only as fast as the subscribers it feeds take its
messages.

Theory of operation. Every session has a high-water mark on its queue, well below its
queue limit (`max_online_messages`). When routing a PUBLISH leaves some subscriber's queue
at or above that mark, the publisher that sent it is *held*: its connection stops reading
(its socket's buffer fills and TCP slows the device down) until every subscriber it waits
for has drained to its low-water mark. The check runs after each PUBLISH, so one read of
thousands of packets never fills a queue by itself: the rest stay unparsed in the
decoder's buffer. A QoS 1/2 message acknowledged to its publisher therefore always has
room in the queues it was routed to; nothing acknowledged is dropped because the broker
fell behind.

While some subscriber holds publishers (`congested`), a PUBLISH is checked before it is
routed: if a subscriber it goes to is at its high-water mark, the connection keeps the
message, unacknowledged, and is held; it routes it when released. So a queue never goes
above its high-water mark, however many publishers feed it at once (ten thousand devices
flooding one subscriber included), and the check costs nothing while nothing is held.

Fairness. A subscriber fed by several publishers releases them all at once, in the order
they started waiting, rotated by one at each release: the first publisher to run refills
most of the queue, so the lead passes round and each publisher gets its share over a few
releases. A publisher waits only for the subscribers it fed, so a slow subscriber never
holds back publishers that do not feed it.

Shared groups. A message for a shared subscription goes to a member with room, so a
group holds its publishers only once every online member is at its high-water mark; the
publisher then waits for the *group*, released as soon as any of its members drains
(a slow member does not keep it waiting while another could take its messages).

Stuck subscribers. A subscriber that holds publishers and delivers nothing for
`slow_subscriber_timeout` seconds (it stopped reading, or stopped acknowledging) is
*stuck*: its publishers go on, and its own queue limit and drop policy apply (drops are
counted and reported through `on_message_drop`). It stops being stuck as soon as it
delivers again.

This module knows nothing of sockets or sessions' internals: a publisher is a `Reader`
(hold / release) and a subscriber a `Subscriber` (its progress counter and stuck flag).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.clock import Clock, Timer
    from broker.metrics import Metrics

log = logging.getLogger("nautilus.flow")

FLOW_HIGH_WATER = 1024  # queued messages that hold publishers back (at most)


@functools.cache  # the same few limits for every session: their ints are shared too
def water_marks(queue_limit: int) -> tuple[int, int]:
    """(high, low) water marks for a queue of `queue_limit` messages (-1: no limit): half
    the limit, at most FLOW_HIGH_WATER, so publishers stop long before the queue is full.
    (Measured: a high-water mark of 256 instead of 500 for the default 1,000-message queue
    cost a third of the throughput of a flooded 1 -> 1 pair, in hold/release cycles.)"""
    high = FLOW_HIGH_WATER if queue_limit < 0 else max(1, min(queue_limit // 2, FLOW_HIGH_WATER))
    return high, high // 2


class Reader(Protocol):
    """A publisher (its client engine, broker/client/engine.py), as flow control sees it."""

    def hold(self) -> None:
        """Stop reading from the client."""

    def release(self) -> None:
        """Read from the client again."""


class Subscriber(Protocol):
    """A subscriber's session (or a shared group), as flow control sees it."""

    @property
    def client_id(self) -> str: ...

    @property
    def progress(self) -> int:
        """Messages written to its client so far."""

    stuck: bool  # holds no publisher back (set here, cleared by the session on progress)
    held: bool  # some publisher waits for it, or for a group it belongs to (kept here)

    def watched(self) -> Sequence[Subscriber]:
        """The subscribers whose draining releases this one: a shared group's online
        members; a session: none (it releases itself)."""


class FlowControl:
    """The broker's one record of which publishers wait for which subscribers."""

    __slots__ = (
        "_blocked_on",
        "_groups_of",
        "_stall_timers",
        "_waiting",
        "_watched",
        "clock",
        "metrics",
        "timeout",
    )

    def __init__(self, clock: Clock, slow_subscriber_timeout: float, metrics: Metrics) -> None:
        self.clock = clock
        self.timeout = slow_subscriber_timeout
        self.metrics = metrics
        self._waiting: dict[Subscriber, dict[Reader, None]] = {}  # in order of waiting
        self._blocked_on: dict[Reader, set[Subscriber]] = {}
        self._stall_timers: dict[Subscriber, Timer] = {}
        self._watched: dict[Subscriber, Sequence[Subscriber]] = {}  # held group -> members
        self._groups_of: dict[Subscriber, set[Subscriber]] = {}  # member -> held groups

    def waiting_for(self, subscriber: Subscriber) -> list[Reader]:
        return list(self._waiting.get(subscriber, ()))

    def blocked(self, publisher: Reader) -> bool:
        return publisher in self._blocked_on

    # -- holding -----------------------------------------------------------------------

    def hold(self, publisher: Reader, subscribers: Sequence[Subscriber]) -> None:
        """`publisher` just filled these subscribers' queues to their high-water marks."""
        blocked_on = self._blocked_on.get(publisher)
        if blocked_on is None:
            blocked_on = self._blocked_on[publisher] = set()
            publisher.hold()
        for subscriber in subscribers:
            blocked_on.add(subscriber)
            waiting = self._waiting.get(subscriber)
            if waiting is None:
                waiting = self._waiting[subscriber] = {}
                subscriber.held = True
                self._watch(subscriber, subscriber.progress)
                members = subscriber.watched()
                if members:
                    self._watched[subscriber] = members
                    for member in members:
                        self._groups_of.setdefault(member, set()).add(subscriber)
                        member.held = True
            waiting[publisher] = None

    def _watch(self, subscriber: Subscriber, progress: int) -> None:
        self._stall_timers[subscriber] = self.clock.call_later(
            self.timeout, self._check_stall, subscriber, progress
        )

    def _check_stall(self, subscriber: Subscriber, progress: int) -> None:
        """`slow_subscriber_timeout` after it started holding publishers (or after its last
        check): stuck if it delivered nothing meanwhile."""
        del self._stall_timers[subscriber]
        if subscriber.progress != progress:
            return self._watch(subscriber, subscriber.progress)
        log.info(
            "%s: delivered nothing for %ss; publishers no longer wait for it",
            subscriber.client_id,
            self.timeout,
        )
        self.metrics.flow_slow_subscribers += 1
        subscriber.stuck = True
        self.release(subscriber)

    # -- releasing ---------------------------------------------------------------------

    @property
    def congested(self) -> bool:
        """Whether any subscriber holds publishers (then routing checks first)."""
        return bool(self._waiting)

    def release(self, subscriber: Subscriber) -> None:
        """The subscriber drained (or went away, or is stuck): its publishers may go on,
        each once it waits for nothing else."""
        waiting = self._waiting.pop(subscriber, None)
        subscriber.held = False
        timer = self._stall_timers.pop(subscriber, None)
        if timer is not None:
            timer.cancel()
        for member in self._watched.pop(subscriber, ()):  # a group: its members
            groups = self._groups_of.get(member)
            if groups is not None:
                groups.discard(subscriber)
                if not groups:
                    del self._groups_of[member]
                    member.held = member in self._waiting
        for group in self._groups_of.pop(subscriber, ()):  # a member of held groups
            self.release(group)
        if not waiting:
            return
        order = list(waiting)
        if len(order) > 1:  # the lead passes round (see "Fairness" above)
            order.append(order.pop(0))
        blocked_on = self._blocked_on
        for publisher in order:
            subscribers = blocked_on[publisher]
            subscribers.discard(subscriber)
            if not subscribers:
                del blocked_on[publisher]
                publisher.release()

    def forget_publisher(self, publisher: Reader) -> None:
        """The publisher's connection ended: it waits for nobody any more."""
        for subscriber in self._blocked_on.pop(publisher, ()):
            waiting = self._waiting.get(subscriber)
            if waiting is not None:
                waiting.pop(publisher, None)
                if not waiting:
                    self.release(subscriber)
