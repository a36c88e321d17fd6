"""Re-read the password file when it changes (VerneMQ's vmq_passwd_reloader, as a timer).

Every `interval` seconds the file is stat()ed; when its (mtime, size, inode) differ from
the last look, it is parsed and the new table handed to `apply`. A broken or missing file
is logged once (file and line) and the previous table stays in force until the file
changes again. Each check (a stat(), and a read and parse only on change) runs in the
loop's default executor: parsing costs about 5 µs a line, so a 100,000-user file would
otherwise pause every client for half a second. The swap itself is one assignment.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from plugins.passwd.passwd_file import PasswdFileError, Table, load

log = logging.getLogger("nautilus.plugins.passwd")

Signature = tuple[int, int, int] | None


def signature(path: str) -> Signature:
    """What changes when the file is rewritten (os.replace gives a new inode, so even a
    rewrite within one mtime tick is seen)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Reloader:
    def __init__(
        self, path: str, interval: float, apply: Callable[[Table], None], seen: Signature
    ) -> None:
        self.path = path
        self.interval = interval
        self.apply = apply
        self.seen = seen  # the signature of the file the current table came from
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def _schedule(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._handle = self._loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        if self._loop is not None:
            self._loop.run_in_executor(None, self.check).add_done_callback(self._checked)

    def _checked(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("passwd: checking %s failed", self.path, exc_info=future.exception())
        self._schedule()

    def check(self) -> bool:
        """Reload if the file changed; True if a new table was applied."""
        current = signature(self.path)
        if current == self.seen:
            return False
        self.seen = current  # whatever happens next, this version has been looked at
        if current is None:
            log.error("passwd: %s: cannot read it; keeping the previous users", self.path)
            return False
        try:
            table = load(self.path)
        except PasswdFileError as exc:
            log.error("passwd: %s; keeping the previous users", exc)
            return False
        self.apply(table)
        log.info("passwd: reloaded %d users from %s", len(table), self.path)
        return True
