"""CPython's cyclic garbage collector, kept from pausing the node.

A full (generation 2) collection walks every object the collector tracks. A node holding
a million persistent sessions tracks about 12 million (per offline session: the session,
its queue and window, its subscription's trie node and options, its metadata object,
dicts and sets; a connected client adds some 25 more), and a full pass over them paused
the node for ~3 s: long enough for the other nodes to take it for dead (a false
netsplit). So nothing long-lived stays where a collection walks it:

- **Frozen after every full collection.** What survives a full pass is reachable, so it
  goes into the permanent generation (`gc.freeze()`), which no later pass walks. Full
  passes then walk only what came since the last one, and the thresholds below make
  them come every ~50,000 objects of growth: about 0.05 s, at any size.
- **Frozen after start-up and bulk loads.** The restored store, the metadata loaded from
  disk, a joining node's copy of the cluster's metadata (broker/cluster/swc/service.py).
- **Garbage among frozen objects.** A frozen object that later ends in a reference cycle
  (a connection that closes, a session that ends) is never collected while frozen.
  Every CHECK_INTERVAL the collector looks at the memory the allocator holds
  (`sys.getallocatedblocks()`, a few ms at any size): while it is less than twice what
  the node's state explains (BLOCKS_PER_HELD for each thing it holds more: sessions,
  connections, metadata keys), nothing else is done. Past that, the frozen set is
  counted (a walk over every frozen object: ~2 s at a million sessions, so not every
  CHECK_INTERVAL, as it was) and compared with what the node holds: if it has grown to
  twice what that explains (OBJECTS_PER_HELD for each thing held since the last whole
  pass), the collector unfreezes, collects everything and freezes again. That pass is
  as long as the heap is big (the pause this module otherwise avoids), so it comes only
  when unreachable cycles are about as large as the live state: memory stays within ~2x
  of what is held. If the frozen set explains nothing (the memory went to queues, say),
  the memory as it is now is the new base: it is counted again only once that doubles.

Every pass is timed (gc.callbacks): `gc_collections` counts them, `gc_pause_seconds_max`
is the longest, and a pause of LONG_PAUSE or more logs one WARNING per episode.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from broker.metrics import Metrics

log = logging.getLogger("nautilus")

# Young passes every 10,000 allocations (a pass every 700 walked the hot path's
# short-lived objects for nothing: reference counting frees them), a middle pass every 2
# young ones, a full pass every 2 middle ones: none walks more than ~60,000 objects
# (at ~1 us each: a full pass every 5 young ones, 120,000 objects, took up to 0.16 s).
GC_THRESHOLDS = (10_000, 1, 1)
LONG_PAUSE = 1.0  # seconds: a pause this long is logged (another node may take it for dead)
EPISODE_GAP = 60.0  # seconds without a long pause: the next one starts a new episode
CHECK_INTERVAL = 60.0  # seconds between looks at the frozen set's growth
# Tracked objects a thing the node holds may account for: a connected client's are ~25
# (its connection, engine, writer, session...), an offline session's ~12, a key of the
# leaderless metadata's ~5.
OBJECTS_PER_HELD = 25
# Allocator blocks a thing the node holds may account for: its tracked objects and the
# strings, numbers and buffers they hold (an offline session: 25, `python -m
# bench.gc_heap`; a connected client more).
BLOCKS_PER_HELD = 100
GROWTH_LIMIT = 2.0  # the frozen set this many times what is held explains: a whole pass


class Collector:
    """Times every collection and freezes what survives a full one (see above). `held`
    counts what the node holds (sessions, connections, metadata keys)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        held: Callable[[], int],
        long_pause: float = LONG_PAUSE,
        allocated: Callable[[], int] = sys.getallocatedblocks,
    ) -> None:
        self.loop = loop
        self.metrics = metrics
        self.held = held
        self.long_pause = long_pause
        self.allocated = allocated  # the allocator's blocks in use
        self.pause_max = 0.0  # seconds, the longest pause since start
        self._began = 0.0
        self._last_long = float("-inf")  # when the last long pause ended (monotonic)
        # What the last whole pass left frozen, and what the node held then.
        self._frozen_base = 0
        self._held_base = 0
        # The allocator's blocks when the frozen set was last counted, and what the node
        # held then: the frozen set is counted again once they have doubled.
        self._blocks_base = 0
        self._blocks_held = 0
        # As of the last count (counting walks every frozen object: done only when the
        # memory grew past what is held, not at each $SYS round or look).
        self.frozen = 0
        self._thresholds = gc.get_threshold()
        self._check: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """From now on: the thresholds, the timing, the freezing after full passes. What
        is there already (modules, the config) is frozen at once."""
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        if self._timed not in gc.callbacks:
            gc.callbacks.append(self._timed)

    def started(self) -> None:
        """Start-up is over (the store restored, the metadata loaded): freeze what it
        made, and look at the frozen set's growth from now on."""
        gc.freeze()
        self._rebase()
        self._check = self.loop.call_later(CHECK_INTERVAL, self._tick)

    def stop(self) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
        gc.set_threshold(*self._thresholds)

    def figures(self) -> dict[str, float]:
        return {
            "gc_pause_seconds_max": round(self.pause_max, 6),
            "gc_frozen_objects": self.frozen,
        }

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks: called at the start and the end of every pass (in whichever
        thread collects, with the collector itself off)."""
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        self.metrics.gc_collections += 1
        self.pause_max = max(self.pause_max, pause)
        if info["generation"] == 2:
            gc.freeze()  # what survived is reachable: out of every later pass
        if pause >= self.long_pause and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._long_pause, pause, info["generation"])

    def _long_pause(self, pause: float, generation: int) -> None:
        now = time.monotonic()
        if now - self._last_long > EPISODE_GAP:
            log.warning(
                "garbage collection (generation %d) paused this node for %.2f s: other "
                "nodes may take it for dead (gc_pause_seconds_max)",
                generation,
                pause,
            )
        self._last_long = now

    def _rebase(self) -> None:
        self._frozen_base = self.frozen = gc.get_freeze_count()
        self._held_base = self.held()
        self._rebase_blocks(self._held_base)

    def _rebase_blocks(self, held: int) -> None:
        self._blocks_base = self.allocated()
        self._blocks_held = held

    def _tick(self) -> None:
        self._check = self.loop.call_later(CHECK_INTERVAL, self._tick)
        self.look()

    def look(self) -> bool:
        """Every CHECK_INTERVAL: a whole pass if the memory and then the frozen set grew
        past what the node's state explains (garbage among frozen objects, see above).
        Whether it made one."""
        held = self.held()
        blocks = self.allocated()
        if blocks <= GROWTH_LIMIT * (
            self._blocks_base + BLOCKS_PER_HELD * max(0, held - self._blocks_held)
        ):
            return False  # nothing to explain: the frozen set is not walked
        frozen = self.frozen = gc.get_freeze_count()
        explained = self._frozen_base + OBJECTS_PER_HELD * max(0, held - self._held_base)
        if frozen <= GROWTH_LIMIT * explained:
            self._rebase_blocks(held)  # the memory went elsewhere: counted again at 2x
            return False
        log.info(
            "garbage collection: %d objects frozen, %.1fx what the node holds "
            "explains: collecting them all once",
            frozen,
            frozen / max(explained, 1),
        )
        self.collect_all()
        return True

    def collect_all(self) -> int:
        """Unfreeze, collect everything and freeze what survived (a pause as long as
        the heap is big). Returns the objects found unreachable."""
        gc.unfreeze()
        found = gc.collect()  # (the callback freezes what survived)
        self._rebase()
        return found
