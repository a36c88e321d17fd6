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

from collections.abc import Callable

HELD = 1
HOOKS = 2
THROTTLED = 4
YIELDED = 8
WRITING = 16


class ReadGate:
    __slots__ = ("_read", "closed")

    def __init__(self, read: Callable[[bool], None]) -> None:
        self._read = read  # called with the new answer, only when it changes
        self.closed = 0  # the reasons holding it, one bit each; 0: open

    def close(self, reason: int) -> None:
        if not self.closed:
            self.closed = reason
            self._read(False)
        else:
            self.closed |= reason

    def open(self, reason: int) -> bool:
        """Let go of `reason`; True if that opened the gate."""
        if not self.closed & reason:
            return False
        self.closed &= ~reason
        if self.closed:
            return False
        self._read(True)
        return True

    def holds(self, reason: int) -> bool:
        return bool(self.closed & reason)
