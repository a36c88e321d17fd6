"""The bridges' port: what `nautilus admin bridge show|start|stop` asks of the plugin that
runs bridges to other brokers (plugins/bridge/), through its `bridges` side door.

The admin side knows bridges only as this: rows to show, and a bridge to start or stop by
name. How a bridge connects, buffers and is placed on a cluster's nodes stays the
plugin's.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol


class BridgeControl(Protocol):
    def rows(self) -> list[dict[str, Any]]:
        """Every bridge, one row each: name, endpoint, state, buffer size, max and
        dropped (`nautilus admin bridge show`)."""
        ...

    def run(self, name: str, running: bool) -> Awaitable[None] | None:
        """Start (`running` True) or stop the bridge `name`, plain or `async`; LookupError
        for a name it has not."""
        ...


# The methods a BridgeControl must have, and whether each must be plain (not `async`):
# the broker awaits `run`, not `rows` (checked when plugins load).
BRIDGE_METHODS = {"rows": True, "run": False}
