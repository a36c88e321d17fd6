"""`python -m bench.gc_heap`: garbage collection pauses of a node's heap as it grows to N sessions.

    python -m bench.gc_heap --sessions 1000000              # ~4 GB, a few minutes
    python -m bench.gc_heap --sessions 1000000 --old-gc     # the collector as before #41

One broker in this process (`metadata = "swc"`, a node of its own, no clients over the
network), whose state is made directly, as fast as Python allows: per session, what a
persistent subscriber leaves on the node that holds it (its session, registered; one
subscription in the router and the session; its record in the leaderless metadata,
written and committed as a CONNECT writes it). Then --churn clean sessions come and go
(made, registered, ended). Every pass of CPython's collector is timed (gc.callbacks):
the longest, and how many took 100 ms or more, while growing and while churning; last,
one full pass made at the end (`full_pass`: what one costs when it comes, which with the
old settings may not happen within the run).

What this leaves out (connections, the network, the other nodes) is what bench/gc_pauses.py
has, at the sizes a 2-core machine makes in minutes. --old-gc: thresholds (10000, 50,
100) and one gc.freeze() after start-up, as `nautilus` ran before broker/collector.py.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from typing import Any

from broker import collector
from broker.config import config_from_dict
from broker.server import Broker
from broker.subscription_trie import SubOptions

PROG = "python -m bench.gc_heap"
SLOW = 0.1  # seconds: a pass this long counts (the 100 ms)
BATCH = 1000  # sessions made per loop turn (their records share a commit)
OLD_THRESHOLDS = (10_000, 50, 100)


class Passes:
    """Times every collection, per phase: the longest in CPU time (what the pass itself
    costs: on a machine shared with other work the scheduler's delays come on top) and
    in wall-clock time, and how many took 100 ms or more of CPU."""

    def __init__(self) -> None:
        self.began = (0.0, 0.0)
        self.longest = self.longest_wall = 0.0
        self.longest_generation = -1
        self.slow = self.count = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.began = (time.thread_time(), time.perf_counter())
            return
        cpu = time.thread_time() - self.began[0]
        self.longest_wall = max(self.longest_wall, time.perf_counter() - self.began[1])
        self.count += 1
        if cpu > self.longest:
            self.longest, self.longest_generation = cpu, info["generation"]
        self.slow += cpu >= SLOW

    def phase(self) -> dict[str, Any]:
        figures = {
            "passes": self.count,
            "longest_pause_cpu_ms": round(self.longest * 1000, 1),
            "its_generation": self.longest_generation,
            "longest_pause_wall_ms": round(self.longest_wall * 1000, 1),
            "pauses_over_100ms_cpu": self.slow,
        }
        self.longest = self.longest_wall = 0.0
        self.slow = self.count = 0
        return figures


def old_collector() -> None:
    """The collector as before broker/collector.py: its thresholds, no timing, no
    freezing after full passes (start-up was frozen once, by `nautilus` itself)."""

    def start(self: collector.Collector) -> None:
        gc.set_threshold(*OLD_THRESHOLDS)

    def started(self: collector.Collector) -> None:
        gc.freeze()

    collector.Collector.start = start  # type: ignore[method-assign]
    collector.Collector.started = started  # type: ignore[method-assign]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-gc-heap-") as directory:
        return await measure(args, directory)


async def measure(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    config = config_from_dict(
        {
            "listeners": [{"address": "127.0.0.1:0"}],
            "http": {"enabled": False},
            "store": {"backend": "memory"},  # (as bench/swc.py's nodes)
            "cluster": {
                "node_name": "a",
                "address": "127.0.0.1:0",
                "metadata": "swc",
                "swc": {"directory": f"{directory}/swc"},
            },
        }
    )
    broker = Broker(config)
    await broker.start()
    backend: Any = broker.peers.backend  # type: ignore[union-attr]
    passes = Passes()
    gc.callbacks.append(passes)
    result: dict[str, Any] = {"sessions": args.sessions, "old_gc": args.old_gc}
    try:
        started = time.monotonic()
        blocks = sys.getallocatedblocks()
        held = len(broker.registry)
        for first in range(0, args.sessions, BATCH):
            batch = range(first, min(first + BATCH, args.sessions))
            await asyncio.gather(*(hold(broker, backend, f"held-{i}") for i in batch))
        result["made_per_s"] = round(args.sessions / (time.monotonic() - started))
        result["grow"] = passes.phase()
        # The allocator's blocks per session held (broker/collector.py's BLOCKS_PER_HELD
        # must be above it: more would make its look walk the frozen set for nothing).
        grown = max(len(broker.registry) - held, 1)
        result["blocks_per_session"] = round((sys.getallocatedblocks() - blocks) / grown, 1)
        for first in range(0, args.churn, BATCH):
            batch = range(first, min(first + BATCH, args.churn))
            await asyncio.gather(*(come_and_go(broker, backend, f"churn-{i}") for i in batch))
        result["churn"] = {"sessions": args.churn, **passes.phase()}
        result["frozen_objects"] = gc.get_freeze_count()
        result["tracked_objects"] = len(gc.get_objects())
        gc.collect()  # what a full pass costs when one comes now
        result["full_pass"] = passes.phase()
    finally:
        gc.callbacks.remove(passes)
        await broker.stop()
    return result


async def hold(broker: Broker, backend: Any, client_id: str) -> None:
    """A persistent subscriber's session and record, as its CONNECT and SUBSCRIBE
    leave them."""
    await backend.register(client_id, False, time.time_ns())
    session, _ = broker.registry.connect(client_id, False, None)
    topic_filter = f"{client_id}/t"
    options = SubOptions(1)
    session.subscriptions[topic_filter] = options
    broker.router.subscribe(session, topic_filter, options)


async def come_and_go(broker: Broker, backend: Any, client_id: str) -> None:
    await hold(broker, backend, client_id)
    session = broker.registry[client_id]
    broker.router.unsubscribe(session, f"{client_id}/t")
    broker.registry.end(session)
    backend.replicas.delete(("sub", client_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300_000)
    parser.add_argument("--churn", type=int, default=100_000, help="clean sessions after")
    parser.add_argument("--old-gc", action="store_true", help="the collector before #41")
    args = parser.parse_args(argv)
    if args.old_gc:
        old_collector()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
