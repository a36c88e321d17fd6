"""Shared fixtures: a real Nautilus broker on an ephemeral 127.0.0.1 port.

The broker runs in-process on its own event loop in a background thread, so blocking
clients in the test thread (paho-mqtt, raw sockets) and clients in other processes (amqtt,
run by the interpreter of its own venv, .venv-amqtt: tests/broker/amqtt_peer.py) can
talk to it, and tests can look at the broker's state. `start_broker(**overrides)` takes
config sections as dicts, e.g. `start_broker(broker={"max_offline_messages": 2})`.

Time. The broker reads one clock, its loop's `time()` (broker/clock.py), for every expiry
and deadline. The loop here is a `ClockLoop`, whose clock a test moves forward with
`server.advance(seconds)` instead of sleeping: sessions, messages and wills then expire
exactly as they would after that long, and keep-alive sees that much time pass too.

Waiting on the broker's state. `server.wait_for(condition)` blocks until `condition()`,
run on the broker's loop, holds. Nothing polls: the loop itself evaluates the conditions
each time it is about to wait for I/O, that is once per turn, after whatever ran in it.
The same hook tells `advance` when the loop has nothing due any more.

Real servers (Redis, PostgreSQL, MariaDB, Mosquitto, carbon-cache) come from testing/,
started by fixtures; one whose binary is not installed skips the tests that need it, with
the package to install (`skip_when_missing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from broker.config import config_from_dict
from broker.protocol import use_compiled
from broker.server import Broker
from testing.lifecycle import Missing

# NAUTILUS_NO_SPEEDUPS=1: the pure-Python twins of the compiled hot path, as on a machine
# without a C compiler (`make test` runs the engine's tests this way too).
if os.environ.get("NAUTILUS_NO_SPEEDUPS"):
    use_compiled(False)

WAIT = 10.0  # the longest the test thread waits for the broker's loop


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """A server (testing/) that a fixture starts and is not installed: the test is
    skipped, with the package to install, not failed."""
    with skip_when_missing():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """The same for a server the test starts through a factory (`start_mosquitto`)."""
    with skip_when_missing():
        return (yield)


@contextlib.contextmanager
def skip_when_missing() -> Iterator[None]:
    try:
        yield
    except Missing as missing:
        pytest.skip(str(missing))


class _Waiter:
    """A test thread waiting for the broker's loop; `condition` None: for the loop to be idle."""

    __slots__ = ("condition", "done", "error")

    def __init__(self, condition: Callable[[], bool] | None = None) -> None:
        self.condition = condition
        self.done = threading.Event()
        self.error: BaseException | None = None

    def check(self) -> bool:
        """Evaluate the condition (on the loop); True once the waiter is done."""
        try:
            met = self.condition is None or bool(self.condition())
        except BaseException as exc:  # raised again in the test thread
            self.error = exc
            met = True
        if met:
            self.done.set()
        return met

    def wait(self, timeout: float, what: str) -> None:
        assert self.done.wait(timeout), f"the broker's loop did not get there in time: {what}"
        if self.error is not None:
            raise self.error


class _WatchingSelector(selectors.DefaultSelector):
    """The loop's selector, which checks what the test thread waits for on every turn.

    asyncio calls `select` once per loop turn, after running the turn's callbacks, with
    timeout 0 while callbacks are ready or timers are due, and otherwise with the time to
    the next timer (None: none): so a non-zero timeout means the loop is idle.
    Only the loop's thread touches the lists (waiters are added with call_soon_threadsafe).
    """

    def __init__(self) -> None:
        super().__init__()
        self.conditions: list[_Waiter] = []
        self.idle: list[_Waiter] = []
        self._resolution = time.get_clock_info("monotonic").resolution

    def watch(self, waiter: _Waiter) -> None:
        self.conditions.append(waiter)

    def unwatch(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self.conditions.remove(waiter)

    def select(self, timeout: float | None = None) -> list:
        if self.conditions:
            self.conditions[:] = [w for w in self.conditions if not w.check()]
        if self.idle and (timeout is None or timeout > self._resolution):
            for waiter in self.idle:
                waiter.check()
            self.idle.clear()
        return super().select(timeout)


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs `offset` seconds ahead of the monotonic clock.

    asyncio schedules every timer by `self.time()` (call_later is call_at(time() + delay)),
    so raising the offset makes the timers that are now due run on the next turn.
    """

    def __init__(self) -> None:
        self.offset = 0.0  # changed on the loop's own thread only (see BrokerThread.advance)
        self.watching = _WatchingSelector()
        super().__init__(self.watching)

    def time(self) -> float:
        return super().time() + self.offset


class BrokerThread:
    """A Broker serving on its own loop in a daemon thread."""

    def __init__(self, sections: dict[str, Any]) -> None:
        sections.setdefault("listeners", [{"type": "tcp", "address": "127.0.0.1:0"}])
        sections.setdefault("store", {"backend": "memory"})
        sections.setdefault("http", {"address": "127.0.0.1:0"})  # not 8888: brokers would clash
        self.config = config_from_dict(sections)
        self.loop = ClockLoop()
        self.broker = Broker(self.config, loop=self.loop)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nautilus-test", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.broker.start())
        except BaseException as exc:  # reported to the test thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.broker.stop())
        self.loop.close()

    def start(self) -> BrokerThread:
        self._thread.start()
        self._started.wait(WAIT)
        if self._error:
            raise self._error
        return self

    @property
    def host(self) -> str:
        return self.broker.listening[0][0]

    @property
    def port(self) -> int:
        return self.broker.listening[0][1]

    def call(self, fn, *args):
        """Run fn(*args) on the broker's loop and return its result (coroutines awaited)."""

        async def runner():
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(WAIT)

    def advance(self, seconds: float) -> None:
        """Move the broker's clock `seconds` forward, and return once the timers that are
        now due have run, with everything they set off at once (callbacks scheduled by
        them, and so on until the loop has nothing due). Network I/O that they started
        (a will's PUBLISH on its way to a client) is awaited by the test as usual."""
        waiter = _Waiter()

        def move() -> None:
            self.loop.offset += seconds
            self.loop.watching.idle.append(waiter)

        self.loop.call_soon_threadsafe(move)
        waiter.wait(WAIT, f"timers due within {seconds}s")

    def wait_for(self, condition: Callable[[], bool], timeout: float = WAIT) -> None:
        """Block until `condition()`, run on the broker's loop, holds (for broker state
        that no client can see). The loop checks it once per turn; nothing polls."""
        waiter = _Waiter(condition)
        self.loop.call_soon_threadsafe(self.loop.watching.watch, waiter)
        try:
            waiter.wait(timeout, getattr(condition, "__name__", repr(condition)))
        finally:
            with contextlib.suppress(RuntimeError):  # the loop may be closed by then
                self.loop.call_soon_threadsafe(self.loop.watching.unwatch, waiter)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(WAIT)


@pytest.fixture
def start_broker() -> Iterator[Any]:
    started: list[BrokerThread] = []

    def start(**sections: Any) -> BrokerThread:
        thread = BrokerThread(dict(sections)).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        with contextlib.suppress(Exception):
            thread.stop()


@pytest.fixture
def broker(start_broker) -> BrokerThread:
    """A broker on the embedded defaults (memory store, anonymous access)."""
    return start_broker()
