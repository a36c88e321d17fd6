"""The process's file descriptors (RLIMIT_NOFILE): its limit, and the listeners running
out of them, said once per episode (broker/episodes.py).

Each connection of every listener takes one, so the limit bounds them all together
(docs/operations.md, "Limits"); [http] is held to half of it (broker/http/limits.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
from collections.abc import Callable
from typing import Any

from broker.episodes import Episode

log = logging.getLogger("nautilus")


def nofile_limit() -> int | None:
    """The process's soft limit on open file descriptors; None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class FileDescriptors:
    """Running out of file descriptors, said once per episode.

    asyncio's loop reports every accept() that fails for want of them to the loop's
    exception handler, with a traceback each (as many as a listener's backlog, every
    second, while it lasts): this handler makes them one line, and passes on anything
    else. uvloop reports none (libuv accepts and closes such connections itself), so a
    probe also opens /dev/null every second. The episode ends when the probe succeeds and
    no accept() has failed for two seconds. `describe()`: the connections open."""

    ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message
    OUT = (errno.EMFILE, errno.ENFILE)

    def __init__(self, loop: asyncio.AbstractEventLoop, describe: Callable[[], str]) -> None:
        self.loop = loop
        self.describe = describe
        self.out = Episode(log, "failed accepts and probes", loop, end_level=logging.INFO)
        self._failed_at = 0.0  # loop time of the last failure seen
        self._probe: asyncio.TimerHandle | None = None
        self._previous: Any = None  # the loop's exception handler before this one

    def start(self) -> None:
        self._previous = self.loop.get_exception_handler()
        self.loop.set_exception_handler(self._exception)
        self._probe = self.loop.call_later(1.0, self.probe)

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
            self.loop.set_exception_handler(self._previous)

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") == self.ACCEPT_FAILED and isinstance(exc, OSError):
            self.ran_out(exc)
        elif self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def probe(self) -> None:
        self._probe = self.loop.call_later(1.0, self.probe)
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            if exc.errno in self.OUT:
                self.ran_out(exc)
            return
        if self.out.active and self.loop.time() - self._failed_at >= 2.0:
            self.out.ended("listeners accept again: file descriptors are free, %s", self.describe())

    def ran_out(self, exc: OSError) -> None:
        self._failed_at = self.loop.time()
        limit = nofile_limit()
        self.out.occurred(
            "listeners cannot accept connections: %s (RLIMIT_NOFILE %s; %s): new "
            "connections are refused until some close",
            exc.strerror or exc,
            "unlimited" if limit is None else limit,
            self.describe(),
        )
