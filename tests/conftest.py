"""Shared fixtures: a real Nautilus broker on an ephemeral 127.0.0.1 port.

The broker runs in-process on its own event loop in a background thread, so blocking
clients (paho-mqtt) and asyncio clients (amqtt) can both talk to it, and tests can look at
the broker's state. `start_broker(**overrides)` takes config sections as dicts, e.g.
`start_broker(broker={"max_offline_messages": 2})`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from broker.config import config_from_dict
from broker.server import Broker


class BrokerThread:
    """A Broker serving on its own loop in a daemon thread."""

    def __init__(self, sections: dict[str, Any]) -> None:
        sections.setdefault("listeners", [{"type": "tcp", "address": "127.0.0.1:0"}])
        sections.setdefault("store", {"backend": "memory"})
        self.config = config_from_dict(sections)
        self.loop = asyncio.new_event_loop()
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
        self._started.wait(10)
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

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


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
