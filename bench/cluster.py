"""`python -m bench.cluster`: what clustering costs and how fast it moves things.

    python -m bench.cluster                         # every figure, ~9 minutes on 2 cores
    python -m bench.cluster --write                 # also regenerates "## Clustering" in
                                                    # docs/performance.md
    python -m bench.cluster --only latency,propagation --seconds 1 --repeats 1
    python -m bench.cluster --only throughput --store leveldb  # nodes on LevelDB
    python -m bench.cluster --only connect --metadata swc   # the leaderless metadata,
                                                    # no Redis (--swc-sync: fsync each commit)

Figures (`--only` takes their names):
- throughput: QoS 0 and QoS 1, 16 B, 1 publisher -> 1 subscriber, bounded and flood, on
  one plain node (the baseline), on one node of a 2-node cluster, from node A to node B,
  and from A to subscribers on B and C of a 3-node cluster; delivered msg/s, the ratio to
  the plain node, the CPU of every node, and (QoS 1) messages acknowledged and never
  delivered.
- latency: QoS 1 paced at --rate msg/s, publish -> receive p50/p99, across the hop and on
  one node.
- propagation: a new subscription on B, publishes on A every 1 ms from its SUBACK: the
  delay to the first delivery, --samples times, idle and under QoS 0 load A -> B
  (bounded, and an open-loop flood).
- connect: --connects clean MQTT 3.1.1 CONNECTs (--concurrency in flight) to a plain node
  and to a node of a 2-node cluster (registered in Redis before each CONNACK); also the
  CPU-ms each process used per connect (printed, and in the raw results), which a busy
  machine distorts less than the rate.
- migration: a persistent session with --queue messages queued on node B (LevelDB store)
  reconnecting on node C: CONNECT to CONNACK, to the first and the last message, and that
  each message arrived exactly once.

Every measurement gets a fresh cluster (`python -m broker` processes, bench/cluster_procs.py)
on a private redis-server this command starts (emptied between measurements). Raw figures
go to bench/results/cluster-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testing.lifecycle import Missing, ServerError
from testing.redis_server import RedisServer

from . import compare, packets, report
from .brokers import HOST, MODES, for_mode, raise_fd_limit
from .client import MqttClient, Uniform, open_client, subscribe
from .cluster_clients import Numbered, NumberedReceiver, Prober, Ticker, connect
from .cluster_procs import Deployment, NodeConfig, ProcessError, private_redis
from .cluster_report import FIGURES, Args, figure_text, with_section
from .loadgen import Backlog, Flood, Paced, Windowed
from .raw import save_raw

PROG = "python -m bench.cluster"
PAGE = "docs/performance.md"

PAYLOAD = 16  # bytes, every figure
WINDOW = 100  # QoS 1 PUBLISHes in flight per publisher (bench.compare's)
READ_LOW_WATER = 16 * 1024  # subscribers: bytes waiting before a read (as bench.scenarios)
SETTLE = 0.3  # QoS 1: seconds without a delivery or ack before counting what was lost
SETTLE_LIMIT = 10.0  # ... at most
ROUTE_TIMEOUT = 10.0  # a subscription on another node must route within this
PROBE_INTERVAL = 0.005  # seconds between probes while waiting for a route
PROPAGATION_TIMEOUT = 10.0  # a sample with no delivery by then counts as missed
PROPAGATION_BUDGET = 30.0  # seconds of sampling per case at most (a flood slows it down)
PROPAGATION_GAP = 0.02  # seconds between samples, after the UNSUBACK
MIGRATION_STALL = 10.0  # seconds without a new message before a migration is given up
CONNACK_TIMEOUT = 120.0  # migration: the CONNACK waits for the old node to let go
ONCE_FROM = 100_000  # queue sizes from this one are measured once, whatever --repeats
KEPT_WARNINGS = 8  # node log lines (WARNING, ERROR) kept per measurement

Result = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the clients of a throughput or latency measurement sit."""

    name: str
    title: str
    nodes: int  # 0: one plain node, no cluster
    publisher: int  # node index
    subscribers: tuple[int, ...]  # node index of each subscriber


