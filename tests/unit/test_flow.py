"""FlowControl on its own (broker/flow.py): fake publishers and subscribers, a fake clock."""

from __future__ import annotations

import pytest

from broker.flow import FLOW_HIGH_WATER, FlowControl, water_marks
from broker.metrics import Metrics
from broker.subscription_trie import SharedGroup, SubOptions

from .fakes import FakeClock, FakeReader, FakeSubscriber

TIMEOUT = 2.0  # slow_subscriber_timeout


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def flow(clock) -> FlowControl:
    return FlowControl(clock, TIMEOUT, Metrics())


def readers(*names: str) -> tuple[list[tuple[str, str]], list[FakeReader]]:
    log: list[tuple[str, str]] = []
    return log, [FakeReader(name, log) for name in names]


def released(log: list[tuple[str, str]]) -> list[str]:
    return [name for event, name in log if event == "release"]


# --------------------------------------------------------------------------- water marks


@pytest.mark.parametrize(
    ("limit", "marks"),
    [
        (-1, (FLOW_HIGH_WATER, FLOW_HIGH_WATER // 2)),
        (1000, (500, 250)),
        (100_000, (1024, 512)),
        (10, (5, 2)),
        (1, (1, 0)),
    ],
)
def test_water_marks(limit, marks):
    assert water_marks(limit) == marks


# --------------------------------------------------------------------------- hold / release


def test_hold_stops_the_publisher_once_and_release_lets_it_go(flow):
    log, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    flow.hold(pub, [sub])  # a second full PUBLISH while held: no second hold
    assert log == [("hold", "pub")]
    assert flow.blocked(pub)
    assert sub.held
    assert flow.waiting_for(sub) == [pub]

    flow.release(sub)
    assert log == [("hold", "pub"), ("release", "pub")]
    assert not flow.blocked(pub)
    assert not sub.held
    assert flow.waiting_for(sub) == []


def test_release_of_a_subscriber_nobody_waits_for_does_nothing(flow):
    log, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.release(sub)
    assert log == []
    assert not flow.blocked(pub)
    assert not sub.held


def test_a_publisher_waiting_for_two_subscribers_goes_on_when_both_drained(flow):
    log, (pub,) = readers("pub")
    a, b = FakeSubscriber("a"), FakeSubscriber("b")
    flow.hold(pub, [a])
    flow.hold(pub, [b])  # a later PUBLISH filled another queue
    flow.release(a)
    assert released(log) == []
    assert flow.blocked(pub)
    assert not a.held and b.held
    flow.release(b)
    assert released(log) == ["pub"]


def test_a_subscriber_holds_back_only_the_publishers_that_feed_it(flow):
    log, (p1, p2) = readers("p1", "p2")
    slow, other = FakeSubscriber("slow"), FakeSubscriber("other")
    flow.hold(p1, [slow])
    flow.hold(p2, [other])
    flow.release(other)
    assert released(log) == ["p2"]
    assert flow.blocked(p1)


def test_release_order_rotates_so_each_publisher_leads_in_turn(flow):
    # Each round, the publishers wait in the order they were let go last time (the first
    # to run refills the queue first): the lead must pass round, not stay with one.
    log, pubs = readers("p1", "p2", "p3")
    sub = FakeSubscriber()
    order = pubs
    leads = []
    for _ in range(3):
        for pub in order:
            flow.hold(pub, [sub])
        log.clear()
        flow.release(sub)
        names = released(log)
        assert sorted(names) == ["p1", "p2", "p3"]  # all of them, each once
        leads.append(names[0])
        order = [next(p for p in pubs if p.name == name) for name in names]
    assert sorted(leads) == ["p1", "p2", "p3"]


def test_congested_while_any_subscriber_holds_publishers(flow):
    # Routing checks subscribers before delivering only while this is true.
    _, (pub,) = readers("p")
    sub = FakeSubscriber()
    assert not flow.congested
    flow.hold(pub, [sub])
    assert flow.congested
    flow.release(sub)
    assert not flow.congested


def test_forget_publisher(flow, clock):
    log, (gone, stays) = readers("gone", "stays")
    shared, own = FakeSubscriber("shared"), FakeSubscriber("own")
    flow.hold(gone, [shared, own])
    flow.hold(stays, [shared])
    flow.forget_publisher(gone)
    assert not flow.blocked(gone)
    assert flow.waiting_for(shared) == [stays]
    assert shared.held
    assert not own.held  # nobody waits for it any more
    assert flow.waiting_for(own) == []
    assert ("release", "gone") not in log  # a closed connection is not read again
    assert len(clock.pending) == 1  # own's stall check went with it; shared's remains
    flow.forget_publisher(stays)
    assert not shared.held
    assert log == [("hold", "gone"), ("hold", "stays")]
    assert clock.pending == []


def test_forget_a_publisher_that_waits_for_nobody(flow):
    log, (pub,) = readers("pub")
    flow.forget_publisher(pub)
    assert log == []


# --------------------------------------------------------------------------- stalls


def test_a_subscriber_that_delivers_nothing_for_the_timeout_is_stuck(flow, clock):
    log, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    clock.advance(TIMEOUT - 0.01)
    assert not sub.stuck
    assert released(log) == []
    clock.advance(0.02)
    assert sub.stuck
    assert released(log) == ["pub"]
    assert not sub.held
    assert flow.metrics.flow_slow_subscribers == 1
    assert clock.pending == []


def test_progress_within_the_timeout_rearms_the_check(flow, clock):
    log, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    clock.advance(TIMEOUT / 2)
    sub.progress += 1  # it delivered something, though not enough to drain
    clock.advance(TIMEOUT / 2 + 0.01)  # the first check: progress, so not stuck
    assert not sub.stuck
    assert released(log) == []
    assert flow.blocked(pub)
    clock.advance(TIMEOUT - 0.02)  # the re-armed check is a whole timeout later
    assert not sub.stuck
    clock.advance(0.02)  # no progress since the first check
    assert sub.stuck
    assert released(log) == ["pub"]
    assert flow.metrics.flow_slow_subscribers == 1


def test_steady_progress_is_never_stuck(flow, clock):
    _, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    for _ in range(10):
        sub.progress += 1
        clock.advance(TIMEOUT)
    assert not sub.stuck
    assert flow.blocked(pub)
    assert flow.metrics.flow_slow_subscribers == 0


def test_release_cancels_the_stall_check(flow, clock):
    _, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    flow.release(sub)
    assert clock.pending == []
    clock.advance(TIMEOUT * 2)
    assert not sub.stuck
    assert flow.metrics.flow_slow_subscribers == 0


def test_a_stuck_subscriber_lets_go_only_of_publishers_waiting_for_nothing_else(flow, clock):
    log, (pub,) = readers("pub")
    stalled, healthy = FakeSubscriber("stalled"), FakeSubscriber("healthy")
    flow.hold(pub, [stalled])
    clock.advance(TIMEOUT / 2)
    flow.hold(pub, [healthy])  # its check starts later
    clock.advance(TIMEOUT / 2 + 0.01)
    assert stalled.stuck
    assert released(log) == []  # still waits for the healthy one
    healthy.progress += 1
    flow.release(healthy)
    assert released(log) == ["pub"]
    assert not healthy.stuck


def test_a_subscriber_held_again_after_a_stall_is_watched_again(flow, clock):
    _, (pub,) = readers("pub")
    sub = FakeSubscriber()
    flow.hold(pub, [sub])
    clock.advance(TIMEOUT + 0.01)
    assert sub.stuck
    sub.stuck = False  # the session clears it when it delivers again
    sub.progress += 1
    flow.hold(pub, [sub])
    clock.advance(TIMEOUT + 0.01)
    assert sub.stuck
    assert flow.metrics.flow_slow_subscribers == 2


# --------------------------------------------------------------------------- shared groups


def full_group(*members: FakeSubscriber) -> SharedGroup:
    group = SharedGroup("g", "t")
    for member in members:
        member.at_high_water = True
        group.add(member, SubOptions(1))
    return group


def test_a_publisher_held_on_a_group_goes_on_when_any_member_drains(flow):
    log, (pub,) = readers("pub")
    slow, quick = FakeSubscriber("slow"), FakeSubscriber("quick")
    group = full_group(slow, quick)
    flow.hold(pub, [group])
    assert slow.held and quick.held and group.held  # either member's drain releases it
    flow.release(quick)  # what quick's session does once down to its low-water mark
    assert released(log) == ["pub"]
    assert not (slow.held or quick.held or group.held)
    assert not flow.congested


def test_a_member_held_on_its_own_stays_held_when_its_group_is_released(flow):
    log, (pub, other) = readers("pub", "other")
    a, b = FakeSubscriber("a"), FakeSubscriber("b")
    group = full_group(a, b)
    flow.hold(other, [a])  # `other` publishes to `a` directly
    flow.hold(pub, [group])
    flow.release(b)
    assert released(log) == ["pub"]
    assert a.held and flow.blocked(other)


def test_a_group_whose_members_all_stall_makes_them_stuck(flow, clock):
    log, (pub,) = readers("pub")
    a, b = FakeSubscriber("a"), FakeSubscriber("b")
    flow.hold(pub, [full_group(a, b)])
    clock.advance(TIMEOUT / 2)
    b.progress += 1  # one member still delivers: not stalled yet
    clock.advance(TIMEOUT)
    assert released(log) == []
    clock.advance(TIMEOUT)
    assert released(log) == ["pub"]
    assert a.stuck and b.stuck
