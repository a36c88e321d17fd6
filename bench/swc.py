"""`python -m bench.swc`: what the leaderless metadata (`metadata = "swc"`) costs.

    python -m bench.swc                      # 100,000 subscribers, ~3 minutes on 2 cores
    python -m bench.swc --subscribers 20000  # quicker
    python -m bench.swc --subscribers 1000000 --generators 2   # ~30 minutes, ~8 GB

The clients are made by `--generators` processes (--concurrency each at once). First,
the same generators make N/10 clients against bench/nullbroker.py (which answers CONNECT
and SUBSCRIBE at once): that rate is the generators' own ceiling, beside the rate the
cluster is measured at (headroom: the cluster's rate must be well under it).

Three node processes (A, B, C; no Redis), each with `$SYS` every second, which is how the
figures are read: `swc_objects` and `swc_tombstones` per node.

- spread: N persistent subscribers (one subscription each) made on A (CONNECT, SUBSCRIBE,
  DISCONNECT; --concurrency at once); the time from the first CONNECT until B and C hold
  every record, and the rate it was made at.
- restart: C stopped (SIGTERM) and started again on its own state, after N/10 more
  subscribers were made on A meanwhile: the time from its start until it holds every
  record.
- join: a fourth node, empty, joins through A (`seeds`): the time from its start until
  it holds every record (a full copy of each group).
- idle: the CPU each node uses over 10 s with nothing happening (anti-entropy alone, at
  the default `sync_interval` of 5 s).
- tombstones: N clean clients connect, subscribe and disconnect on A (each record written,
  then deleted): the peak of tombstones on A, and the time from the last disconnect until
  every node has none (`gc_interval` 15 s).

Figures are printed as one Markdown table; raw figures go to bench/results/swc-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .brokers import BROKERS, HOST, RunningBroker, free_port, raise_fd_limit
from .client import MqttClient, open_client, subscribe
from .cluster_procs import POLL, Node, NodeConfig, ProcessError, _stop
from .raw import save_raw
from .scenarios import cpu_seconds

PROG = "python -m bench.swc"
SYSTREE = "systree_interval = 1"
# A stopped member would make the others refuse CONNECTs after dead_after (the netsplit
# switches' defaults): the restart figure makes subscribers while C is away.
SWITCHES = "".join(
    f"allow_{kind}_during_netsplit = true\n"
    for kind in ("register", "publish", "subscribe", "unsubscribe")
)
READY_TIMEOUT = 30.0
CONVERGE_TIMEOUT = 300.0
ATTEMPTS = 3  # tries to make one subscriber (make_subscribers)


class SwcNode(Node):
    """A node of the benchmark's cluster: its cluster port fixed (the seed of the others),
    restartable on its own state."""

    def __init__(self, name: str, port: int, seeds: list[int]) -> None:
        config = NodeConfig(metadata="swc", broker=SYSTREE, cluster=SWITCHES)
        super().__init__(name, config, None, port, seeds)
        self.figures: dict[str, float] = {}  # from $SYS, kept current by a watcher
        self.watcher: MqttClient | None = None

    def start(self) -> None:
        """(Again, after stop(): a new log, a new MQTT port, links to come up.)"""
        self._seen = 0
        self.port = 0
        self.links = set()
        self.figures.clear()
        super().start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.transport.close()
            self.watcher = None
        _stop(self.proc)

    def ready(self, peers: set[str], timeout: float = CONVERGE_TIMEOUT) -> None:
        """Its MQTT port known and its links up to `peers` (a restart with a million
        records loads them first: minutes, not seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            self.scan()
            if self.port and self.links >= peers:
                return
            if time.monotonic() > deadline:
                raise ProcessError(f"node {self.label} not ready:\n{self.log_tail()}")
            time.sleep(POLL)


async def watch(node: SwcNode) -> None:
    """Follow the node's swc gauges in $SYS. (A joining node refuses a CONNECT until
    the group of its client id is copied: tried again until then.)"""
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while True:
        try:
            client = await open_client(HOST, node.port, f"watch-{node.name}-{secrets.token_hex(2)}")
            break
        except (ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(POLL)
    prefix = f"$SYS/{node.name}/swc/".encode()

    def on_message(topic: bytes, payload: bytes) -> None:
        if topic.startswith(prefix):
            node.figures[topic[len(prefix) :].decode()] = float(payload)

    client.on_message = on_message
    await subscribe(client, f"$SYS/{node.name}/swc/#", 0)
    node.watcher = client


async def until(check: Callable[[], bool], timeout: float = CONVERGE_TIMEOUT) -> float:
    """Seconds until `check()` holds (polled every 50 ms)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def make_subscribers(
    port: int, count: int, args: argparse.Namespace, prefix: str, persistent: bool
) -> float:
    """`count` clients on the broker at `port`, each CONNECT, SUBSCRIBE to a topic of its
    own, DISCONNECT, made by args.generators processes; returns the seconds it took."""
    started = time.monotonic()
    parts = args.generators
    if parts == 1:
        await _make(port, 0, count, args.concurrency, prefix, persistent)
        return time.monotonic() - started
    loop = asyncio.get_running_loop()
    bounds = [count * i // parts for i in range(parts + 1)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(parts, mp_context=spawn, initializer=raise_fd_limit) as pool:
        await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _make_part, port, first, last, args.concurrency, prefix, persistent
                )
                for first, last in itertools.pairwise(bounds)
            )
        )
    return time.monotonic() - started


def _make_part(
    port: int, first: int, last: int, concurrency: int, prefix: str, persistent: bool
) -> None:
    """One generator process's share."""
    asyncio.run(_make(port, first, last, concurrency, prefix, persistent))


async def _make(
    port: int, first: int, last: int, concurrency: int, prefix: str, persistent: bool
) -> None:
    """`concurrency` workers taking the numbers in turn: not a task per subscriber, whose
    cancelling (after one failure) took a generator's core for half an hour at 500,000."""
    numbers = iter(range(first, last))

    async def worker() -> None:
        for i in numbers:
            await _make_one(port, f"{prefix}-{i}", f"{prefix}/{i}", persistent)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _make_one(port: int, client_id: str, topic_filter: str, persistent: bool) -> None:
    """One subscriber made (CONNECT, SUBSCRIBE, DISCONNECT), tried again up to ATTEMPTS
    times: a connect that times out on a loaded machine does not end the run."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            client = await open_client(HOST, port, client_id, clean_session=not persistent)
            await subscribe(client, topic_filter, 1)
        except (OSError, TimeoutError) as exc:
            if attempt == ATTEMPTS:
                raise RuntimeError(f"{client_id}: {ATTEMPTS} attempts failed: {exc!r}") from exc
            continue
        client.transport.write(b"\xe0\x00")  # DISCONNECT
        client.transport.close()
        return


async def generator_ceiling(args: argparse.Namespace) -> int:
    """Clients per second the generators make against the null broker."""
    count = max(args.subscribers // 10, 20_000)
    with RunningBroker(BROKERS["null"]) as null:
        took = await make_subscribers(null.target.port, count, args, "cal", True)
    return round(count / took)


def progress(result: dict[str, Any]) -> None:
    """The figures so far (a long run's are not lost if a later phase fails)."""
    print(json.dumps(result), flush=True)


def objects(node: SwcNode) -> float:
    return node.figures.get("objects", -1.0)


def holds(node: SwcNode, source: SwcNode, at_least: int) -> bool:
    """`node` holds what `source` holds, and that is at least `at_least` keys (members,
    the subscribers made, and each watcher's own record while it is connected)."""
    return objects(node) == objects(source) >= at_least


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.subscribers
    ports = {name: free_port() for name in "abcd"}
    a = SwcNode("a", ports["a"], [])
    b = SwcNode("b", ports["b"], [ports["a"]])
    c = SwcNode("c", ports["c"], [ports["a"]])
    d = SwcNode("d", ports["d"], [ports["a"]])  # joins later
    nodes = [a, b, c]
    result: dict[str, Any] = {"subscribers": n, "generators": args.generators}
    result["generator_alone_per_s"] = await generator_ceiling(args)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.ready({x.name for x in nodes} - {node.name})
        for node in nodes:
            await watch(node)
        await until(lambda: all(holds(x, a, 3) for x in nodes), READY_TIMEOUT)

        # spread
        started = time.monotonic()
        made = await make_subscribers(a.port, n, args, "sub", persistent=True)
        want = 3 + n
        await until(lambda: all(holds(x, a, want) for x in nodes))
        result["spread_s"] = round(time.monotonic() - started, 2)
        result["made_per_s"] = round(n / made)
        progress(result)

        # restart with changes meanwhile
        c.stop()
        extra = max(n // 10, 1)
        await make_subscribers(a.port, extra, args, "more", persistent=True)
        want += extra
        started = time.monotonic()
        c.start()
        c.ready({"a", "b"})
        await watch(c)
        await until(lambda: holds(c, a, want))
        result["restart_s"] = round(time.monotonic() - started, 2)
        progress(result)

        if args.join:  # a new, empty node joining
            started = time.monotonic()
            d.start()
            d.ready({"a", "b", "c"})
            await watch(d)
            await until(lambda: holds(d, a, want + 1))
            result["join_s"] = round(time.monotonic() - started, 2)
            progress(result)
            nodes.append(d)

        # idle anti-entropy
        before = [cpu_seconds(x.pid) or 0.0 for x in nodes]
        await asyncio.sleep(args.idle)
        after = [cpu_seconds(x.pid) or 0.0 for x in nodes]
        result["idle_cpu"] = {
            x.name: round((y - z) / args.idle, 4)
            for x, y, z in zip(nodes, after, before, strict=True)
        }

        if args.tombstones:  # tombstones of clients that come and go
            peak = 0.0

            def track() -> bool:
                nonlocal peak
                peak = max(peak, a.figures.get("tombstones", 0.0))
                return False

            gone = await make_subscribers(a.port, n, args, "gone", persistent=False)
            result["gone_per_s"] = round(n / gone)
            for _ in range(10):
                track()
                await asyncio.sleep(0.05)
            result["tombstones_peak"] = int(peak)
            result["tombstones_gone_s"] = round(
                await until(lambda: all(x.figures.get("tombstones", 1) == 0 for x in nodes)), 2
            )
        result["objects_after"] = {x.name: int(objects(x)) for x in nodes}
    finally:
        for node in (a, b, c, d):
            node.stop()
            node.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=100, help="per generator")
    parser.add_argument("--generators", type=int, default=1, help="client-making processes")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle figure")
    parser.add_argument(
        "--no-join", dest="join", action="store_false", help="leave out the empty node joining"
    )
    parser.add_argument(
        "--no-tombstones",
        dest="tombstones",
        action="store_false",
        help="leave out the clients that come and go",
    )
    args = parser.parse_args(argv)
    raise_fd_limit()
    result = asyncio.run(run(args))
    result["date"] = time.strftime("%Y-%m-%d %H:%M %Z")
    print(json.dumps(result, indent=2))
    save_raw("swc", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