LAYOUTS = (
    Layout("plain", "one node, no cluster (baseline)", 0, 0, (0,)),
    Layout("local", "2-node cluster, both on A", 2, 0, (0,)),
    Layout("hop", "2-node cluster, A -> B", 2, 0, (1,)),
    Layout("fanout", "3-node cluster, A -> B and C", 3, 0, (1, 2)),
)
BY_LAYOUT = {layout.name: layout for layout in LAYOUTS}
LATENCY_LAYOUTS = ("plain", "local", "hop")


def parse_args(argv: list[str] | None) -> Args:
    defaults = Args()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Clustering: throughput across nodes, the hop's latency, subscription "
        "propagation, connect rate with Redis, queue migration. Starts its own redis-server "
        "and node processes.",
    )
    parser.add_argument(
        "--only", default=",".join(FIGURES), help=f"comma-separated, from {', '.join(FIGURES)}"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=defaults.seconds,
        help="measured seconds of each throughput and latency run",
    )
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="seconds")
    parser.add_argument(
        "--repeats",
        type=int,
        default=defaults.repeats,
        help="runs of each throughput, latency, connect and small migration cell (median)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=defaults.backlog,
        help="bounded mode: deliveries owed before publishers wait",
    )
    parser.add_argument("--rate", type=int, default=defaults.rate, help="latency: msg/s")
    parser.add_argument(
        "--samples", type=int, default=defaults.samples, help="propagation: samples per case"
    )
    parser.add_argument("--connects", type=int, default=defaults.connects, help="connect: clients")
    parser.add_argument(
        "--concurrency", type=int, default=defaults.concurrency, help="connect: in flight"
    )
    parser.add_argument(
        "--queue",
        default=",".join(str(n) for n in defaults.queue),
        help=f"migration: queued messages, comma-separated (from {ONCE_FROM:,} measured once)",
    )
    parser.add_argument(
        "--metadata",
        choices=("redis", "swc"),
        default=defaults.metadata,
        help="the clusters' metadata: Redis (default), or the leaderless swc (no Redis)",
    )
    parser.add_argument(
        "--store",
        choices=("memory", "leveldb"),
        default=defaults.store,
        help="the nodes' store for throughput and latency (leveldb: sync = false)",
    )
    parser.add_argument(
        "--swc-sync",
        action="store_true",
        help="with --metadata swc: [cluster.swc] sync = true (an fsync per commit)",
    )
    parser.add_argument(
        "--write",
        nargs="?",
        const=PAGE,
        metavar="PATH",
        help=f"regenerate the '## Clustering' section of PATH (default {PAGE})",
    )
    ns = parser.parse_args(argv)
    only = [name for name in ns.only.split(",") if name]
    unknown = set(only) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure: {', '.join(sorted(unknown))}")
    try:
        queue = [int(n.replace("_", "")) for n in ns.queue.split(",") if n]
    except ValueError:
        parser.error(f"--queue: expected numbers, got {ns.queue!r}")
    if ns.repeats < 1 or ns.seconds <= 0 or ns.samples < 1 or ns.connects < 1:
        parser.error("--repeats, --seconds, --samples and --connects must be positive")
    return Args(
        seconds=ns.seconds,
        warmup=ns.warmup,
        repeats=ns.repeats,
        backlog=ns.backlog,
        rate=ns.rate,
        samples=ns.samples,
        connects=ns.connects,
        concurrency=ns.concurrency,
        queue=queue,
        only=[name for name in FIGURES if name in only],
        write=ns.write,
        metadata=ns.metadata,
        swc_sync=ns.swc_sync,
        store=ns.store,
        argv=sys.argv[1:] if argv is None else list(argv),
    )


