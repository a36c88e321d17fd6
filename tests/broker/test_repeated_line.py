"""broker/logs.py's RepeatedLine on a fake clock (tests/unit/fakes.py): the first
occurrence of an episode in full, a count per interval, the end in one line, and what a
quiet interval does. The real thing (CONNECTs refused while Redis is away) is in
tests/cluster/test_refusal_logs.py."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from broker.logs import RepeatedLine
from tests.unit.fakes import FakeClock

LOGGER = "nautilus.test-repeated"
Lines = Callable[[], list[str]]


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Lines:
    """lines() -> the messages LOGGER has logged so far."""
    caplog.set_level(logging.DEBUG, LOGGER)
    return lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER]


def refusals(clock: FakeClock, *, end_when_quiet: bool = False) -> RepeatedLine:
    logger = logging.getLogger(LOGGER)
    return RepeatedLine(logger, "connects refused", clock, end_when_quiet=end_when_quiet)


def test_first_in_full_then_one_count_per_interval(lines: Lines) -> None:
    clock = FakeClock()
    line = refusals(clock)
    assert not line.active
    assert line.occurred("metadata unavailable", "%s: refused: %s", "c1", "Redis away")
    assert line.active
    for _ in range(999):
        assert not line.occurred("metadata unavailable", "%s: refused", "cx")
        clock.advance(0.005)  # 1000 in 5 s
    clock.advance(4.99)
    assert lines() == ["c1: refused: Redis away"]
    clock.advance(0.02)  # the interval ends, 10 s after the first
    assert lines()[1:] == ["999 connects refused in the last 10 s: metadata unavailable"]
    for _ in range(20):
        line.occurred("metadata unavailable", "not logged")
        clock.advance(0.1)
    clock.advance(8.0)
    assert lines()[2:] == ["20 connects refused in the last 10 s: metadata unavailable"]
    assert len(lines()) == 3


def test_a_quiet_interval_logs_nothing_and_the_episode_goes_on(lines: Lines) -> None:
    clock = FakeClock()
    line = refusals(clock)
    line.occurred("metadata unavailable", "first")
    clock.advance(60.0)  # nothing else for a minute: no line, no timer left running
    assert lines() == ["first"]
    assert clock.pending == []
    clock.advance(1.0)
    line.occurred("metadata unavailable", "not logged: the episode goes on")
    line.occurred("metadata unavailable", "not logged")
    clock.advance(9.5)
    assert lines() == ["first"]
    clock.advance(0.5)  # 10 s after the first occurrence of this interval
    assert lines()[1:] == ["2 connects refused in the last 10 s: metadata unavailable"]


def test_ended_logs_what_is_pending_then_the_end_with_the_total(lines: Lines) -> None:
    clock = FakeClock()
    line = refusals(clock)
    line.ended("nothing under way: no line")
    assert lines() == []
    line.occurred("metadata unavailable", "first")
    for _ in range(3):
        line.occurred("metadata unavailable", "counted")
    clock.advance(10.0)
    for _ in range(4):
        line.occurred("metadata unavailable", "counted")
    clock.advance(2.6)
    line.ended("registrations work again: %s", "connects accepted")
    assert lines() == [
        "first",
        "3 connects refused in the last 10 s: metadata unavailable",
        "4 connects refused in the last 3 s: metadata unavailable",
        "registrations work again: connects accepted (8 connects refused in 13 s)",
    ]
    assert not line.active
    assert clock.pending == []  # the interval's timer is gone with the episode
    line.occurred("metadata unavailable", "a new episode: in full")
    assert lines()[-1] == "a new episode: in full"


def test_ended_right_after_the_first(lines: Lines) -> None:
    clock = FakeClock()
    line = refusals(clock)
    line.occurred("metadata unavailable", "first")
    clock.advance(0.2)
    line.ended("back")
    assert lines() == ["first", "back (1 connects refused in 1 s)"]


def test_several_reasons_are_counted_apart_most_first(lines: Lines) -> None:
    clock = FakeClock()
    line = RepeatedLine(logging.getLogger(LOGGER), "requests refused", clock, interval=5.0)
    line.occurred("bad JSON", "first")
    for reason in ["unknown command"] * 3 + ["bad JSON"] * 2:
        line.occurred(reason, "counted")
    clock.advance(5.0)
    assert lines()[1:] == ["5 requests refused in the last 5 s: unknown command (3), bad JSON (2)"]


def test_end_when_quiet(lines: Lines) -> None:
    """For conditions with no recovery to report: a quiet interval ends the episode, and
    the next occurrence is logged in full again."""
    clock = FakeClock()
    line = refusals(clock, end_when_quiet=True)
    line.occurred("malformed", "first of the first episode")
    line.occurred("malformed", "counted")
    clock.advance(10.0)
    assert line.active
    clock.advance(10.0)  # a quiet interval
    assert not line.active
    line.occurred("malformed", "first of the second episode")
    assert lines() == [
        "first of the first episode",
        "1 connects refused in the last 10 s: malformed",
        "first of the second episode",
    ]


def test_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    clock = FakeClock()
    line = RepeatedLine(logging.getLogger(LOGGER), "things", clock, level=logging.INFO)
    line.occurred("why", "first")
    line.occurred("why", "counted")
    clock.advance(10.0)
    line.ended("over")
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.INFO] * 3
    default = refusals(clock)
    default.occurred("why", "first")
    assert caplog.records[-1].levelno == logging.WARNING
