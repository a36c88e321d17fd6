"""A Session on its own (broker/session.py): a fake outlet and clock, the real memory store,
hook chains, metrics and flow control.

What the client receives is read back from the bytes the session wrote, decoded with the
codec's client-side decoder.
"""

from __future__ import annotations

import math

import pytest

from broker.flow import FlowControl, water_marks
from broker.hook_callers import HookCallers
from broker.message import Delivery, Message
from broker.metrics import Metrics
from broker.protocol import Property, PubRel, ReasonCode
from broker.session import Session
from broker.store import MemoryStore
from hooks import Hooks, PublishContext

from .fakes import FakeClock, FakeOutlet, FakeReader

TOPIC = "t/1"
EXPIRY = Property.MESSAGE_EXPIRY_INTERVAL
STALL = 5.0  # slow_subscriber_timeout


class Events:
    """A plugin that records the message events a session fires."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, str]] = []

    def on_message_drop(self, ctx: PublishContext) -> None:
        self.seen.append(("drop", ctx.payload, ctx.reason))

    def on_offline_message(self, ctx: PublishContext) -> None:
        self.seen.append(("offline", ctx.payload, ctx.reason))

    def on_delivery_complete(self, ctx: PublishContext) -> None:
        self.seen.append(("complete", ctx.payload, ctx.reason))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def make(clock, events):
    """make(**limits) -> an offline Session; attach a FakeOutlet to bring it online."""

    def make(
        *,
        max_inflight: int = 20,
        max_online: int = 1000,
        max_offline: int = 1000,
        lifo: bool = False,
        retry_interval: int = 0,
        plugins: list | None = None,
    ) -> Session:
        metrics = Metrics()
        return Session(
            "sub",
            max_inflight=max_inflight,
            max_online=max_online,
            max_offline=max_offline,
            lifo=lifo,
            metrics=metrics,
            store=MemoryStore(),
            chains=HookCallers(Hooks([("events", events), *(plugins or [])])),
            clock=clock,
            flow=FlowControl(clock, STALL, metrics),
            retry_interval=retry_interval,
        )

    return make


def online(session: Session, protocol_level: int = 4, receive_maximum: int = 65535, **kw):
    outlet = FakeOutlet(protocol_level=protocol_level, **kw)
    session.attach(outlet, receive_maximum)
    return outlet


def delivery(payload: bytes, qos: int = 1, *, now: float = 0.0, expiry: int | None = None):
    properties = {EXPIRY: expiry} if expiry is not None else None
    return Delivery(Message(TOPIC, payload, qos, properties=properties, now=now), qos, False)


def payloads(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_a_session_keeps_its_fields_in_slots(make):
    # Its class is made of parts (broker/session_state.py holds the fields): one part
    # without __slots__ would give every session a dict, an idle connection's memory.
    session = make()
    assert not hasattr(session, "__dict__")
    with pytest.raises(AttributeError):
        session.misspelt = 1


# --------------------------------------------------------------------------- writing


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_message_is_written_at_once_when_the_outlet_has_room(make, qos):
    session = make()
    outlet = online(session)
    assert session.deliver(delivery(b"hello", qos)) is None
    (publish,) = outlet.publishes()
    assert (publish.topic, publish.payload, publish.qos) == (TOPIC, b"hello", qos)
    assert not publish.dup
    assert not session.queue
    assert session.progress == 1
    assert session.metrics.queue_message_out == 1
    assert list(session.inflight) == ([publish.packet_id] if qos else [])


def test_messages_wait_in_the_queue_while_the_outlet_is_full(make):
    session = make()
    outlet = online(session, writable=False)
    for payload in payloads(3):
        assert session.deliver(delivery(payload, 0)) is None
    assert outlet.written == []
    assert len(session.queue) == 3
    outlet.writable = True
    session.deliver(delivery(b"m3", 0))  # behind the queue, not ahead of it
    assert outlet.written == []
    session.drain()
    assert outlet.payloads() == payloads(4)
    assert session.progress == 4


def test_drain_stops_when_the_outlet_fills_again(make):
    session = make()
    outlet = online(session, writable=False)
    for payload in payloads(3):
        session.deliver(delivery(payload, 0))
    outlet.writable = True
    real_write = outlet.write

    def write_and_fill(data: bytes) -> None:
        real_write(data)
        outlet.writable = False

    outlet.write = write_and_fill  # type: ignore[method-assign]
    session.drain()
    assert outlet.payloads() == [b"m0"]
    assert len(session.queue) == 2


def test_qos1_window(make, events):
    session = make(max_inflight=2)
    outlet = online(session)
    for payload in payloads(3):
        session.deliver(delivery(payload, 1))
    first, second = outlet.publishes()
    assert first.packet_id != second.packet_id
    assert len(session.queue) == 1
    session.deliver(delivery(b"q0", 0))  # QoS 0 needs no slot, but keeps its place in line
    session.deliver(delivery(b"m3", 1))
    assert len(outlet.publishes()) == 2
    session.on_pubacks([first.packet_id])
    assert outlet.payloads() == [b"m0", b"m1", b"m2", b"q0"]  # m3 waits for a slot
    session.on_pubacks([second.packet_id])
    assert outlet.payloads() == [b"m0", b"m1", b"m2", b"q0", b"m3"]
    assert [e for e in events.seen if e[0] == "complete"] == [
        ("complete", b"m0", ""),
        ("complete", b"m1", ""),
    ]


def test_the_window_is_the_smaller_of_max_inflight_and_receive_maximum(make):
    session = make(max_inflight=10)
    outlet = online(session, receive_maximum=1)
    for payload in payloads(3):
        session.deliver(delivery(payload, 1))
    assert outlet.payloads() == [b"m0"]
    assert session.window.size == 1


def test_an_unknown_puback_changes_nothing(make):
    session = make(max_inflight=1)
    outlet = online(session)
    session.deliver(delivery(b"a", 1))
    session.deliver(delivery(b"b", 1))
    (sent,) = outlet.publishes()
    session.on_pubacks([sent.packet_id % 65535 + 1])
    assert outlet.payloads() == [b"a"]
    assert list(session.inflight) == [sent.packet_id]


def test_qos2_flow(make):
    session = make(max_inflight=1)
    outlet = online(session)
    session.deliver(delivery(b"a", 2))
    session.deliver(delivery(b"b", 2))
    (sent,) = outlet.publishes()
    assert session.on_pubrec(sent.packet_id, 0) == ReasonCode.SUCCESS
    assert outlet.payloads() == [b"a"]  # the slot is taken until PUBCOMP
    session.on_pubcomp(sent.packet_id)
    assert outlet.payloads() == [b"a", b"b"]
    assert session.on_pubrec(999, 0) == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


def test_a_message_larger_than_the_clients_maximum_is_dropped_for_it(make, events):
    session = make()
    outlet = online(session, max_packet_out=20)
    session.deliver(delivery(b"x" * 100, 1))
    session.deliver(delivery(b"small", 1))
    assert outlet.payloads() == [b"small"]
    assert session.metrics.queue_message_drop == 1
    assert ("drop", b"x" * 100, "max_packet_size_exceeded") in events.seen


# --------------------------------------------------------------------------- flow control


def test_deliver_returns_the_session_from_the_high_water_mark_and_drops_nothing_below_the_limit(
    make,
):
    session = make(max_online=10)
    high, _ = water_marks(10)
    online(session, writable=False)
    results = [session.deliver(delivery(p, 1)) for p in payloads(10)]
    assert results[: high - 1] == [None] * (high - 1)
    assert results[high - 1 :] == [session] * (10 - high + 1)
    assert len(session.queue) == 10  # max_online_messages: nothing dropped up to it
    assert session.metrics.queue_message_drop == 0
    session.deliver(delivery(b"one too many", 1))
    assert session.metrics.queue_message_drop == 1
    assert len(session.queue) == 10


def test_a_stuck_session_holds_no_publisher(make):
    session = make(max_online=10)
    online(session, writable=False)
    session.stuck = True
    assert [session.deliver(delivery(p, 1)) for p in payloads(10)] == [None] * 10


def test_drain_releases_the_held_publishers_at_the_low_water_mark(make):
    session = make(max_online=10, max_inflight=1)
    high, low = water_marks(10)
    outlet = online(session)
    session.deliver(delivery(b"first", 1))  # takes the one in-flight slot
    full = [session.deliver(delivery(p, 1)) for p in payloads(high)]
    assert full[-1] is session
    publisher = FakeReader("pub")
    session.flow.hold(publisher, [session])
    assert session.held
    for queued in range(high - 1, low - 1, -1):
        session.on_pubacks([outlet.publishes()[-1].packet_id])
        assert len(session.queue) == queued
        expected = [("hold", "pub")] if queued > low else [("hold", "pub"), ("release", "pub")]
        assert publisher.log == expected
    assert not session.held


def test_going_offline_releases_the_held_publishers(make):
    session = make(max_online=10)
    online(session, writable=False)
    for payload in payloads(5):
        session.deliver(delivery(payload, 1))
    publisher = FakeReader("pub")
    session.flow.hold(publisher, [session])
    session.detach()
    assert publisher.log[-1] == ("release", "pub")
    assert not session.held


def test_a_stuck_session_that_delivers_again_is_no_longer_stuck(make, clock):
    session = make(max_online=10)
    outlet = online(session, writable=False)
    for payload in payloads(5):
        session.deliver(delivery(payload, 0))
    publisher = FakeReader("pub")
    session.flow.hold(publisher, [session])
    clock.advance(STALL + 0.1)
    assert session.stuck
    assert publisher.log[-1] == ("release", "pub")
    outlet.writable = True
    session.drain()
    assert not session.stuck


# --------------------------------------------------------------------------- full queues


@pytest.mark.parametrize(
    ("lifo", "kept", "dropped"), [(False, [b"m0", b"m1"], b"m2"), (True, [b"m1", b"m2"], b"m0")]
)
def test_a_full_queue_drops_by_its_policy(make, events, lifo, kept, dropped):
    # fifo: the new message is lost (tail drop); lifo: the oldest makes room.
    session = make(max_offline=2, lifo=lifo)
    for payload in payloads(3):
        session.deliver(delivery(payload, 1))
    assert [d.message.payload for d in session.queue] == kept
    assert session.metrics.queue_message_drop == 1
    assert ("drop", dropped, "queue_full") in events.seen


def test_the_online_limit_applies_while_connected(make):
    session = make(max_online=3, max_offline=1)
    online(session, writable=False)
    for payload in payloads(4):
        session.deliver(delivery(payload, 1))
    assert len(session.queue) == 3
    assert session.metrics.queue_message_drop == 1


def test_a_lifo_queue_delivers_newest_first(make):
    session = make(lifo=True)
    for payload in payloads(3):
        session.deliver(delivery(payload, 1))
    outlet = online(session)
    assert outlet.payloads() == [b"m2", b"m1", b"m0"]


def test_offline_qos0_is_counted_as_unhandled(make, events):
    session = make()
    session.deliver(delivery(b"gone", 0))
    session.deliver(delivery(b"kept", 1))
    assert session.metrics.queue_message_unhandled == 1
    assert [d.message.payload for d in session.queue] == [b"kept"]
    assert events.seen == [("offline", b"kept", "")]
    assert online(session).payloads() == [b"kept"]


# --------------------------------------------------------------------------- message expiry


def test_an_expired_message_is_not_sent(make, clock, events):
    session = make()
    session.deliver(delivery(b"short", now=clock.time(), expiry=10))
    session.deliver(delivery(b"long", now=clock.time(), expiry=60))
    clock.advance(10)
    assert online(session).payloads() == [b"long"]
    assert session.metrics.queue_message_expired == 1
    assert ("drop", b"short", "expired") in events.seen


def test_a_message_is_sent_until_its_last_moment(make, clock):
    session = make()
    session.deliver(delivery(b"short", now=clock.time(), expiry=10))
    clock.advance(9.9)
    (publish,) = online(session, protocol_level=5).publishes()
    assert publish.properties[EXPIRY] == 1  # never 0: that would mean "no expiry"


@pytest.mark.parametrize("waited", [0, 0.5, 20, 59.5])
def test_the_interval_on_the_wire_is_what_is_left(make, clock, waited):
    # [MQTT-3.3.2-6]: the forwarded interval is the received one minus the time waited.
    session = make()
    session.deliver(delivery(b"m", now=clock.time(), expiry=60))
    clock.advance(waited)
    outlet = online(session, protocol_level=5)
    (publish,) = outlet.publishes()
    assert publish.properties[EXPIRY] == math.ceil(60 - waited)


@pytest.mark.parametrize("clock", [FakeClock(523579.577), FakeClock()])
def test_the_interval_is_not_rounded_up_past_what_was_received(make, clock):
    # At some clock values (t + 3600) - t is 3600.00000000006 in floats: sent in the
    # loop turn it arrived in (uvloop's clock moves once per turn), it went out as 3601.
    session = make()
    assert session.clock is clock
    session.deliver(delivery(b"m", now=clock.time(), expiry=3600))
    (publish,) = online(session, protocol_level=5).publishes()
    assert publish.properties[EXPIRY] == 3600


def test_the_interval_decreases_between_sends_of_one_message(make, clock):
    # One Message fanned out to two subscribers at different times: each copy carries
    # what is left when it is written, not a cached encoding.
    message = Message(TOPIC, b"m", 1, properties={EXPIRY: 30}, now=clock.time())
    early, late = make(), make()
    early_outlet = online(early, protocol_level=5)
    late_outlet = online(late, protocol_level=5, writable=False)
    early.deliver(Delivery(message, 1, False))
    late.deliver(Delivery(message, 1, False))
    clock.advance(12)
    late_outlet.writable = True
    late.drain()
    assert early_outlet.publishes()[0].properties[EXPIRY] == 30
    assert late_outlet.publishes()[0].properties[EXPIRY] == 18


def test_a_full_queue_lets_go_of_expired_messages_first(make, clock, events):
    session = make(max_offline=2)
    session.deliver(delivery(b"short", now=clock.time(), expiry=5))
    session.deliver(delivery(b"live"))
    clock.advance(4)
    session.deliver(delivery(b"too early"))  # "short" is still live: a real drop
    assert session.metrics.queue_message_drop == 1
    clock.advance(1)
    session.deliver(delivery(b"fits"))
    assert [d.message.payload for d in session.queue] == [b"live", b"fits"]
    assert session.metrics.queue_message_expired == 1
    assert session.metrics.queue_message_drop == 1
    assert ("drop", b"short", "expired") in events.seen


# --------------------------------------------------------------------------- resending


def test_unacknowledged_messages_are_resent_with_dup_on_attach(make):
    session = make()
    first = online(session)
    for payload in payloads(2):
        session.deliver(delivery(payload, 1))
    before = first.publishes()
    session.detach()
    session.deliver(delivery(b"while away", 1))
    again = online(session)
    resent = again.publishes()
    assert [(p.payload, p.packet_id, p.dup) for p in resent] == [
        (b"m0", before[0].packet_id, True),
        (b"m1", before[1].packet_id, True),
        (b"while away", resent[2].packet_id, False),
    ]
    assert resent[2].packet_id not in (before[0].packet_id, before[1].packet_id)


def test_an_unfinished_qos2_exchange_resends_pubrel(make):
    session = make()
    first = online(session)
    session.deliver(delivery(b"once", 2))
    (sent,) = first.publishes()
    session.on_pubrec(sent.packet_id, 0)
    session.detach()
    again = online(session)
    assert again.publishes() == []
    assert again.sent == [PubRel(sent.packet_id)]
    session.on_pubcomp(sent.packet_id)
    assert session.inflight == {}


def test_retry_interval_resends_to_mqtt3_clients(make, clock):
    session = make(retry_interval=20)
    outlet = online(session)
    session.deliver(delivery(b"a", 1))
    clock.advance(5)
    session.deliver(delivery(b"b", 1))
    clock.advance(15)  # 20 s after "a": only "a" has waited a whole interval
    assert [(p.payload, p.dup) for p in outlet.publishes()] == [
        (b"a", False),
        (b"b", False),
        (b"a", True),
    ]
    session.on_pubacks([outlet.publishes()[0].packet_id])
    clock.advance(20)
    assert [(p.payload, p.dup) for p in outlet.publishes()[3:]] == [(b"b", True)]
    assert session.metrics.queue_message_retried == 2


def test_retry_interval_never_resends_to_mqtt5_clients(make, clock):
    # [MQTT-4.4.0-1]: MQTT 5 resends only on a new connection.
    session = make(retry_interval=20)
    outlet = online(session, protocol_level=5)
    session.deliver(delivery(b"a", 1))
    clock.advance(100)
    assert len(outlet.publishes()) == 1
    assert clock.pending == []


def test_deliveries_waiting_for_an_async_on_deliver_count_towards_the_high_water_mark(make):
    # A slow asynchronous on_deliver (a webhook) holds deliveries in `deferred`: they are
    # counted like queued ones, so the publisher is held instead of that deque growing.
    import asyncio

    class SlowHook:
        def __init__(self) -> None:
            self.gate = asyncio.Event()

        async def on_deliver(self, ctx: PublishContext) -> None:
            await self.gate.wait()

    loop = asyncio.new_event_loop()
    try:
        hook = SlowHook()
        session = make(max_inflight=100, max_online=20, plugins=[("slow", hook)])
        high, _ = water_marks(20)
        outlet = online(session)

        async def flood() -> list:
            results = [session.deliver(delivery(p, 0)) for p in payloads(high)]
            assert session.full() and len(session.queue) == 0  # all of them in `deferred`
            return results

        full = loop.run_until_complete(flood())
        assert full[:-1] == [None] * (high - 1) and full[-1] is session
        publisher = FakeReader("pub")
        session.flow.hold(publisher, [session])
        hook.gate.set()

        async def settle() -> None:
            while session.deferred:
                await asyncio.sleep(0)
            await asyncio.sleep(0)

        loop.run_until_complete(settle())
        assert outlet.payloads() == payloads(high)
        assert publisher.log == [("hold", "pub"), ("release", "pub")]
    finally:
        loop.close()


def test_a_stuck_session_keeps_at_most_its_limit_waiting_for_an_async_on_deliver(make, events):
    import asyncio

    class NeverDone:
        async def on_deliver(self, ctx: PublishContext) -> None:
            await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    try:
        session = make(max_inflight=100, max_online=10, plugins=[("never", NeverDone())])
        online(session)
        session.stuck = True  # it delivered nothing for slow_subscriber_timeout

        async def flood() -> None:
            for payload in payloads(15):
                session.deliver(delivery(payload, 0))

        loop.run_until_complete(flood())
        assert session.backlog() <= 10
        assert session.metrics.queue_message_drop == 5
        assert [e for e in events.seen if e[0] == "drop"] == [
            ("drop", p, "queue_full") for p in payloads(15)[10:]
        ]
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