# -- the run ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:

    args = parse_args(argv)
    raise_fd_limit()
    # Ctrl-C and SIGTERM stop the run; every process started is stopped on the way out.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, compare._interrupt)
    command = shlex.join([*PROG.split(), *args.argv])
    date = time.strftime("%Y-%m-%d %H:%M %Z")
    busy = report.cpu_busy()
    if busy > 0.1:
        print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
    machine0, own0 = report.cpu_seconds()
    started = time.monotonic()
    raw: dict[str, list[Result]] = {}
    texts: dict[str, str] = {}
    try:
        with private_redis() as redis_server:
            for figure in args.only:
                FIGURE_RUNS[figure](args, redis_server, raw)
                texts[figure] = figure_text(figure, args, raw, command, date)
                print(texts[figure], flush=True)
    except (Missing, ServerError) as exc:  # redis-server not installed, or not starting
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every process started has been stopped", file=sys.stderr)
        _save_raw(raw, {"command": command, "date": date, "interrupted": True})
        return 130
    machine1, own1 = report.cpu_seconds()
    elapsed = time.monotonic() - started
    others = (machine1 - machine0 - (own1 - own0)) / elapsed
    meta = {
        "command": command,
        "date": date,
        "machine": report.machine(_versions())
        | {
            "CPU busy before the run": f"{busy:.0%}",
            "Other processes during the run": f"{others:.2f} CPUs on average",
        },
        "elapsed_s": round(elapsed),
    }
    _save_raw(raw, meta)
    print(f"whole run: {elapsed:.0f} s", file=sys.stderr)
    if args.write:
        path = Path(args.write)
        page = path.read_text() if path.exists() else ""
        path.write_text(with_section(page, meta, texts))
        print(f"wrote the Clustering section of {path}", file=sys.stderr)
    return 0


def _versions() -> dict[str, str]:
    nautilus = for_mode(MODES["bounded"])["nautilus"].version()
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout
        version = next((w[2:] for w in out.split() if w.startswith("v=")), "unknown")
    except OSError:
        version = "not installed"
    return {"Nautilus version": nautilus, "redis-server version": version}


