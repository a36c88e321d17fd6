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

A connect storm (thousands of CONNECTs at once) queues more hashes than the pool can
compute within the broker's connect_timeout. The pool serves them in arrival order, so the
earliest clients get in; a client closed while its hash waits (the connect timeout, or the
client left) has its hook cancelled by the broker, which takes the hash out of the queue
unhashed; and at most `max_queued_checks` wait at once: a CONNECT beyond them is refused at
once as "server busy" (MQTT 3: 3, MQTT 5: 0x89), so it can retry rather than wait in vain.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from broker.config import ConfigError, Duration
from broker.protocol import ReasonCode
from hooks import NEXT, Error, Metric, Ok, RegisterContext
from plugins.passwd.hashes import Hash
from plugins.passwd.passwd_file import PasswdFileError, Table, load
from plugins.passwd.reloader import Reloader, signature

INVALID_CREDENTIALS = Error("invalid_credentials")
SERVER_BUSY = Error("server_busy", reason_code=ReasonCode.SERVER_BUSY)


@dataclass(slots=True)
class PasswdConfig:
    password_file: str = "./nautilus.passwd"
    # Seconds between checks for a changed file; 0 turns reloading off.
    password_reload_interval: Duration = Duration(10)
    # scrypt checks waiting or running at once; a CONNECT beyond them is refused (busy).
    max_queued_checks: int = 2000


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
        if config.max_queued_checks < 1:
            raise ConfigError(
                f"plugins.passwd.max_queued_checks: {config.max_queued_checks} must be 1 or more"
            )
        self.reloader = Reloader(path, config.password_reload_interval, self._swap, seen)
        # One thread per core, started at the first scrypt check.
        self._executor = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 1, thread_name_prefix="nautilus-passwd"
        )
        self.queued = 0  # scrypt checks waiting for the pool or running in it
        self.hashed = 0  # scrypt checks the pool computed (or is computing)
        self.dropped = 0  # taken out of the queue unhashed: the client was gone
        self.refused_busy = 0  # refused because max_queued_checks were waiting

    def _swap(self, table: Table) -> None:
        self.users = table  # one assignment: a CONNECT sees the old table or the new one

    def start(self) -> None:
        if self.config.password_reload_interval:
            self.reloader.start()

    def stop(self) -> None:
        self.reloader.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def auth_on_register(self, ctx: RegisterContext):
        if ctx.username is None or ctx.password is None:
            return NEXT
        entry = self.users.get(ctx.username)
        if entry is None:
            return NEXT
        if entry.cheap:
            matched = entry.verify(ctx.password)
        elif self.queued >= self.config.max_queued_checks:
            self.refused_busy += 1
            return SERVER_BUSY
        else:
            matched = await self._verify_in_pool(entry, ctx.password)
        return Ok() if matched else INVALID_CREDENTIALS

    async def _verify_in_pool(self, entry: Hash, password: bytes) -> bool:
        """The check in the pool's queue (first come, first served). If the broker
        cancels the hook while it waits there (the client is gone), it is never hashed."""
        check = self._executor.submit(entry.verify, password)
        self.queued += 1
        try:
            return await asyncio.wrap_future(check)
        except asyncio.CancelledError:
            if check.cancel():  # still queued: taken out (False once a thread runs it)
                self.dropped += 1
            raise
        finally:
            self.queued -= 1
            if not check.cancelled():
                self.hashed += 1

    def metrics(self) -> list[Metric]:
        """For /metrics (hooks.Metric): the scrypt pool's work in a connect storm."""
        return [
            Metric("passwd_hashes", self.hashed, help="scrypt checks computed"),
            Metric(
                "passwd_hashes_dropped",
                self.dropped,
                help="scrypt checks dropped unhashed: the client left while it waited",
            ),
            Metric(
                "passwd_refused_busy",
                self.refused_busy,
                help="CONNECTs refused as server busy: max_queued_checks were waiting",
            ),
            Metric(
                "passwd_queued", self.queued, kind="gauge", help="scrypt checks waiting or running"
            ),
        ]
