"""broker/episodes.py on a fake clock (tests/unit/fakes.py): an Episode's first occurrence
in full, a count per interval, the end in one line with the total, what a quiet interval
does; the once-a-second lines of HTTP; a ConnectionCap's episodes and its 90% hysteresis.

The real things: CONNECTs refused while Redis is away (tests/cluster/test_refusal_logs.py),
HTTP's limits (tests/http/test_limits.py), an MQTT listener's max_connections and the
process out of file descriptors (tests/broker/test_descriptors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from broker.connection_cap import ConnectionCap
from broker.episodes import Episode
from tests.unit.fakes import FakeClock

LOGGER = "nautilus.test-episodes"
Lines = Callable[[], list[tuple[int, str]]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Lines:
    """lines() -> (level, message) of what LOGGER has logged so far."""
    caplog.set_level(logging.DEBUG, LOGGER)
    return lambda: [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def messages(lines: Lines) -> list[str]:
    return [message for _, message in lines()]


def refusals(clock: FakeClock) -> Episode:
    """As broker/client/connect.py's: a count line per 10 s."""
    return Episode(logging.getLogger(LOGGER), "connects refused", clock, interval=10.0)


def once_a_second(clock: FakeClock) -> Episode:
    """As broker/http/connections.py's."""
    return Episode(
        logging.getLogger(LOGGER),
        "bad requests",
        clock,
        interval=1.0,
        counted="http: bad request: %d more in the last %ds, the last %s",
        level=logging.INFO,
        end_when_quiet=True,
    )


def bad_request(line: Episode, peer: str) -> None:
    detail = f"from {peer}: 400 Invalid method"
    line.occurred("http: bad request %s", detail, reason=detail)


# --------------------------------------------------------------------------- Episode


def test_first_in_full_then_one_count_per_interval(clock: FakeClock, lines: Lines) -> None:
    line = refusals(clock)
    assert not line.active
    line.occurred("%s: refused: %s", "c1", "Redis away", reason="metadata unavailable")
    assert line.active
    for _ in range(999):
        line.occurred("%s: refused", "cx", reason="metadata unavailable")
        clock.advance(0.005)  # 1000 in 5 s
    clock.advance(4.99)
    assert messages(lines) == ["c1: refused: Redis away"]
    clock.advance(0.02)  # the interval ends, 10 s after the first
    assert messages(lines)[1:] == ["999 connects refused in the last 10 s: metadata unavailable"]
    for _ in range(20):
        line.occurred("not logged", reason="metadata unavailable")
        clock.advance(0.1)
    clock.advance(8.0)
    assert messages(lines)[2:] == ["20 connects refused in the last 10 s: metadata unavailable"]
    assert [level for level, _ in lines()] == [logging.WARNING] * 3


def test_a_quiet_interval_logs_nothing_and_the_episode_goes_on(
    clock: FakeClock, lines: Lines
) -> None:
    line = refusals(clock)
    line.occurred("first", reason="metadata unavailable")
    clock.advance(60.0)  # nothing else for a minute: no line, no timer left running
    assert messages(lines) == ["first"]
    assert clock.pending == []
    assert line.active
    clock.advance(1.0)
    line.occurred("not logged: the episode goes on", reason="metadata unavailable")
    line.occurred("not logged", reason="metadata unavailable")
    clock.advance(9.5)
    assert messages(lines) == ["first"]
    clock.advance(0.5)  # 10 s after the first occurrence of this interval
    assert messages(lines)[1:] == ["2 connects refused in the last 10 s: metadata unavailable"]


def test_ended_logs_what_is_pending_then_the_end_with_the_total(
    clock: FakeClock, lines: Lines
) -> None:
    line = refusals(clock)
    line.ended("nothing under way: no line")
    assert lines() == []
    line.occurred("first", reason="metadata unavailable")
    for _ in range(3):
        line.occurred("counted", reason="metadata unavailable")
    clock.advance(10.0)
    for _ in range(4):
        line.occurred("counted", reason="metadata unavailable")
    clock.advance(2.6)
    line.ended("registrations work again: %s", "connects accepted")
    assert messages(lines) == [
        "first",
        "3 connects refused in the last 10 s: metadata unavailable",
        "4 connects refused in the last 3 s: metadata unavailable",
        "registrations work again: connects accepted (8 connects refused in 13 s)",
    ]
    assert not line.active
    assert clock.pending == []  # the interval's timer is gone with the episode
    line.occurred("a new episode: in full", reason="metadata unavailable")
    assert messages(lines)[-1] == "a new episode: in full"


def test_ended_right_after_the_first(clock: FakeClock, lines: Lines) -> None:
    line = refusals(clock)
    line.occurred("first", reason="metadata unavailable")
    clock.advance(0.2)
    line.ended("back")
    assert messages(lines) == ["first", "back (1 connects refused in 1 s)"]


def test_a_count_line_names_the_last_ones_reason(clock: FakeClock, lines: Lines) -> None:
    line = refusals(clock)
    line.occurred("first", reason="metadata unavailable")
    line.occurred("counted", reason="metadata unavailable")
    line.occurred("counted", reason="stale request")
    clock.advance(10.0)
    assert messages(lines)[1:] == ["2 connects refused in the last 10 s: stale request"]


