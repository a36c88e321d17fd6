"""HTTP's share of the process, and telling in the log when a limit is reached without
flooding it.

- `RateLimitedLog`: lines of one kind at most once per second; the ones held back are
  counted, and said in one line when the second is over.
- `Cap`: `[http] max_connections`: one line when it starts refusing connections, one
  when it accepts again (broker/server.py's `admit` does the same for MQTT listeners).
- `check_http_reserve` / `describe_reserve`: HTTP held to at most half of the process's
  file descriptors (RLIMIT_NOFILE), so that its clients, anyone who reaches the port,
  cannot starve the MQTT listeners; and what that leaves MQTT, said at start-up.

`RateLimitedLog` and `Cap` are generic: they belong with broker/logs.py's helpers once it
has its own. (Running out of descriptors altogether is the Broker's: broker/server.py.)
"""

from __future__ import annotations

import asyncio
import logging
import resource

from broker.config import Config, ConfigError

HTTP_SHARE = 2  # HTTP may hold at most 1/HTTP_SHARE of the descriptors: the rest is MQTT's


def one_line(text: object, limit: int = 200) -> str:
    """`text` as one printable line of at most `limit` characters (a client's bytes may be
    in it)."""
    flat = " ".join(str(text).split())
    flat = "".join(c if c.isprintable() else "?" for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RateLimitedLog:
    """Lines of one kind, e.g. "http: bad request", at most one per `interval` seconds.

    The first line is logged at once; those that follow within the interval are held back
    and counted, and when it ends one line says how many there were and what the last one
    was, which starts the next interval. So a flood logs about a line a second however
    fast it comes, and nothing is dropped without being counted."""

    def __init__(
        self,
        logger: logging.Logger,
        loop: asyncio.AbstractEventLoop,
        what: str,
        interval: float = 1.0,
    ) -> None:
        self.logger = logger
        self.loop = loop
        self.what = what
        self.interval = interval
        self.held = 0  # lines held back in this interval
        self._last: tuple[int, str] = (logging.INFO, "")
        self._window: asyncio.TimerHandle | None = None

    def log(self, level: int, detail: str, exc_info: BaseException | None = None) -> None:
        """`<what> <detail>` now, or counted for the line that ends this interval."""
        if self._window is None:
            self.logger.log(level, "%s %s", self.what, detail, exc_info=exc_info)
            self._window = self.loop.call_later(self.interval, self._end)
        else:
            self.held += 1
            self._last = (level, detail)

    def _end(self, again: bool = True) -> None:
        self._window = None
        if not self.held:
            return
        level, detail = self._last
        self.logger.log(
            level,
            "%s: %d more in the last %gs, the last %s",
            self.what,
            self.held,
            self.interval,
            detail,
        )
        self.held = 0
        if again:
            self._window = self.loop.call_later(self.interval, self._end)

    @property
    def quiet(self) -> bool:
        """Nothing logged in the last interval, nothing held back."""
        return self._window is None

    def close(self) -> None:
        """Say what is held back, and stop."""
        if self._window is not None:
            self._window.cancel()
            self._end(again=False)


class Cap:
    """A listener's `max_connections`, and the episodes of it being reached.

    The first refusal of an episode is logged with the numbers; the episode ends, in one
    more line, when the connections open are down to 90% of the cap, not at the first
    free slot: a count that sways at the cap does not log every refusal."""

    def __init__(self, logger: logging.Logger, name: str, limit: int) -> None:
        self.logger = logger
        self.name = name
        self.limit = limit  # 0: none
        self.full = False
        self.refused = 0  # in this episode

    def admits(self, open_now: int) -> bool:
        """Whether a new connection fits beside the `open_now` others."""
        if not self.limit or open_now < self.limit:
            return True
        if not self.full:
            self.full = True
            self.logger.warning(
                "%s: %d connections open, max_connections %d: refusing new ones",
                self.name,
                open_now,
                self.limit,
            )
        self.refused += 1
        return False

    def update(self, open_now: int) -> None:
        """After a connection was admitted beside, or closed leaving, `open_now` others."""
        if self.full and open_now <= self.limit * 9 // 10:
            self.full = False
            self.logger.info(
                "%s: accepting again (%d open, %d refused while full)",
                self.name,
                open_now,
                self.refused,
            )
            self.refused = 0


def nofile_limit() -> int | None:
    """The process's soft limit on open file descriptors; None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def check_http_reserve(config: Config) -> None:
    """ConfigError unless `[http] max_connections` is at most half of RLIMIT_NOFILE."""
    limit = nofile_limit()
    cap = config.http.max_connections
    if limit is not None and cap > limit // HTTP_SHARE:
        raise ConfigError(
            f"http.max_connections: {cap} would let HTTP clients take the file descriptors "
            f"MQTT needs: at most {limit // HTTP_SHARE}, half of the process's {limit} "
            "(RLIMIT_NOFILE; raise it with ulimit -n or systemd's LimitNOFILE)"
        )


def describe_reserve(config: Config) -> tuple[int, str]:
    """The start-up line on what HTTP leaves the MQTT listeners of the file descriptors,
    and its level: a warning when their max_connections add up to more than that (past
    it new connections are refused for want of descriptors, before any cap)."""
    limit = nofile_limit()
    http = config.http.max_connections
    caps = [listener.max_connections for listener in config.listeners]
    mqtt = "no limit" if 0 in caps else f"{sum(caps)} in all"
    if limit is None:
        return logging.INFO, f"http: at most {http} connections; RLIMIT_NOFILE: unlimited"
    line = (
        f"http: at most {http} connections, of the process's {limit} file descriptors "
        f"(RLIMIT_NOFILE): MQTT listeners keep {limit - http} (max_connections: {mqtt})"
    )
    if 0 in caps or sum(caps) > limit - http:
        return logging.WARNING, (
            f"{line}; past that, new MQTT connections are refused for want of descriptors "
            "before max_connections: raise RLIMIT_NOFILE (ulimit -n, systemd's "
            "LimitNOFILE) or lower max_connections"
        )
    return logging.INFO, line
