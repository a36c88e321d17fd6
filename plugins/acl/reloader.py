"""Reading the ACL file, and reading it again when it changes.

A timer (loop.call_later) fires every `interval` seconds; the check runs in the loop's
default executor so that a slow disk never stalls the broker: it stats the file and, only
when its (mtime, size, inode) changed, reads and compiles it there. Back on the loop the
new rules are handed over in one call, so requests see the old rules or the new, never a
mix. A file that does not compile keeps the old rules and is reported once per change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from plugins.acl.rules import AclSyntaxError, RuleSet

log = logging.getLogger("nautilus.plugins.acl")

Stamp = tuple[int, int, int]


def load(path: str) -> tuple[Stamp, RuleSet]:
    """The file's stamp and compiled rules; OSError or AclSyntaxError when it cannot be."""
    info = os.stat(path)  # before reading: a change after this is seen next time
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return _stamp(info), RuleSet.from_text(text)


def describe(path: str, problem: Exception) -> str:
    """`PATH line N: what` for a bad line, `PATH: why` when the file cannot be read."""
    if isinstance(problem, AclSyntaxError):
        return f"{path} {problem}"
    if isinstance(problem, OSError):
        return f"{path}: {problem.strerror or problem}"
    if isinstance(problem, UnicodeDecodeError):
        return f"{path}: not UTF-8 text"
    return f"{path}: {problem}"


def _stamp(info: os.stat_result) -> Stamp:
    return (info.st_mtime_ns, info.st_size, info.st_ino)


class Reloader:
    """Calls `swap(rules)` with the file's new rules each time it changes."""

    def __init__(
        self, path: str, interval: float, stamp: Stamp, swap: Callable[[RuleSet], None]
    ) -> None:
        self.path = path
        self.interval = interval
        self.stamp: Stamp | None = stamp
        self.swap = swap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reported: str | None = None  # the last problem logged, not repeated

    def start(self) -> None:
        if self.interval > 0:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._timer = None
        check = self._loop.run_in_executor(None, self._check, self.stamp)
        check.add_done_callback(self._checked)

    def _check(self, known: Stamp | None) -> tuple[Stamp | None, RuleSet | Exception] | None:
        """In the executor: None when unchanged, else the new stamp and rules or problem."""
        try:
            stamp = _stamp(os.stat(self.path))
            if stamp == known:
                return None
            return load(self.path)
        except ValueError as exc:  # AclSyntaxError, or not UTF-8
            return stamp, exc
        except OSError as exc:
            return None, exc

    def _checked(self, check: asyncio.Future) -> None:
        if self._loop is None:  # stopped meanwhile
            return
        try:
            outcome = None if check.cancelled() else check.result()
        except Exception as exc:  # a bug here must not stop the reloading
            log.exception("acl file %s: check failed", self.path)
            outcome = None, exc
        if outcome is not None:
            self._apply(*outcome)
        self._schedule()

    def _apply(self, stamp: Stamp | None, result: RuleSet | Exception) -> None:
        self.stamp = stamp
        if isinstance(result, RuleSet):
            self.swap(result)
            self._reported = None
            log.info("acl file %s reloaded: %d rules", self.path, len(result))
            return
        problem = f"acl file {describe(self.path, result)}; keeping the previous rules"
        if problem != self._reported:
            log.error("%s", problem)
            self._reported = problem
