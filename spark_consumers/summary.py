"""The one line an available-now run of `nautilus-spark` ends with (on stderr): what it
read, what it wrote where, and the windows it leaves open, so that an empty output is
never silent.

Built from the query's progress reports (`StreamingQuery.recentProgress`: dicts, as
Spark gives them) and what the caller counted of the rows written (the Parquet files the
run added, the MQTT sink's publishes). Pure functions: tests give them progress dicts.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

_UNITS = {
    "millisecond": 0.001,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")


def seconds(duration: str) -> float | None:
    """A Spark interval string ('10 seconds', '1 minute 30 seconds') in seconds; None
    when it is not one of those (Spark itself will say what is wrong with it)."""
    text = duration.strip().lower()
    total, end = 0.0, 0
    for match in _PART.finditer(text):
        if text[end : match.start()].strip() or match.group(2) not in _UNITS:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        end = match.end()
    return total if end and not text[end:].strip() else None


def _time(text: str) -> datetime.datetime | None:
    """Spark's progress timestamps ('2026-11-27T03:50:10.000Z')."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None


def _iso(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def open_windows(
    progress: Sequence[dict[str, Any]], window: str | None, watermark: str | None
) -> str:
    """What the last report says of the windows still held: how many rows (window x key)
    wait in the aggregation's state, and from when on, in the broker's time, the last of
    them closes (its end plus the watermark; a run that reads an event or heartbeat of
    that time or later writes it)."""
    last = progress[-1] if progress else {}
    held = sum(op.get("numRowsTotal", 0) for op in last.get("stateOperators", []))
    if not held:
        return "no window left open"
    # The latest event time read: a batch without data (the last, often) reports none.
    times = [_time(p["eventTime"]["max"]) for p in progress if "max" in p.get("eventTime", {})]
    latest = max((t for t in times if t is not None), default=None)
    size = seconds(window) if window else None
    delay = seconds(watermark) if watermark else None
    rows = f"{held} row{'s' if held != 1 else ''} of open windows"
    if latest is None or not size or delay is None:
        return f"{rows} (they close once the watermark passes their end)"
    epoch = latest.timestamp()
    end = (epoch // size + 1) * size  # tumbling windows are aligned to the epoch
    closes = datetime.datetime.fromtimestamp(end + delay, datetime.UTC)
    return f"{rows}: the last closes once the broker's clock passes {_iso(closes)}"


def summary(
    progress: Sequence[dict[str, Any]],
    written: dict[str, int | None],
    window: str | None,
    watermark: str | None,
) -> str:
    """The line: events read in how many batches, rows written per sink (None: the sink
    does not say), the open windows."""
    read = sum(p.get("numInputRows", 0) for p in progress)
    batches = len(progress)
    sinks = ", ".join(
        f"{'?' if rows is None else rows} rows to {sink}" for sink, rows in written.items()
    )
    return (
        f"nautilus-spark: read {read} events in {batches} batch{'es' if batches != 1 else ''}; "
        f"wrote {sinks}; {open_windows(progress, window, watermark)}"
    )
