"""The broker's one clock: the event loop's `time()` and `call_later()`.

Every expiry (sessions, wills, messages, retries, flow control's stall checks) reads this
clock, never `time.monotonic()` directly, so unit tests drive time with a fake clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What an asyncio event loop offers for time; tests pass a fake with the same two."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer: ...