def test_without_an_interval_only_the_end_says_how_many(clock: FakeClock, lines: Lines) -> None:
    line = Episode(logging.getLogger(LOGGER), "things", clock, end_level=logging.INFO)
    line.occurred("first")
    for _ in range(500):
        line.occurred("counted")
    assert clock.pending == []  # no interval: no timer
    clock.advance(3600.0)
    line.ended("over")
    assert lines() == [(logging.WARNING, "first"), (logging.INFO, "over (501 things in 3600 s)")]


# --------------------------------------------------------------------------- once a second


def test_once_a_second_the_others_counted_with_the_last_one(clock: FakeClock, lines: Lines) -> None:
    line = once_a_second(clock)
    for i in range(200):  # 200 in the first second
        bad_request(line, f"10.0.0.{i}:5000")
        clock.advance(0.004)
    clock.advance(0.5)  # it is over
    for i in range(200, 300):  # 100 in the next
        bad_request(line, f"10.0.0.{i}:5000")
    clock.advance(1.0)
    assert messages(lines) == [
        "http: bad request from 10.0.0.0:5000: 400 Invalid method",
        "http: bad request: 199 more in the last 1s, the last from 10.0.0.199:5000: 400 "
        "Invalid method",
        "http: bad request: 100 more in the last 1s, the last from 10.0.0.299:5000: 400 "
        "Invalid method",
    ]
    assert [level for level, _ in lines()] == [logging.INFO] * 3


def test_a_quiet_second_ends_the_episode(clock: FakeClock, lines: Lines) -> None:
    line = once_a_second(clock)
    bad_request(line, "10.0.0.1:5000")
    bad_request(line, "10.0.0.2:5000")
    clock.advance(1.0)
    assert line.active  # a second that counted one: the next is watched
    clock.advance(1.0)  # a quiet one
    assert not line.active
    assert clock.pending == []
    bad_request(line, "10.0.0.3:5000")  # in full again
    assert messages(lines) == [
        "http: bad request from 10.0.0.1:5000: 400 Invalid method",
        "http: bad request: 1 more in the last 1s, the last from 10.0.0.2:5000: 400 Invalid method",
        "http: bad request from 10.0.0.3:5000: 400 Invalid method",
    ]


def test_close_says_what_is_counted_and_stops(clock: FakeClock, lines: Lines) -> None:
    line = once_a_second(clock)
    line.close()
    assert lines() == []  # nothing under way: nothing to say
    bad_request(line, "10.0.0.1:5000")
    bad_request(line, "10.0.0.2:5000")
    clock.advance(0.3)
    line.close()
    assert not line.active
    assert clock.pending == []
    assert messages(lines)[1:] == [
        "http: bad request: 1 more in the last 1s, the last from 10.0.0.2:5000: 400 Invalid method"
    ]


def test_the_first_line_has_its_traceback_the_counted_ones_none(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    line = Episode(logging.getLogger(LOGGER), "errors", clock, interval=1.0, level=logging.ERROR)
    error = RuntimeError("a bug of ours")
    line.occurred("http: error %s", "1.2.3.4:5: boom", reason="boom", exc_info=error)
    line.occurred("http: error %s", "1.2.3.4:6: boom", reason="boom", exc_info=error)
    clock.advance(1.0)
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [(r.levelno, r.exc_info is not None) for r in records] == [
        (logging.ERROR, True),
        (logging.ERROR, False),
    ]
    assert records[0].exc_info is not None and records[0].exc_info[1] is error


# --------------------------------------------------------------------------- ConnectionCap


def test_a_cap_admits_up_to_its_limit_and_says_the_first_refusal(
    clock: FakeClock, lines: Lines
) -> None:
    cap = ConnectionCap(logging.getLogger(LOGGER), "http", 10, clock)
    assert cap.admits(0) and cap.admits(9)
    assert lines() == []
    assert not cap.admits(10)
    for _ in range(20):
        assert not cap.admits(10)
    assert lines() == [
        (logging.WARNING, "http: 10 connections open, max_connections 10: refusing new ones")
    ]
    assert clock.pending == []  # no count lines: the end line has the total


def test_a_cap_accepts_again_at_90_percent_not_at_the_first_free_slot(
    clock: FakeClock, lines: Lines
) -> None:
    cap = ConnectionCap(logging.getLogger(LOGGER), "listeners[0] (tcp on 0.0.0.0:1883)", 20, clock)
    assert not cap.admits(20)
    cap.closed(19)  # a free slot: admitted, but the episode goes on
    assert cap.admits(19)
    assert not cap.admits(20)  # counted, not logged
    clock.advance(30.0)
    cap.closed(19)
    assert cap.full.active
    cap.closed(18)  # 90%
    assert not cap.full.active
    cap.closed(17)  # no episode: nothing more
    assert lines() == [
        (
            logging.WARNING,
            "listeners[0] (tcp on 0.0.0.0:1883): 20 connections open, max_connections 20: "
            "refusing new ones",
        ),
        (
            logging.INFO,
            "listeners[0] (tcp on 0.0.0.0:1883): accepting again, 18 open "
            "(2 connections refused in 30 s)",
        ),
    ]
    assert not cap.admits(20)  # a new episode: in full again
    assert len(lines()) == 3


def test_a_cap_of_0_admits_all(clock: FakeClock, lines: Lines) -> None:
    cap = ConnectionCap(logging.getLogger(LOGGER), "http", 0, clock)
    assert cap.admits(1_000_000)
    cap.closed(0)
    assert lines() == []
