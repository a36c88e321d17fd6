"""Telling in the log of a condition that repeats, thousands of times a second perhaps,
without flooding it: once per episode.

- `Episode`: the first occurrence of an episode in full, the others counted (in one line
  per interval, if it has one), and its end in one line with the episode's total. Every
  such line of the broker goes through it: CONNECTs refused while the cluster's metadata
  is away (broker/client/connect.py), HTTP's malformed and dropped requests
  (broker/http/connections.py), a listener at its cap, the process out of file
  descriptors (broker/descriptors.py).
(broker/connection_cap.py keeps a listener's `max_connections` with one.)
"""

from __future__ import annotations

import logging

from broker.clock import Clock, Timer


class Episode:
    """A condition that may repeat thousands of times a second (a CONNECT refused while
    Redis is away, a malformed request): `occurred()` logs the first occurrence of an
    episode in full and counts the others; with an `interval`, one line per interval says
    how many the interval just ended counted and the last one's reason ("1234 connects
    refused in the last 10 s: metadata unavailable"); `ended()` logs the end of the
    episode in one line, with its total ("... (1235 connects refused in 14 s)"), after
    the count of the last, partial interval.

    `clock` is the broker's (broker.clock.Clock: the event loop, or a fake in tests): its
    time() dates the intervals and its call_later() closes each one on time, so a count
    is logged even if nothing follows it. Nothing else is needed: no running loop, no task.

    An episode lasts until `ended()`; an interval without an occurrence logs nothing.
    With `end_when_quiet`, an interval without an occurrence ends the episode silently
    too (for conditions that have no "it works again" moment, such as malformed
    requests): the next occurrence is then logged in full again.
    """

    def __init__(
        self,
        logger: logging.Logger,
        noun: str,
        clock: Clock,
        *,
        interval: float | None = None,
        counted: str | None = None,
        level: int = logging.WARNING,
        end_level: int | None = None,
        end_when_quiet: bool = False,
    ) -> None:
        self.logger = logger
        self.noun = noun  # what is counted, plural: "connects refused"
        self.clock = clock
        self.interval = interval  # None: no count lines, only the total at the end
        # An interval's count line, of (count, seconds, the last one's reason).
        self.counted = counted or f"%d {noun} in the last %d s: %s"
        self.level = level  # of the first line and the count lines
        self.end_level = level if end_level is None else end_level
        self.end_when_quiet = end_when_quiet
        self._started: float | None = None  # the episode's first occurrence
        self._total = 0  # occurrences this episode, the first included
        self._window = 0.0  # when the interval being counted began
        self._count = 0  # occurrences this interval
        self._reason = ""  # the last one's
        self._timer: Timer | None = None

    @property
    def active(self) -> bool:
        """Whether an episode is under way."""
        return self._started is not None

    def occurred(
        self,
        message: str,
        *args: object,
        reason: str = "",
        exc_info: BaseException | None = None,
    ) -> None:
        """One occurrence: the first of an episode logs `message % args` (with
        `exc_info`'s traceback); the others are counted, and the interval's count line
        names the last one's `reason`."""
        if self._started is None:
            self._started = self.clock.time()
            self._total = 1
            self.logger.log(self.level, message, *args, exc_info=exc_info)
            self._arm()
            return
        self._total += 1
        if self.interval is not None:
            self._count += 1
            self._reason = reason
            if self._timer is None:  # the first since a quiet interval: a new one begins
                self._arm()

    def ended(self, message: str, *args: object) -> None:
        """The condition is over: what the current interval counted, then `message % args`
        with the episode's total. Nothing when no episode is under way."""
        if self._started is None:
            return
        total, seconds = self._total, _seconds(self.clock.time() - self._started)
        self.close()
        text = message % args if args else message
        self.logger.log(self.end_level, "%s (%d %s in %d s)", text, total, self.noun, seconds)

    def close(self) -> None:
        """What the current interval counted, if anything; the episode ends without a
        line of its own (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._log_count()
        self._started = None

    def _arm(self) -> None:
        if self.interval is not None:
            self._window = self.clock.time()
            self._timer = self.clock.call_later(self.interval, self._interval_over)

    def _interval_over(self) -> None:
        self._timer = None
        if self._count:
            self._log_count()
            self._arm()
        elif self.end_when_quiet:
            self._started = None

    def _log_count(self) -> None:
        if self._count:
            seconds = _seconds(self.clock.time() - self._window)
            self.logger.log(self.level, self.counted, self._count, seconds, self._reason)
            self._count = 0


def _seconds(elapsed: float) -> int:
    """Whole seconds for a log line (a timer fires a little late; never "0 s")."""
    return max(1, round(elapsed))
