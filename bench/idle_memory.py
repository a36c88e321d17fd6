"""`python -m bench.idle_memory`: what one idle connection costs the broker, and where.

    python -m bench.idle_memory --connections 4000
    python -m bench.idle_memory --keepalive 0 --topics 0 --rss-only   # bench.compare's row

One broker in this process, on uvloop as `nautilus` runs; the clients in a child process
(bench/client.py's raw ones), so that nothing of theirs is counted: each connects with a
clean session (MQTT 3.1.1, keepalive 60 s as paho's default) and subscribes to a topic of
its own ("idle/<n>/state"). Once all are subscribed (and a second has passed, as
bench.compare's idle row waits), the report says, per connection:
- `rss_kib`: VmRSS after minus before (what bench.compare's idle row measures);
- `traced_bytes`: what tracemalloc saw allocated and still held, by source line (the top
  lines: who allocates it);
- `objects`: the connection's own objects, each by sys.getsizeof with the containers it
  holds alone (dicts, lists, deques, bytearrays), from one connection taken at random.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from broker.config import config_from_dict
from broker.server import Broker

from .scenarios import rss_kib

PROG = "python -m bench.idle_memory"
SETTLE = 1.0  # seconds between the last SUBACK and the reading (bench.compare's idle row)

# The child: N clients, each CONNECT (clean) + SUBSCRIBE (unless told no topics), then
# "ready"; they stay until stdin closes.
_CLIENTS = """
import asyncio, sys
from bench import packets
from bench.client import open_client, subscribe

async def main(port: int, count: int, keepalive: int, topics: int) -> None:
    gate = asyncio.Semaphore(100)
    clients = []
    async def one(i: int) -> None:
        async with gate:
            client = await open_client("127.0.0.1", port, f"idle-{i}", keepalive=keepalive)
            clients.append(client)
            if topics:
                await subscribe(client, f"idle/{i}/state", 1)
    await asyncio.gather(*(one(i) for i in range(count)))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main(*map(int, sys.argv[1:])))
"""


def _slots(obj: Any) -> list[tuple[str, Any]]:
    names: list[str] = []
    for cls in type(obj).__mro__:
        names += [n for n in getattr(cls, "__slots__", ()) if n not in ("__dict__", "__weakref__")]
    values = [(name, getattr(obj, name, None)) for name in names]
    if hasattr(obj, "__dict__"):
        values += list(vars(obj).items())
    return values


def _line(stat: tracemalloc.StatisticDiff, count: int) -> dict[str, Any]:
    """One source line's allocations still held, per connection."""
    where = stat.traceback[0]
    return {
        "where": f"{where.filename.split('/work/')[-1]}:{where.lineno}",
        "bytes_per_connection": round(stat.size_diff / count, 1),
        "blocks_per_connection": round(stat.count_diff / count, 2),
    }


def breakdown(connection: Any) -> dict[str, int]:
    """The objects of one idle connection by sys.getsizeof, and what each of them holds
    alone (a value no other object refers to: a container, a bound method, a string)."""
    engine = connection.engine
    session = engine.session
    parts: dict[str, Any] = {
        "Connection": connection,
        "Writer": connection.writer,
        "ClientEngine": engine,
        "ClientState": engine.client,
        "ReadGate": engine.gate,
        "Decoder": engine.decoder,
        "uvloop transport": connection.transport,
        "timer": connection._timer,
    }
    if session is not None:
        parts.update(
            {"Session": session, "SessionQueue": session.queue, "InflightWindow": session.window}
        )
    known = {id(obj) for obj in parts.values()}
    sizes: dict[str, int] = {}
    for name, obj in parts.items():
        if obj is None:
            continue
        sizes[name] = sys.getsizeof(obj)
        for slot, value in _slots(obj):
            # Held by this slot alone: getrefcount sees the slot, `value` and its argument.
            if id(value) not in known and sys.getrefcount(value) <= 4:
                sizes[f"{name}.{slot} ({type(value).__name__})"] = sys.getsizeof(value)
                known.add(id(value))
    return sizes


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    broker = Broker(
        config_from_dict(
            {
                "listeners": [{"type": "tcp", "address": "127.0.0.1:0"}],
                "store": {"backend": "memory"},
                "http": {"enabled": False},
            }
        ),
        plugins=[],
    )
    await broker.start()
    port = broker.listening[0][1]
    count, trace = args.connections, not args.rss_only
    clients = [str(n) for n in (port, count, args.keepalive, args.topics)]
    child = subprocess.Popen(
        [sys.executable, "-c", _CLIENTS, *clients], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        await asyncio.sleep(0.5)  # the child's imports, and the broker's first turns
        gc.collect()
        rss_before = rss_kib(os.getpid())
        if trace:
            tracemalloc.start(1)
            before = tracemalloc.take_snapshot()
        ready = child.stdout.readline  # type: ignore[union-attr]
        line = await asyncio.get_running_loop().run_in_executor(None, ready)
        if line.strip() != b"ready":
            raise SystemExit(f"{PROG}: the clients failed: {line!r}")
        await asyncio.sleep(SETTLE)
        rss_after = rss_kib(os.getpid())
        gc.collect()
        connections = [c for c in broker.connections if c.engine.session is not None]
        report: dict[str, Any] = {
            "connections": len(connections),
            "rss_kib_per_connection": round(((rss_after or 0) - (rss_before or 0)) / count, 2),
        }
        if trace:
            stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
            tracemalloc.stop()
            report["traced_bytes_per_connection"] = sum(s.size_diff for s in stats) / count
            report["top_lines"] = [_line(stat, count) for stat in stats[: args.top]]
            report["objects"] = breakdown(connections[len(connections) // 2])
            report["objects_total"] = sum(report["objects"].values())
        return report
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait()
        await broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--top", type=int, default=25, help="source lines listed")
    parser.add_argument("--keepalive", type=int, default=60, help="seconds; 0: none")
    parser.add_argument("--topics", type=int, default=1, help="1: one subscription each; 0: none")
    parser.add_argument("--rss-only", action="store_true", help="no tracemalloc (it adds to RSS)")
    args = parser.parse_args(argv)
    import uvloop

    started = time.perf_counter()
    report = uvloop.run(_measure(args))
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
