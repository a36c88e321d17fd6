"""Where the broker's log goes (`[log]`): the console, a file rotated by size, syslog;
as text lines or JSON lines (one object per record, for log shippers).

Connection-level problems (refused logins, protocol errors, clients dropped for keepalive)
are logged at INFO, one line each, so that a production broker can run at `info`; the
per-packet detail is DEBUG. A line that can come thousands of times a second (every
CONNECT refused while Redis is away) goes through RepeatedLine: the first in full, then a
count per interval.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
from typing import Any

from broker.clock import Clock, Timer
from broker.config import ConfigError, LogSettings, host_port

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """{"time": ISO 8601 UTC, "level", "logger", "message"[, "exception"]} per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(settings: LogSettings) -> None:
    """Replace the root logger's handlers with those `settings` name (ConfigError, naming
    the key, for a file or syslog address that cannot be used)."""
    handlers: list[logging.Handler] = []
    if settings.console:
        handlers.append(logging.StreamHandler())
    if settings.file:
        try:
            handlers.append(
                logging.handlers.RotatingFileHandler(
                    settings.file,
                    maxBytes=settings.file_max_bytes,
                    backupCount=settings.file_backups,
                    encoding="utf-8",
                )
            )
        except OSError as exc:
            raise ConfigError(f"log.file: cannot write {settings.file}: {exc.strerror}") from None
    if settings.syslog:
        handlers.append(_syslog(settings.syslog))
    formatter = JsonLines() if settings.format == "json" else logging.Formatter(TEXT)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(settings.level.upper())


def _syslog(address: str) -> logging.Handler:
    if address.startswith("/"):
        # The handler itself would wait silently for a socket that is not there.
        if not os.path.exists(address):
            raise ConfigError(f"log.syslog: cannot use {address}: no such socket")
        try:
            return logging.handlers.SysLogHandler(address=address)
        except OSError as exc:
            raise ConfigError(f"log.syslog: cannot use {address}: {exc.strerror}") from None
    try:
        return logging.handlers.SysLogHandler(address=host_port(address))  # UDP
    except ValueError:
        raise ConfigError(
            f"log.syslog: expected a socket path such as /dev/log or host:port, got {address!r}"
        ) from None


class RepeatedLine:
    """A line that may repeat thousands of times a second (a CONNECT refused while Redis
    is away, a malformed request): the first occurrence of an episode is logged in full,
    the others are counted, one line per `interval` for the interval just ended
    ("1234 connects refused in the last 10 s: metadata unavailable"), and `ended()` logs
    the end of the episode in one line (after the count of the last, partial interval).

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
        interval: float = 10.0,
        level: int = logging.WARNING,
        end_when_quiet: bool = False,
    ) -> None:
        self.logger = logger
        self.noun = noun  # what is counted, plural: "connects refused"
        self.clock = clock
        self.interval = interval
        self.level = level
        self.end_when_quiet = end_when_quiet
        self._started: float | None = None  # the episode's first occurrence
        self._window = 0.0  # when the interval being counted began
        self._counts: dict[str, int] = {}  # reason -> occurrences this interval
        self._total = 0  # occurrences this episode, the first included
        self._timer: Timer | None = None

    @property
    def active(self) -> bool:
        """Whether an episode is under way (cheap: callers test it on every success)."""
        return self._started is not None

    def occurred(self, reason: str, message: str, *args: Any) -> bool:
        """One occurrence; `reason` is what the count lines group by. The first of an
        episode logs `message % args` and returns True; the others are only counted."""
        now = self.clock.time()
        if self._started is None:
            self._started = self._window = now
            self._total = 1
            self.logger.log(self.level, message, *args)
            self._arm()
            return True
        self._total += 1
        self._counts[reason] = self._counts.get(reason, 0) + 1
        if self._timer is None:  # the first since a quiet interval: a new one begins
            self._window = now
            self._arm()
        return False

    def ended(self, message: str, *args: Any) -> None:
        """The condition is over: what the current interval counted, then `message % args`
        with the episode's total. Nothing when no episode is under way."""
        if self._started is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock.time()
        self._log_counts(now)
        total, seconds = self._total, _seconds(now - self._started)
        self._started = None
        self._total = 0
        text = message % args if args else message
        self.logger.log(self.level, "%s (%d %s in %d s)", text, total, self.noun, seconds)

    def _arm(self) -> None:
        self._timer = self.clock.call_later(self.interval, self._close_interval)

    def _close_interval(self) -> None:
        self._timer = None
        now = self.clock.time()
        if self._counts:
            self._log_counts(now)
            self._window = now
            self._arm()
        elif self.end_when_quiet:
            self._started = None
            self._total = 0

    def _log_counts(self, now: float) -> None:
        counts, self._counts = self._counts, {}
        if not counts:
            return
        if len(counts) == 1:
            (reasons,) = counts
        else:
            ranked = sorted(counts.items(), key=lambda item: -item[1])
            reasons = ", ".join(f"{reason} ({count})" for reason, count in ranked)
        self.logger.log(
            self.level,
            "%d %s in the last %d s: %s",
            sum(counts.values()),
            self.noun,
            _seconds(now - self._window),
            reasons,
        )


def _seconds(elapsed: float) -> int:
    """Whole seconds for a log line (a timer fires a little late; never "0 s")."""
    return max(1, round(elapsed))