def _save_raw(raw: dict[str, list[Result]], meta: dict[str, Any]) -> None:
    if not raw:
        return
    save_raw("cluster", {"meta": meta, "cells": raw})


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """On a fresh event loop, uvloop when installed (as bench.compare does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def node_config(args: Args, mode: str = "bounded", base: NodeConfig | None = None) -> NodeConfig:
    """The nodes' config for a figure, with the run's metadata backend."""
    config = base if base is not None else NodeConfig(mode=mode, store=args.store)
    return dataclasses.replace(config, metadata=args.metadata, swc_sync=args.swc_sync)


def _deployed(
    nodes: int,
    config: NodeConfig,
    redis_server: RedisServer,
    work: Callable[[Deployment], Coroutine[Any, Any, Result]],
    names: Sequence[str] = ("a", "b", "c"),
) -> Result:
    """`work` against a fresh deployment; its result, with what went wrong on the way."""
    try:
        with Deployment(nodes, config, redis_server, names) as deployment:
            try:
                result = _run(work(deployment))
            except (OSError, TimeoutError, ConnectionError, RuntimeError) as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
            result["startup_s"] = round(deployment.startup, 3)
            if (dead := deployment.dead()) is not None:
                result["error"] = dead
            if warnings := deployment.warnings():
                result["node_warnings"] = warnings[:KEPT_WARNINGS] + (
                    [f"... {len(warnings) - KEPT_WARNINGS} more"]
                    if len(warnings) > KEPT_WARNINGS
                    else []
                )
    except (ProcessError, OSError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def _progress(figure: str, cell: str, result: Result, keys: Sequence[str]) -> None:
    parts = []
    for key in keys:
        value = result.get(key)
        if isinstance(value, float):
            parts.append(f"{key} {value:,.2f}")
        elif value is not None:
            parts.append(f"{key} {value}")
    cpu = result.get("cpu")
    if cpu:
        parts.append("cpu " + " ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    error = f"  ERROR {result['error']}" if result.get("error") else ""
    print(f"{figure:<12} {cell:<24} {'  '.join(parts)}{error}", file=sys.stderr, flush=True)


# -- measuring helpers ------------------------------------------------------------------


class Meter:
    """CPU of every process of a deployment and of this one, between two readings."""

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self._labels = [node.label for node in deployment.nodes]
        if deployment.redis is not None and deployment.nodes[0].name:
            self._labels.append("redis")
        self._start = self._read()

    def _read(self) -> tuple[float, float, list[float | None]]:
        return time.perf_counter(), time.process_time(), self._deployment.cpu()

    def cores(self) -> dict[str, float]:
        """Cores used since the start: each node, Redis (clustered), the generator."""
        elapsed, used = self.seconds()
        return {label: round(seconds / max(elapsed, 1e-9), 3) for label, seconds in used.items()}

    def seconds(self) -> tuple[float, dict[str, float]]:
        """Seconds since the start, and the CPU-seconds each process used meanwhile."""
        t0, own0, cpu0 = self._start
        t1, own1, cpu1 = self._read()
        used = {}
        for label, a, b in zip(self._labels, cpu0, cpu1, strict=False):
            if a is not None and b is not None:
                used[label] = b - a
        used["generator"] = own1 - own0
        return t1 - t0, used


async def _until_routed(pub: MqttClient, subs: list[MqttClient], topic: str) -> float:
    """Publish QoS 0 probes on `topic` until every subscriber got one: the subscription
    reached the publisher's node. Returns the seconds it took."""
    probe = packets.publish(topic, packets.payload_of(PAYLOAD))
    started = time.perf_counter()
    deadline = started + ROUTE_TIMEOUT
    while any(sub.received == 0 for sub in subs):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no delivery on {topic!r} within {ROUTE_TIMEOUT:.0f} s")
        pub.transport.write(probe)
        await asyncio.sleep(PROBE_INTERVAL)
    routed = time.perf_counter() - started
    await asyncio.sleep(0.2)  # the last probes arrive before counting starts
    return routed


def _total(clients: Sequence[MqttClient]) -> int:
    return sum(client.received for client in clients)


def _close(clients: Sequence[MqttClient]) -> None:
    for client in clients:
        if client.transport is not None and not client.transport.is_closing():
            client.transport.abort()


def _percentile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- 1. throughput ----------------------------------------------------------------------


def run_throughput(args: Args, redis_server: RedisServer, raw: dict[str, list[Result]]) -> None:
    cells = [
        (layout, qos, mode) for qos in (0, 1) for mode in ("bounded", "flood") for layout in LAYOUTS
    ]
    for _ in range(args.repeats):
        for layout, qos, mode in cells:
            key = f"throughput/{layout.name}/qos{qos}/{mode}"

            async def work(
                d: Deployment, layout: Layout = layout, qos: int = qos, mode: str = mode
            ) -> Result:
                return await _throughput(d, layout, qos, mode == "bounded", args)

            result = _deployed(
                layout.nodes,
                node_config(args, mode=mode),
                redis_server,
                work,
            )
            raw.setdefault(key, []).append(result)
            _progress("throughput", key.partition("/")[2], result, ("delivered", "lost"))


