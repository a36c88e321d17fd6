"""What an auth-style hook returns: Ok (with modifiers), Next, or Error.

These follow VerneMQ's result rules (vmq_plugin_helper:all_till_ok):

| result            | effect                                   |
|-------------------|------------------------------------------|
| Ok()              | stop, allow                              |
| Ok({...})         | stop, allow with these modifiers         |
| Error(reason)     | stop, deny                               |
| NEXT, None        | ask the next plugin                      |
| anything else     | treated as Error (and logged)            |
| chain exhausted   | deny                                     |

Any of them may say how long the answer holds (`cache_for`, seconds; `FOREVER`: until
`forget_decisions()`, hooks/decisions.py), and the broker then reuses the chain's answer
for the connection's next messages to the same topic, QoS and retain flag without asking
(auth_on_publish(_m5) only). Without `cache_for` the hook is asked every time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Ok:
    """Allow. `modifiers` change what is allowed (each hook has its own allow-list)."""

    modifiers: Mapping[str, Any] = field(default_factory=dict)
    cache_for: float | None = None  # seconds this answer holds (module docstring)


@dataclass(frozen=True, slots=True)
class Next:
    """No opinion: let the next plugin in the chain decide (NEXT: asked every time)."""

    cache_for: float | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """Deny. `reason` is logged and reported (e.g. "invalid_credentials"); an MQTT 5
    `reason_code` (e.g. 0x87) is sent to the client where the protocol has a place for it.
    `properties` may add User Properties (Property.USER_PROPERTY: [(name, value)]) to that
    MQTT 5 refusal (CONNACK, PUBACK / PUBREC, SUBACK)."""

    reason: str = "not_authorized"
    reason_code: int | None = None
    properties: Mapping[int, Any] = field(default_factory=dict, hash=False)
    cache_for: float | None = None


NEXT = Next()

Result = Ok | Next | Error

# The chain's verdict when nobody said Ok or Error.
CHAIN_EXHAUSTED = Error("plugin_chain_exhausted")
NO_HOOK = Error("no_matching_hook_found")
