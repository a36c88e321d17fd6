"""broker/collector.py against CPython's real collector: every pass timed and counted,
what survives a full pass frozen, a long pause logged once per episode, and garbage
among frozen objects collected once the frozen set outgrows what the node holds.

The broker's own use (start-up frozen, its sessions frozen by the next full pass, the
figures on its gauges): tests/broker/test_gc.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from collections.abc import Callable, Iterator

import pytest

from broker.collector import Collector
from broker.metrics import Metrics


class Cycle:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = [self]  # two tracked objects: the instance and the list


@pytest.fixture
def make_collector() -> Iterator[Callable[..., Collector]]:
    """make_collector(held=..., long_pause=..., allocated=...) -> a started Collector on a
    loop of its own; stopped, and every object unfrozen again, after the test."""
    loop = asyncio.new_event_loop()
    made: list[Collector] = []

    def make(
        held: Callable[[], int] = lambda: 0,
        long_pause: float = 1.0,
        allocated: Callable[[], int] = sys.getallocatedblocks,
    ) -> Collector:
        collector = Collector(loop, Metrics(), held, long_pause, allocated)
        collector.start()
        collector.started()
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.stop()
    loop.close()
    gc.unfreeze()


def test_every_pass_is_timed_and_counted(make_collector):
    collector = make_collector()
    gc.collect(0)
    gc.collect(2)
    assert collector.metrics.gc_collections == 2
    figures = collector.figures()
    assert 0 < figures["gc_pause_seconds_max"] < 1
    assert figures["gc_frozen_objects"] > 0  # counted when started


def test_what_survives_a_full_pass_is_frozen(make_collector):
    make_collector()
    kept = [Cycle() for _ in range(100)]
    assert any(o is kept[0] for o in gc.get_objects())  # walked by every full pass
    gc.collect(2)
    assert not any(o is kept[0] for o in gc.get_objects())  # in the permanent generation


def test_a_long_pause_is_logged_once_per_episode(make_collector, caplog):
    caplog.set_level(logging.WARNING, "nautilus")
    collector = make_collector(long_pause=0.0)  # every pass counts as long
    for _ in range(3):
        gc.collect()
    collector.loop.run_until_complete(asyncio.sleep(0))  # the lines are logged on the loop
    lines = [r.getMessage() for r in caplog.records if "paused this node" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("garbage collection (generation 2) paused this node for ")


def test_garbage_among_frozen_objects_goes_once_it_outgrows_what_is_held(make_collector):
    held = [0]
    blocks = [1000]  # the allocator's blocks in use, as the test says they are
    collector = make_collector(held=lambda: held[0], allocated=lambda: blocks[0])
    # Twice the frozen set in new tracked objects: even if some of what was frozen is
    # freed meanwhile (reference counting frees frozen objects too), the set outgrows
    # twice its base.
    cycles = [Cycle() for _ in range(gc.get_freeze_count())]
    probe = weakref.ref(cycles[0])
    gc.collect()  # alive, so frozen
    del cycles  # now garbage that no pass walks
    gc.collect()
    assert probe() is not None
    counted = collector.frozen
    assert not collector.look()  # the memory did not grow: the frozen set is not walked
    assert collector.frozen == counted
    blocks[0] = 3000  # it grew...
    held[0] = 10**9  # ...but a node holding that much explains it all
    assert not collector.look()
    assert probe() is not None
    held[0] = 0  # nothing held explains it: the frozen set is counted, and it grew
    blocks[0] = 7000  # (twice what the last count left as the base)
    assert collector.look()  # so: unfreeze, collect, freeze
    assert probe() is None
    assert not collector.look()  # the next look starts from what that pass left


def test_memory_that_went_elsewhere_is_counted_again_only_once_it_doubles(make_collector):
    blocks = [1000]
    collector = make_collector(allocated=lambda: blocks[0])
    # 4,000 tracked objects frozen at a time: a walk counts them, a look without one does
    # not (the count is compared loosely: other tests' objects may be freed meanwhile).
    kept = [Cycle() for _ in range(2000)]
    gc.collect()
    blocks[0] = 2500  # past twice the base, and the frozen set explains none of it
    assert not collector.look()  # walked (counted), and nothing to collect
    assert abs(collector.frozen - gc.get_freeze_count()) < 1000
    kept += [Cycle() for _ in range(2000)]
    gc.collect()
    blocks[0] = 4900  # less than twice the memory the last count left as its base
    assert not collector.look()
    assert gc.get_freeze_count() - collector.frozen > 3000  # not walked
    blocks[0] = 5100  # twice: walked again
    assert not collector.look()
    assert abs(collector.frozen - gc.get_freeze_count()) < 1000
