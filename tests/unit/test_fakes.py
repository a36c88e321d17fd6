"""The fakes keep their promises: a unit test is only as good as its fake clock."""

from __future__ import annotations

from .fakes import FakeClock, FakeLoop


def test_advance_runs_due_timers_in_time_order_at_their_own_time():
    clock = FakeClock(start=0.0)
    ran: list[tuple[str, float]] = []
    clock.call_later(3, lambda: ran.append(("c", clock.time())))
    clock.call_later(1, lambda: ran.append(("a", clock.time())))
    clock.call_later(2, lambda: ran.append(("b1", clock.time())))
    clock.call_later(2, lambda: ran.append(("b2", clock.time())))  # ties: in the order set
    clock.advance(2.5)
    assert ran == [("a", 1.0), ("b1", 2.0), ("b2", 2.0)]
    assert clock.time() == 2.5
    clock.advance(0.5)
    assert ran[-1] == ("c", 3.0)


def test_timers_set_by_callbacks_run_within_the_same_advance():
    clock = FakeClock(start=0.0)
    ran: list[float] = []

    def tick() -> None:
        ran.append(clock.time())
        if len(ran) < 10:
            clock.call_later(1, tick)

    clock.call_later(1, tick)
    clock.advance(3.5)
    assert ran == [1.0, 2.0, 3.0]
    clock.advance(100)
    assert ran == [float(t) for t in range(1, 11)]


def test_cancelled_timers_do_not_run():
    clock = FakeClock()
    ran: list[int] = []
    timer = clock.call_later(1, ran.append, 1)
    clock.call_later(2, ran.append, 2)
    timer.cancel()
    assert len(clock.pending) == 1
    clock.advance(5)
    assert ran == [2]
    assert clock.pending == []


def test_call_soon_runs_on_the_next_advance_without_moving_time():
    loop = FakeLoop(start=5.0)
    ran: list[float] = []
    loop.call_soon(lambda: ran.append(loop.time()))
    assert ran == []
    loop.advance()
    assert ran == [5.0]
    assert loop.time() == 5.0
