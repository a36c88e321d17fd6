"""The broker's one keepalive timer (broker/keepalive.py) on a fake clock: each connection
is told within the second after its deadline, never before, whatever order they come in."""

from __future__ import annotations

from broker.keepalive import KeepaliveWatch

from .fakes import FakeClock


class Client:
    """A watched connection that records when it was told, and is watched again until
    `until` (as a connection whose client keeps sending)."""

    def __init__(self, watch: KeepaliveWatch, clock: FakeClock, until: float = 0.0) -> None:
        self.watch, self.clock, self.until = watch, clock, until
        self.told: list[float] = []

    def keepalive_due(self) -> None:
        self.told.append(self.clock.time())
        if self.clock.time() < self.until:
            self.watch.watch(self, self.until)


def test_each_is_told_in_the_second_after_its_deadline_in_any_order():
    clock = FakeClock(1000.0)
    watch = KeepaliveWatch(clock)
    late, early = Client(watch, clock), Client(watch, clock)
    watch.watch(late, 1020.5)
    watch.watch(early, 1004.2)  # sooner than the timer set: the timer moves
    clock.advance(4.1)
    assert early.told == []
    clock.advance(1.0)
    assert early.told == [1005.0] and late.told == []
    clock.advance(16.0)
    assert late.told == [1021.0]
    assert clock.pending == []  # nothing watched: no timer left


def test_one_watched_again_does_not_hide_an_earlier_bucket():
    clock = FakeClock(1000.0)
    watch = KeepaliveWatch(clock)
    busy = Client(watch, clock, until=1030.0)  # sends meanwhile: watched again at 1005
    quiet = Client(watch, clock)
    watch.watch(busy, 1005.0)
    watch.watch(quiet, 1010.0)
    clock.advance(10.0)
    assert busy.told == [1005.0] and quiet.told == [1010.0]
    clock.advance(20.0)
    assert busy.told == [1005.0, 1030.0]


def test_a_forgotten_connection_is_not_told():
    clock = FakeClock(1000.0)
    watch = KeepaliveWatch(clock)
    gone, kept = Client(watch, clock), Client(watch, clock)
    bucket = watch.watch(gone, 1003.0)
    watch.watch(kept, 1003.0)
    watch.forget(gone, bucket)
    clock.advance(5.0)
    assert gone.told == [] and kept.told == [1003.0]
