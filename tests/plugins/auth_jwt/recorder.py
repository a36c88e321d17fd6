"""Small plugins the tests load by module path, as any third-party plugin is loaded.

plugins={"recorder": {"enabled": True, "module": "tests.plugins.auth_jwt.recorder:Recorder"}}
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

from hooks import Ok, RegisterContext

TIMEOUT = 5.0


@dataclass(frozen=True)
class Event:
    hook: str
    client_id: str
    username: str | None
    reason: str
    attributes: dict[str, Any]


class Recorder:
    """Queues every on_register and on_register_failed, for the test thread to await."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def on_register(self, ctx: RegisterContext) -> None:
        self._record("on_register", ctx)

    def on_register_failed(self, ctx: RegisterContext) -> None:
        self._record("on_register_failed", ctx)

    def _record(self, hook: str, ctx: RegisterContext) -> None:
        event = Event(hook, ctx.client_id, ctx.username, ctx.reason, dict(ctx.attributes))
        self.events.put(event)

    def expect(self, client_id: str, timeout: float = TIMEOUT) -> Event:
        """The next event of `client_id` (events of other clients are skipped)."""
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no register event for {client_id} in time") from None
            if event.client_id == client_id:
                return event


class AllowAll:
    """auth_on_register: Ok for everyone; placed after auth_jwt it shows what NEXT means."""

    def auth_on_register(self, ctx: RegisterContext) -> Ok:
        return Ok()
