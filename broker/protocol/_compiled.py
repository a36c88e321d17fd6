# The hot path's compiled functions (_speedups.c) and their pure-Python twins.
#
# `hot` holds the ones in use: compiled when the extension was built (a C compiler at
# install), pure Python otherwise or after `use_compiled(False)` (NAUTILUS_NO_SPEEDUPS=1
# makes `nautilus` call it; the tests run both). Callers look them up on `hot` at each call,
# so the switch reaches everyone. Both kinds must give the same results:
# tests/protocol/test_compiled.py compares them on random and damaged input.
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._events import PingReq, PingResp, PubAck, PubComp, Publish, PubRec, PubRel
from ._writers import publish_with_id

# (buffer, pos, level, allowed types as a bit mask, max packet size, limit) -> (packets in
# reverse order, pos after them); see _decoder.py
DecodeRun = Callable[[bytearray, int, int, int, int, int], tuple[list[Any], int]]


def _load() -> Any:
    try:
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    _speedups.setup(Publish, PubAck, PubRec, PubRel, PubComp, PingReq, PingResp)
    return _speedups


_speedups = _load()
BUILT = _speedups is not None


class Hot:
    """The functions in use."""

    __slots__ = ("decode_run", "publish_with_id")

    def __init__(self) -> None:
        # None: the decoder reads every packet in Python (it has no run decoder of its own)
        self.decode_run: DecodeRun | None = None
        self.publish_with_id: Callable[[bytes, int, bool], bytes] = publish_with_id


hot = Hot()


def use_compiled(enabled: bool) -> bool:
    """Use the compiled functions (if built) or the pure-Python ones; whether the
    compiled ones are in use now."""
    compiled = enabled and _speedups is not None
    hot.decode_run = _speedups.decode_run if compiled else None
    hot.publish_with_id = _speedups.publish_with_id if compiled else publish_with_id
    return compiled


use_compiled(True)
