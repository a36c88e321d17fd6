"""The messages a bridge owes the remote: in memory, or on disk (`persistent_queue`: a
LevelDB of its own, so they survive a restart of this broker).

Both keep the messages in order, each under a token: `take()` hands out the next one (it
stays counted, in flight), `done(token)` forgets it once the remote has it, `back(token)`
makes it the next again (a send cut off by a lost connection). `put()` refuses beyond
the bound: the caller counts the drop.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgpack

from broker.protocol import Publish


class MemoryBuffer:
    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._waiting: deque[tuple[int, Publish]] = deque()
        self._inflight: dict[int, Publish] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._waiting) + len(self._inflight)

    def __bool__(self) -> bool:  # something to take now
        return bool(self._waiting)

    def put(self, message: Publish) -> bool:
        if len(self) >= self.bound:
            return False
        self._next += 1
        self._keep(self._next, message)
        self._waiting.append((self._next, message))
        return True

    def take(self) -> tuple[int, Publish]:
        token, message = self._waiting.popleft()
        self._inflight[token] = message
        return token, message

    def done(self, token: int) -> None:
        self._inflight.pop(token, None)
        self._forget(token)

    def back(self, token: int) -> None:
        message = self._inflight.pop(token, None)
        if message is not None:
            self._waiting.appendleft((token, message))

    def close(self) -> None:
        pass

    # what the disk buffer adds
    def _keep(self, token: int, message: Publish) -> None:
        pass

    def _forget(self, token: int) -> None:
        pass


class DiskBuffer(MemoryBuffer):
    """The same, each message also written to LevelDB under its token (8 bytes, big
    endian: LevelDB's order is theirs) until the remote has it."""

    def __init__(self, bound: int, path: str) -> None:
        super().__init__(bound)
        import plyvel  # only with persistent_queue

        self._db: Any = plyvel.DB(path, create_if_missing=True)
        for key, value in self._db.iterator():  # what a previous run left, in order
            token = int.from_bytes(key, "big")
            self._waiting.append((token, _decode(value)))
            self._next = token

    def _keep(self, token: int, message: Publish) -> None:
        self._db.put(token.to_bytes(8, "big"), _encode(message))

    def _forget(self, token: int) -> None:
        self._db.delete(token.to_bytes(8, "big"))

    def close(self) -> None:
        self._db.close()


def _encode(message: Publish) -> bytes:
    properties = {str(key): value for key, value in message.properties.items()}
    packed: bytes = msgpack.packb(
        [message.topic, message.payload, message.qos, message.retain, properties]
    )
    return packed


def _decode(value: bytes) -> Publish:
    topic, payload, qos, retain, properties = msgpack.unpackb(value)
    restored = {int(key): _tuples(item) for key, item in properties.items()}
    return Publish(topic, payload, qos, retain, properties=restored)


def _tuples(value: Any) -> Any:
    """User properties come back as lists of lists: pairs again."""
    if isinstance(value, list) and all(isinstance(v, list) and len(v) == 2 for v in value):
        return [tuple(v) for v in value]
    return value
