"""ReadGate: whether one connection reads from its client now.

One small object owns the answer (uvicorn's FlowControl is the model): each reason to
stop reading closes the gate by its own bit, and the gate opens only when none is left.
The transport is told only when the answer changes, so the reasons need not know of each
other, nor of the socket:

- HELD: flow control (broker/flow.py) holds a publisher while a subscriber it feeds is
  full; released when that subscriber drains;
- HOOKS: a hook flow (a webhook's decision, say) holds the client's next packets, so that
  they keep their order;
- THROTTLED: max_message_rate was reached for this second;
- YIELDED: the client's turn of the event loop is spent (the engine's TURN_BUDGET);
- WRITING: the client sends while it does not take what we write (the transport's
  buffer is past its high-water mark): it is not read either until it does, so that the
  answers it does not read (its PUBACKs) cannot grow without bound.

No I/O here: `read` is the shell's (broker/connection.py pauses and resumes the
transport).
"""

from __future__ import annotations

from typing import Protocol

HELD = 1
HOOKS = 2
THROTTLED = 4
YIELDED = 8
WRITING = 16


class Gated(Protocol):
    """What a gate opens and closes (the client's engine, broker/client/engine.py)."""

    def gate_turned(self, reading: bool) -> None:
        """The gate's answer changed: read from the client (`reading`), or stop."""


class ReadGate:
    __slots__ = ("_gated", "closed")

    def __init__(self, gated: Gated) -> None:
        # Told the new answer, only when it changes. (The object, not a bound method of
        # it: that would be one more object per connection.)
        self._gated = gated
        self.closed = 0  # the reasons holding it, one bit each; 0: open

    def close(self, reason: int) -> None:
        if not self.closed:
            self.closed = reason
            self._gated.gate_turned(False)
        else:
            self.closed |= reason

    def open(self, reason: int) -> bool:
        """Let go of `reason`; True if that opened the gate."""
        if not self.closed & reason:
            return False
        self.closed &= ~reason
        if self.closed:
            return False
        self._gated.gate_turned(True)
        return True

    def holds(self, reason: int) -> bool:
        return bool(self.closed & reason)
