"""auth_on_register against a password file (VerneMQ's vmq_passwd).

- NEXT when the CONNECT has no username or no password, or the user is not in the file:
  another plugin may know them (an exhausted chain refuses: CONNACK 5 / 0x87).
- Ok() when the password matches the user's hash.
- Error("invalid_credentials") when it does not (CONNACK 4 / 0x86).

The hook is `async` because a `$scrypt$` hash costs milliseconds of CPU: it is verified
in a small thread pool of the plugin's own (hashlib.scrypt releases the GIL), so the
event loop keeps serving other clients meanwhile and several CONNECTs verify in parallel
on several cores. VerneMQ's `$6$` hashes (one SHA-512, about a microsecond) are verified
inline. Nothing is cached: every CONNECT pays for its own verification.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from broker.config import ConfigError, Duration
from hooks import NEXT, Error, Ok, RegisterContext
from plugins.passwd.passwd_file import PasswdFileError, Table, load
from plugins.passwd.reloader import Reloader, signature

INVALID_CREDENTIALS = Error("invalid_credentials")


@dataclass(slots=True)
class PasswdConfig:
    password_file: str = "./nautilus.passwd"
    # Seconds between checks for a changed file; 0 turns reloading off.
    password_reload_interval: Duration = Duration(10)


class PasswdPlugin:
    Config = PasswdConfig

    def __init__(self, config: PasswdConfig) -> None:
        self.config = config
        path = config.password_file
        seen = signature(path)
        try:
            self.users: Table = load(path)
        except PasswdFileError as exc:
            raise ConfigError(f"plugins.passwd.password_file: {exc}") from None
        self.reloader = Reloader(path, config.password_reload_interval, self._swap, seen)
        self._executor: ThreadPoolExecutor | None = None

    def _swap(self, table: Table) -> None:
        self.users = table  # one assignment: a CONNECT sees the old table or the new one

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 1, thread_name_prefix="nautilus-passwd"
        )
        if self.config.password_reload_interval:
            self.reloader.start()

    def stop(self) -> None:
        self.reloader.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def auth_on_register(self, ctx: RegisterContext):
        if ctx.username is None or ctx.password is None:
            return NEXT
        entry = self.users.get(ctx.username)
        if entry is None:
            return NEXT
        if entry.cheap:
            matched = entry.verify(ctx.password)
        else:
            loop = asyncio.get_running_loop()
            matched = await loop.run_in_executor(self._executor, entry.verify, ctx.password)
        return Ok() if matched else INVALID_CREDENTIALS
