"""How long a plugin's answer holds: `cache_for` on a result, and `forget_decisions()`.

An auth_on_publish(_m5) hook that returns Ok, Error or Next with `cache_for=N` promises
that, for N seconds, it would answer the same (modifiers included) for any message of the
same connection to the same topic with the same QoS and retain flag, whatever its payload
and properties. When every plugin the chain asked made such a promise, the broker keeps
the chain's answer for the connection (for the shortest of the promises) and does not ask
again until then: a QoS 0 flood then stays on the compiled run path, and a QoS 1 message
costs a dict lookup instead of the chain. A hook that says nothing (`cache_for` None, a
plain NEXT, None) is asked for every message, as before.

A plugin whose answers change before their time (its rules were reloaded, an operator
ran `nautilus admin auth invalidate`) calls `forget_decisions()`: every kept answer in
the process is dropped, and the next message of every connection asks the chain again.
It is one counter (`GENERATION`), compared with the one each answer was kept under: cheap
enough to call on every reload.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hooks.results import Result

FOREVER = math.inf  # cache_for: until forget_decisions()

DecisionKey = tuple[str, int, bool]  # a connection's message: its topic, QoS, retain
KeptDecision = tuple["Result", float, int]  # the answer, held until (clock), its generation


class Generation:
    """A counter bumped by every forget_decisions() (kept answers carry the one they were
    made under)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


GENERATION = Generation()


def forget_decisions() -> None:
    """Every cached auth_on_publish answer stops holding now (in this process)."""
    GENERATION.value += 1
