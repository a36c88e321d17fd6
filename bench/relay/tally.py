# A count that one process keeps and another reads afterwards: events a consumer or a sink
# received, over time.
#
# Strategy: the counting process appends `<monotonic seconds> <count> <lost>` to a file
# every TICK seconds and once more at exit; CLOCK_MONOTONIC is one clock for every process
# of the machine, so the reader can take the count at instants of its own (interpolated
# between the lines around them) or the rate while events were flowing. Writing a line is
# a few microseconds per tick, and reading happens after the measurement.
from __future__ import annotations

import asyncio
import bisect
import time
from pathlib import Path
from typing import TextIO

TICK = 0.1  # seconds between two lines
_EDGE = 5  # ticks left out at each end of a flow: connects before the load, the tail after


class Tally:
    """Events counted here (`count`), and those known lost (`lost`: a consumer that fell
    out of the relay's retained range), written to `path` every TICK."""

    def __init__(self, path: Path) -> None:
        self.count = 0
        self.lost = 0
        self._file: TextIO = path.open("a")

    def write(self) -> None:
        self._file.write(f"{time.monotonic():.6f} {self.count} {self.lost}\n")
        self._file.flush()

    async def run(self) -> None:
        """Write a line every TICK until cancelled, and a last one then."""
        try:
            while True:
                self.write()
                await asyncio.sleep(TICK)
        finally:
            self.write()
            self._file.close()


Sample = tuple[float, int, int]  # (monotonic seconds, count, lost)


def read(path: Path) -> list[Sample]:
    """The lines written so far (a line still being written is left out)."""
    samples = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3:
            samples.append((float(fields[0]), int(fields[1]), int(fields[2])))
    return samples


def count_at(samples: list[Sample], instant: float) -> float:
    """The count at `instant`, interpolated between the lines around it."""
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, instant)
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (t0, c0, _), (t1, c1, _) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (instant - t0) / (t1 - t0) if t1 > t0 else c1


def rate_between(samples: list[Sample], start: float, end: float) -> float | None:
    """Events per second between two instants of the reader's own clock."""
    if not samples or end <= start:
        return None
    return (count_at(samples, end) - count_at(samples, start)) / (end - start)


def flowing_rate(samples: list[Sample]) -> float | None:
    """Events per second while they flowed: from the tick before the first that counted
    some to the last that did, less _EDGE ticks at each end when the span is long enough.
    Taken over the whole span, not per tick: a consumer of a busy broker gets its events
    in bursts, one per turn of the broker's event loop."""
    moving = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    if not moving:
        return None
    first, last = moving[0] - 1, moving[-1]
    if last - first > 4 * _EDGE:
        first, last = first + _EDGE, last - _EDGE
    (t0, c0, _), (t1, c1, _) = samples[first], samples[last]
    return (c1 - c0) / (t1 - t0) if t1 > t0 else None
