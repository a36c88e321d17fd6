"""Fakes for unit tests of the core: a clock driven by hand, an outlet that records what a
session writes, and the two sides flow control sees (publishers and subscribers).

Each fake implements the narrow interface the real part offers (broker/clock.py,
broker/outlet.py, broker/flow.py), no more, so a test breaks when the interface changes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from broker.client_state import ClientState
from broker.message import TopicAliases
from broker.protocol import Decoder, Packet, Publish


class FakeTimer:
    """A call_later handle: `cancel()` keeps it from running."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """broker.clock.Clock with time that moves only in `advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, FakeTimer]] = []  # heap: (when, order, timer)
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        return self.call_at(self.now + max(delay, 0.0), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        timer = FakeTimer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def advance(self, seconds: float = 0.0) -> None:
        """Move time forward by `seconds`, running every timer due by then in time order
        (ties in the order they were set), including timers those callbacks set; each
        callback sees the clock at its own due time."""
        end = self.now + seconds
        timers = self._timers
        while timers and timers[0][0] <= end:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self.now = max(self.now, when)
            timer.callback(*timer.args)
        self.now = end

    @property
    def pending(self) -> list[FakeTimer]:
        """The timers still to run, soonest first."""
        return [timer for _, _, timer in sorted(self._timers) if not timer.cancelled]


class FakeLoop(FakeClock):
    """The part of an asyncio loop that `broker.server.Broker` uses without `start()`:
    the clock, plus `call_soon` (run by the next `advance`, even `advance(0)`)."""

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        return self.call_at(self.now, callback, *args)


class FakeOutlet:
    """broker.outlet.Outlet that records what the session wrote.

    `written`: the bytes of each write (PUBLISHes); `sent`: the control packets given to
    `send` (PUBREL). `take_over()` counts the call and runs `on_take_over`, standing for
    the connection's release of its session.
    """

    def __init__(
        self,
        client_id: str = "sub",
        protocol_level: int = 4,
        *,
        writable: bool = True,
        topic_aliases: int = 0,
        max_packet_out: int = 0,
        on_take_over: Callable[[], None] | None = None,
    ) -> None:
        # The client as the session sees it: identity and wire profile.
        self.client = ClientState()
        self.client.client_id = client_id
        self.client.protocol_level = protocol_level
        self.client.aliases_out = TopicAliases(topic_aliases) if topic_aliases else None
        self.client.max_packet_out = max_packet_out
        self.writable = writable
        self.written: list[bytes] = []
        self.sent: list[Packet] = []
        self.taken_over = 0
        self._on_take_over = on_take_over

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def send(self, packet: Packet) -> None:
        self.sent.append(packet)

    def take_over(self) -> None:
        self.taken_over += 1
        if self._on_take_over is not None:
            self._on_take_over()

    def packets(self) -> list[Packet]:
        """Everything written, decoded as the client would decode it."""
        decoder = Decoder("client", self.client.protocol_level)
        for data in self.written:
            decoder.receive_data(data)
        out = []
        while (packet := decoder.next_packet()) is not None:
            out.append(packet)
        return out

    def publishes(self) -> list[Publish]:
        return [p for p in self.packets() if type(p) is Publish]

    def payloads(self) -> list[bytes]:
        return [p.payload for p in self.publishes()]


class FakeReader:
    """A publisher as flow control sees it (broker.flow.Reader). Every hold and release is
    appended to `log` as (event, name); readers can share one log to show the order."""

    def __init__(self, name: str, log: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.log: list[tuple[str, str]] = [] if log is None else log
        self.reading = True

    def __repr__(self) -> str:
        return f"<FakeReader {self.name}>"

    def hold(self) -> None:
        assert self.reading, f"{self.name} held twice"
        self.reading = False
        self.log.append(("hold", self.name))

    def release(self) -> None:
        assert not self.reading, f"{self.name} released while reading"
        self.reading = True
        self.log.append(("release", self.name))


class FakeSubscriber:
    """A subscriber as flow control sees it (broker.flow.Subscriber); hashed by identity,
    as sessions are."""

    def __init__(self, client_id: str = "sub") -> None:
        self.client_id = client_id
        self.progress = 0
        self.stuck = False
        self.held = False
        self.online = True  # for shared groups (broker.subscription_trie.SharedGroup.pick)
        self.at_high_water = False  # likewise

    def full(self) -> bool:
        return self.at_high_water

    def watched(self) -> tuple[FakeSubscriber, ...]:
        return ()

    def __repr__(self) -> str:
        return f"<FakeSubscriber {self.client_id}>"
