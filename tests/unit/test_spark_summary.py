"""The summary line of an available-now `nautilus-spark` run, from progress reports as
Spark gives them (spark_consumers/summary.py: pure functions)."""

from __future__ import annotations

import pytest

from spark_consumers.summary import open_windows, seconds, summary


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10 seconds", 10.0),
        ("1 second", 1.0),
        ("0 seconds", 0.0),
        ("2 minutes", 120.0),
        ("1 minute 30 seconds", 90.0),
        ("1 hour", 3600.0),
        ("1 day", 86400.0),
        ("500 milliseconds", 0.5),
        (" 5 Seconds ", 5.0),
        ("soon", None),
        ("10", None),
        ("10 fortnights", None),
        ("", None),
    ],
)
def test_durations_in_sparks_words(text, expected):
    assert seconds(text) == expected


def report(rows: int, latest: str | None = None, read: int = 0, out: int = -1) -> dict:
    progress: dict = {"numInputRows": read, "sink": {"numOutputRows": out}}
    progress["stateOperators"] = [{"numRowsTotal": rows}]
    if latest is not None:
        progress["eventTime"] = {"max": latest, "watermark": latest}
    return progress


def test_open_windows_say_when_the_last_closes():
    # Events up to 10:00:03: the 5 s window [10:00:00, 10:00:05) is open; with a 30 s
    # watermark it closes once the clock passes 10:00:35.
    # The last report, of a batch without data, has no event time: an earlier one has.
    progress = [report(0), report(3, "2026-11-27T10:00:03.250Z"), report(3)]
    assert open_windows(progress, "5 seconds", "30 seconds") == (
        "3 rows of open windows: the last closes once the broker's clock passes "
        "2026-11-27T10:00:35Z"
    )
    assert open_windows(progress, None, "30 seconds") == (
        "3 rows of open windows (they close once the watermark passes their end)"
    )
    assert open_windows([report(0)], "5 seconds", "0 seconds") == "no window left open"
    assert open_windows([], "5 seconds", "0 seconds") == "no window left open"


def test_the_line_sums_the_batches_and_names_each_sink():
    progress = [report(0, read=40), report(1, "2026-11-27T10:00:03Z", read=2)]
    line = summary(progress, {"parquet:out": 12}, "1 day", "0 seconds")
    assert line == (
        "nautilus-spark: read 42 events in 2 batches; wrote 12 rows to parquet:out; "
        "1 row of open windows: the last closes once the broker's clock passes "
        "2026-11-28T00:00:00Z"
    )
    assert "wrote ? rows to console" in summary([report(0)], {"console": None}, None, None)
    assert "in 1 batch;" in summary([report(0)], {"console": 0}, None, None)