async def _throughput(d: Deployment, layout: Layout, qos: int, bounded: bool, args: Args) -> Result:
    topic = "bench/cluster"
    payload = packets.payload_of(PAYLOAD)
    uniform = Uniform.publish(topic, payload, qos)
    fanout = len(layout.subscribers)
    limit = args.backlog if bounded else 0
    clients: list[MqttClient] = []
    try:
        subs = []
        for k, index in enumerate(layout.subscribers):
            sub = await open_client(HOST, d[index].port, f"sub{k}", uniform=uniform)
            clients.append(sub)
            await subscribe(sub, topic, qos)
            subs.append(sub)
        pub_uniform = Uniform.puback() if qos else None
        pub = await open_client(HOST, d[layout.publisher].port, "pub", uniform=pub_uniform)
        clients.append(pub)
        routed = await _until_routed(pub, subs, topic)
        base = _total(subs)
        if qos:
            mark = min(READ_LOW_WATER, WINDOW * uniform.size // 8)
        else:
            mark = min(READ_LOW_WATER, limit * uniform.size // (4 * fanout)) or READ_LOW_WATER
        for sub in subs:
            sub.read_in_bulk(mark)
        backlog = Backlog(subs, fanout, limit)
        if qos:
            pub.read_in_bulk(WINDOW * Uniform.puback().size // 8)
            Windowed(pub, packets.publish_ring(topic, payload), WINDOW, backlog)
        else:
            Flood(pub, topic, payload, backlog)
        for publisher in backlog.publishers:
            publisher.start()
        await asyncio.sleep(args.warmup)
        meter = Meter(d)
        received0, accepted0, t0 = _total(subs), backlog.accepted(), time.perf_counter()
        await asyncio.sleep(args.seconds)
        received1, accepted1, t1 = _total(subs), backlog.accepted(), time.perf_counter()
        cpu = meter.cores()
        for publisher in backlog.publishers:
            publisher.stop()
        lost = await _lost(subs, pub, fanout, base) if qos else None
    finally:
        _close(clients)
    elapsed = t1 - t0
    return {
        "delivered": (received1 - received0) / elapsed,
        "accepted": (accepted1 - accepted0) / elapsed,
        "fanout": fanout,
        "lost": lost,
        "routed_s": round(routed, 4),
        "cpu": cpu,
    }


async def _lost(subs: list[MqttClient], pub: MqttClient, fanout: int, base: int) -> int:
    """Once the publisher has stopped: deliveries owed for every PUBACK it received that
    never arrived, after SETTLE seconds without a delivery or an ack."""
    for client in [*subs, pub]:  # the last few packets may be fewer bytes than the mark
        if not client.transport.is_closing():
            client.read_in_bulk(1)
    deadline = time.perf_counter() + SETTLE_LIMIT
    last = (-1, -1)
    while time.perf_counter() < deadline:
        now = (_total(subs), pub.acked)
        if now == last:
            break
        last = now
        await asyncio.sleep(SETTLE)
    return max(0, pub.acked * fanout - (_total(subs) - base))


# -- 2. latency -------------------------------------------------------------------------


def run_latency(args: Args, redis_server: RedisServer, raw: dict[str, list[Result]]) -> None:
    for _ in range(args.repeats):
        for name in LATENCY_LAYOUTS:
            layout = BY_LAYOUT[name]
            key = f"latency/{name}"

            async def work(d: Deployment, layout: Layout = layout) -> Result:
                return await _latency(d, layout, args)

            result = _deployed(
                layout.nodes,
                node_config(args),
                redis_server,
                work,
            )
            raw.setdefault(key, []).append(result)
            _progress("latency", name, result, ("p50_ms", "p99_ms", "delivered"))


async def _latency(d: Deployment, layout: Layout, args: Args) -> Result:
    topic = "bench/latency"
    latencies: list[int] = []
    clients: list[MqttClient] = []
    try:
        sub = await open_client(HOST, d[layout.subscribers[0]].port, "lat-sub")
        clients.append(sub)
        await subscribe(sub, topic, 1)
        pub = await open_client(HOST, d[layout.publisher].port, "lat-pub", uniform=Uniform.puback())
        clients.append(pub)
        await _until_routed(pub, [sub], topic)
        sub.latencies = latencies  # from now on every payload starts with its send time
        pump = Paced(pub, topic, PAYLOAD, args.rate, WINDOW)
        pump.start()
        await asyncio.sleep(args.warmup)
        meter = Meter(d)
        first, t0 = len(latencies), time.perf_counter()
        await asyncio.sleep(args.seconds)
        last, t1 = len(latencies), time.perf_counter()
        cpu = meter.cores()
        pump.stop()
    finally:
        _close(clients)
    window = sorted(latencies[first:last])
    if not window:
        return {"error": "no message delivered", "cpu": cpu}
    return {
        "delivered": len(window) / (t1 - t0),
        "p50_ms": _percentile(window, 0.50) / 1e6,
        "p99_ms": _percentile(window, 0.99) / 1e6,
        "max_ms": window[-1] / 1e6,
        "cpu": cpu,
    }


# -- 3. subscription propagation ---------------------------------------------------------


PROPAGATION_CASES = ("idle", "bounded", "flood")


def run_propagation(args: Args, redis_server: RedisServer, raw: dict[str, list[Result]]) -> None:
    for case in PROPAGATION_CASES:
        key = f"propagation/{case}"

        async def work(d: Deployment, case: str = case) -> Result:
            return await _propagation(d, args, case)

        # The load's mode sets the queue limits, as in the throughput figure.
        mode = "flood" if case == "flood" else "bounded"
        result = _deployed(
            2,
            node_config(args, mode=mode),
            redis_server,
            work,
        )
        raw.setdefault(key, []).append(result)
        _progress("propagation", case, result, ("samples", "missed", "p50_ms", "p99_ms", "max_ms"))


async def _propagation(d: Deployment, args: Args, case: str) -> Result:
    """`case`: "idle", or with QoS 0 load from another client on A to another on B,
    "bounded" (paused while the backlog bound of deliveries are owed) or "flood"."""
    clients: list[MqttClient] = []
    run = secrets.token_hex(3)
    try:
        sub, _ = await connect(Prober, HOST, d[1].port, f"prop-sub-{run}")
        clients.append(sub)
        pub = await open_client(HOST, d[0].port, f"prop-pub-{run}")
        clients.append(pub)
        load_sub = None
        if case != "idle":
            topic = "bench/load"
            payload = packets.payload_of(PAYLOAD)
            uniform = Uniform.publish(topic, payload, 0)
            load_sub = await open_client(HOST, d[1].port, "load-sub", uniform=uniform)
            clients.append(load_sub)
            await subscribe(load_sub, topic, 0)
            load_pub = await open_client(HOST, d[0].port, "load-pub")
            clients.append(load_pub)
            await _until_routed(load_pub, [load_sub], topic)
            limit = args.backlog if case == "bounded" else 0
            mark = min(READ_LOW_WATER, limit * uniform.size // 4) or READ_LOW_WATER
            load_sub.read_in_bulk(mark)
            load = Backlog([load_sub], 1, limit)
            Flood(load_pub, topic, payload, load)
            for publisher in load.publishers:
                publisher.start()
            await asyncio.sleep(args.warmup)
        meter = Meter(d)
        load0, t0 = (load_sub.received if load_sub else 0), time.perf_counter()
        delays: list[float] = []
        ticks: list[int] = []
        missed = 0
        budget = t0 + PROPAGATION_BUDGET
        for i in range(args.samples):
            if time.perf_counter() > budget:
                break
            delay, sent = await _one_propagation(sub, pub, f"prop/{run}/{i}")
            if delay is None:
                missed += 1
            else:
                delays.append(delay)
                ticks.append(sent)
            await asyncio.sleep(PROPAGATION_GAP)
        load1, t1 = (load_sub.received if load_sub else 0), time.perf_counter()
        cpu = meter.cores()
    finally:
        _close(clients)
    ordered = sorted(delays)
    result: Result = {"samples": len(delays), "missed": missed, "cpu": cpu}
    if len(delays) + missed < args.samples:
        result["cut_short"] = (
            f"{len(delays) + missed} of {args.samples} samples within the "
            f"{PROPAGATION_BUDGET:.0f} s budget"
        )
    if load_sub is not None:
        result["load_delivered"] = (load1 - load0) / (t1 - t0)
    if ordered:
        result |= {
            "p50_ms": _percentile(ordered, 0.50),
            "p99_ms": _percentile(ordered, 0.99),
            "max_ms": ordered[-1],
            "min_ms": ordered[0],
            "publishes_p50": statistics.median(ticks),
        }
    result["delays_ms"] = [round(x, 3) for x in delays]
    return result


async def _one_propagation(sub: Prober, pub: MqttClient, topic: str) -> tuple[float | None, int]:
    """Subscribe on `sub`'s node and publish from `pub`'s every 1 ms from the SUBACK on:
    (ms from the SUBACK to the first delivery or None if none came, publishes sent)."""
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[int] = loop.create_future()
    wanted = topic.encode()

    def on_message(received: bytes, payload: bytes) -> None:
        if received == wanted and not arrived.done():
            arrived.set_result(time.monotonic_ns())

    ticker = Ticker(pub, packets.publish(topic, b"p"))
    sub.on_message = on_message
    sub.on_suback = ticker.start  # the first PUBLISH goes out as the SUBACK is read
    try:
        await asyncio.wait_for(sub.send_subscribe(topic), 10.0)
        at = await asyncio.wait_for(arrived, PROPAGATION_TIMEOUT)
        delay: float | None = (at - sub.suback_ns) / 1e6
    except TimeoutError:
        delay = None
    finally:
        ticker.stop()
        sub.on_suback = None
        sub.on_message = None
    await sub.unsubscribe(topic)
    return delay, ticker.sent


# -- 4. connect rate ---------------------------------------------------------------------


def run_connect(args: Args, redis_server: RedisServer, raw: dict[str, list[Result]]) -> None:
    for _ in range(args.repeats):
        for name, nodes in (("plain", 0), ("cluster", 2)):
            key = f"connect/{name}"

            async def work(d: Deployment) -> Result:
                return await _connects(d, args)

            result = _deployed(
                nodes,
                node_config(args),
                redis_server,
                work,
            )
            raw.setdefault(key, []).append(result)
            _progress("connect", name, result, ("rate", "p50_ms", "p99_ms", "connected"))
            if per_connect := result.get("cpu_ms_per_connect"):
                figures = " ".join(f"{label} {ms:.3f}" for label, ms in per_connect.items())
                print(f"{'':<12} {'':<24} cpu-ms per connect {figures}", file=sys.stderr)


async def _connects(d: Deployment, args: Args) -> Result:
    clients: list[MqttClient] = []
    times: list[float] = []
    failures: list[str] = []
    gate = asyncio.Semaphore(args.concurrency)
    run = secrets.token_hex(3)
    port = d[0].port
    last = started = 0.0

    async def one(i: int) -> None:
        nonlocal last
        async with gate:
            began = time.perf_counter()
            try:
                clients.append(await open_client(HOST, port, f"conn-{run}-{i}"))
            except (OSError, TimeoutError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            last = time.perf_counter()
            times.append(last - began)

    meter = Meter(d)
    last = started = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(args.connects)))
        elapsed, used = meter.seconds()
    finally:
        _close(clients)
    ordered = sorted(times)
    connected = max(len(clients), 1)
    result: Result = {
        "connected": len(clients),
        "rate": len(clients) / max(last - started, 1e-9),
        "cpu": {label: round(seconds / max(elapsed, 1e-9), 3) for label, seconds in used.items()},
        # CPU-ms each process used per CONNACK: what other work on the machine changes
        # least (it slows the rate, not the work done per connect).
        "cpu_ms_per_connect": {
            label: round(seconds * 1000 / connected, 3) for label, seconds in used.items()
        },
    }
    if ordered:
        result["p50_ms"] = _percentile(ordered, 0.50) * 1000
        result["p99_ms"] = _percentile(ordered, 0.99) * 1000
    if failures:
        result["error"] = f"{len(failures)} of {args.connects} failed (first: {failures[0]})"
    return result


# -- 5. queue migration ------------------------------------------------------------------

MIGRATION_CONFIG = NodeConfig(store="leveldb", broker="max_offline_messages = -1")


def run_migration(args: Args, redis_server: RedisServer, raw: dict[str, list[Result]]) -> None:
    for size in args.queue:
        repeats = 1 if size >= ONCE_FROM else args.repeats
        key = f"migration/{size}"
        for _ in range(repeats):

            async def work(d: Deployment, size: int = size) -> Result:
                return await _migration(d, size)

            config = node_config(args, base=MIGRATION_CONFIG)
            result = _deployed(2, config, redis_server, work, names=("b", "c"))
            raw.setdefault(key, []).append(result)
            _progress(
                "migration",
                f"{size:,}",
                result,
                ("fill_s", "connack_ms", "first_ms", "last_s", "missing", "duplicates"),
            )


async def _migration(d: Deployment, count: int) -> Result:
    """A persistent session with `count` queued messages on B, resumed on C."""
    topic = "bench/migration"
    client_id = f"mover-{secrets.token_hex(3)}"
    clients: list[MqttClient] = []
    try:
        # The session: subscribed on B at QoS 1, then offline.
        holder = await open_client(HOST, d[0].port, client_id, clean_session=False)
        clients.append(holder)
        await subscribe(holder, topic, 1)
        holder.transport.write(b"\xe0\x00")  # DISCONNECT: the broker closes the connection
        deadline = time.perf_counter() + 10.0
        while not holder.transport.is_closing() and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        # Its queue: `count` numbered QoS 1 messages published on B, every one acknowledged.
        filler = await open_client(HOST, d[0].port, "filler", uniform=Uniform.puback())
        clients.append(filler)
        began = time.perf_counter()
        numbered = Numbered(filler, topic, count, PAYLOAD, WINDOW)
        numbered.start()
        await asyncio.wait_for(numbered.done, max(60.0, count / 2000))
        fill = time.perf_counter() - began
        _close([filler])
        await asyncio.sleep(0.2)
        # The session resumed on C.
        meter = Meter(d)
        receiver, connack = await connect(
            lambda: NumberedReceiver(topic, count, PAYLOAD),
            HOST,
            d[1].port,
            client_id,
            clean_session=False,
            timeout=CONNACK_TIMEOUT,
        )
        sent = receiver.connack_at - connack  # when the CONNECT was written
        clients.append(receiver)
        last_progress, seen = time.perf_counter(), 0
        while receiver.distinct < count:
            await asyncio.sleep(0.05)
            if receiver.distinct != seen:
                seen, last_progress = receiver.distinct, time.perf_counter()
            elif time.perf_counter() - last_progress > MIGRATION_STALL:
                break
            if receiver.transport.is_closing():
                break
        cpu = meter.cores()
        await asyncio.sleep(0.5)  # duplicates would come now
    finally:
        _close(clients)
    result: Result = {
        "queued": count,
        "fill_s": round(fill, 3),
        "fill_rate": count / fill,
        "session_present": receiver.session_present,
        "connack_ms": connack * 1000,
        "received": receiver.received,
        "distinct": receiver.distinct,
        "missing": receiver.missing(),
        "duplicates": receiver.duplicates,
        "out_of_order": receiver.out_of_order,
        "strays": receiver.strays,
        "cpu": cpu,
    }
    if receiver.first_at:
        result["first_ms"] = (receiver.first_at - sent) * 1000
    if receiver.last_new_at:
        result["last_s"] = receiver.last_new_at - sent
        after_connack = receiver.last_new_at - (sent + connack)
        result["rate"] = receiver.distinct / max(after_connack, 1e-9)
    if not receiver.session_present:
        result["error"] = "CONNACK without session present"
    if receiver.missing():
        result["error"] = (
            f"{receiver.missing():,} of {count:,} queued messages never arrived "
            f"(no new one for {MIGRATION_STALL:.0f} s)"
        )
    return result


FIGURE_RUNS: dict[str, Callable[[Args, RedisServer, dict[str, list[Result]]], None]] = {
    "throughput": run_throughput,
    "latency": run_latency,
    "propagation": run_propagation,
    "connect": run_connect,
    "migration": run_migration,
}


if __name__ == "__main__":
    sys.exit(main())
