"""Soak: a Nautilus broker on a LevelDB store under churn for minutes or hours.

    python -m bench.soak                                  # 5 minutes, a restart every 60 s
    python -m bench.soak --duration 14400 --restart-every 600

Client processes (`--workers`) each run `--persistent` clients with clean session off and
`--clean` clients with clean session on, every one of them in a loop (`--pause` seconds
apart, so that the broker is loaded but not saturated): CONNECT, publish
`--messages` QoS 1 messages (a persistent client to its own topic, so they go through its
session; a clean one to a persistent client's topic, where they wait in the store while
that client is offline), wait for the PUBACKs (and a persistent client for its own
messages), DISCONNECT. The broker is restarted (SIGTERM, then started again on the same
store) every `--restart-every` seconds, half a period out of step with the report, so that
every reported minute holds one restart. Each `--interval` it prints one row: CONNACK
latency (median, p90; from CONNECT written to CONNACK read), connects/s, QoS 1 messages/s
acknowledged to publishers and delivered to subscribers, the broker's RSS and the store's
size on disk. At the end: whether the last interval is within 1.5x of the first (CONNACK
median and p90 no more than 1.5 times, connects/s and messages/s no less than 1/1.5).

The work a broker does per connection must not grow with the history of its store (every
message that went through it leaves deleted keys behind until LevelDB compacts them): a
broker that passes keeps its first minute's figures for hours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from bench import packets
from bench.brokers import HOST, MODES, child_env, free_port, nautilus_toml, raise_fd_limit
from bench.client import MqttClient
from bench.scenarios import rss_kib

RATIO = 1.5  # the last interval may be this much worse than the first
TIMEOUT = 10.0  # the longest one step of a client waits (CONNACK, SUBACK, PUBACKs)
RETRY = 0.05  # seconds a client waits before it connects again after a failure
READY_TIMEOUT = 30.0  # seconds a (re)started broker has to listen


# --------------------------------------------------------------------------- the broker


class SoakBroker:
    """`python -m broker` on one port and one LevelDB store, across restarts."""

    def __init__(self, workdir: Path, sync: bool, mountpoint: str = "") -> None:
        self.port = free_port()
        self.store = workdir / "store"
        self.config = workdir / "nautilus.toml"
        table = f'backend = "leveldb"\npath = "{self.store}"\nsync = {str(sync).lower()}'
        text = nautilus_toml(MODES["bounded"], table).format(host=HOST, port=self.port)
        if mountpoint:  # every session, queue and retained key is then the tree's
            listen = f'address = "{HOST}:{self.port}"'
            text = text.replace(listen, f'{listen}\nmountpoint = "{mountpoint}"')
        self.config.write_text(text)
        self.log = workdir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it; the seconds until it accepts connections."""
        started = time.monotonic()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "--config", str(self.config)],
                env=child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=raise_fd_limit,
            )
        deadline = started + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited with {self.proc.returncode}: {self.log}")
            try:
                socket.create_connection((HOST, self.port), timeout=0.5).close()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"the broker does not listen after {READY_TIMEOUT:.0f} s: {self.log}")

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> float:
        """Stop and start again on the same store: the seconds it could not be reached."""
        started = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - started

    def rss_mib(self) -> float | None:
        kib = rss_kib(self.proc.pid if self.proc is not None else None)
        return None if kib is None else kib / 1024

    def store_mib(self) -> float:
        total = 0
        for root, _, files in os.walk(self.store):
            for name in files:
                with contextlib.suppress(OSError):  # a file LevelDB just deleted
                    total += os.path.getsize(os.path.join(root, name))
        return total / (1 << 20)


# --------------------------------------------------------------------------- the clients


@dataclass
class Tally:
    """What one worker's clients did since its last report."""

    connack_ms: list[float] = field(default_factory=list)
    connects: int = 0  # CONNACKs received
    acked: int = 0  # PUBACKs received by publishers
    delivered: int = 0  # PUBLISHes received by the persistent clients
    failures: int = 0  # connections refused or cut short (the broker restarting), retried

    def add(self, other: Tally) -> None:
        self.connack_ms += other.connack_ms
        self.connects += other.connects
        self.acked += other.acked
        self.delivered += other.delivered
        self.failures += other.failures


class Board:
    """The tally the clients of a worker write into, swapped for a new one each second."""

    def __init__(self) -> None:
        self.tally = Tally()

    def take(self) -> Tally:
        tally, self.tally = self.tally, Tally()
        return tally


@dataclass(frozen=True)
class Load:
    port: int
    persistent: int  # clients per worker
    clean: int  # clients per worker
    messages: int  # QoS 1 messages published per connection
    payload: bytes
    pause: float  # seconds between a client's connections (on average)


class SoakClient(MqttClient):
    """The generator's client, waking its session when a PUBACK or a PUBLISH arrives or
    the connection ends (no polling: the generator must not eat the broker's CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()
        self.lost = False
        self.on_ack = self.on_delivery = self.changed.set

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost = True
        self.changed.set()


async def wait_until(done: Callable[[], bool], client: SoakClient, timeout: float) -> None:
    """Until `done()`, the connection's end or the timeout."""
    deadline = time.monotonic() + timeout
    while not done():
        if client.lost:
            raise ConnectionError("connection closed")
        client.changed.clear()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer in time")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client.changed.wait(), remaining)


async def session(
    load: Load, client_id: str, clean: bool, topic: str, board: Board, subscribe: bool
) -> None:
    """One connection: CONNECT, (SUBSCRIBE,) publish and wait for the PUBACKs (and, for a
    persistent client, for its own messages), DISCONNECT."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(SoakClient, HOST, load.port), TIMEOUT)
    try:
        started = time.perf_counter()
        client.transport.write(packets.connect(client_id, clean_session=clean))
        code = await asyncio.wait_for(client.connack, TIMEOUT)
        if code is None:
            raise ConnectionError("connection closed before CONNACK")
        if code:
            raise ConnectionError(f"CONNACK return code {code}")
        board.tally.connack_ms.append((time.perf_counter() - started) * 1000)
        board.tally.connects += 1
        if subscribe:
            client.transport.write(packets.subscribe(topic, 1))
            if await asyncio.wait_for(client.suback, TIMEOUT) is None:
                raise ConnectionError("connection closed before SUBACK")
        queued = client.received  # what waited for it arrives first (and on, meanwhile)
        client.transport.write(
            b"".join(
                packets.publish(topic, load.payload, 1, packet_id=i)
                for i in range(1, load.messages + 1)
            )
        )
        await wait_until(lambda: client.acked >= load.messages, client, TIMEOUT)
        board.tally.acked += client.acked
        if not clean:  # its own messages come back to it through its session
            await wait_until(lambda: client.received - queued >= load.messages, client, TIMEOUT)
        client.transport.write(b"\xe0\x00")  # DISCONNECT
    finally:
        board.tally.delivered += client.received
        client.transport.close()


async def client_loop(
    load: Load, client_id: str, clean: bool, topics: list[str], board: Board, stop: EventType
) -> None:
    subscribed = False  # a persistent client subscribes once; its session keeps it
    while not stop.is_set():
        topic = random.choice(topics)
        try:
            await session(load, client_id, clean, topic, board, not clean and not subscribed)
            subscribed = not clean
        except (OSError, ConnectionError, TimeoutError):
            board.tally.failures += 1
            await asyncio.sleep(RETRY)
            continue
        await asyncio.sleep(load.pause * random.uniform(0.5, 1.5))  # out of step


async def worker_main(load: Load, worker: int, reports: Any, stop: EventType) -> None:
    board = Board()
    topics = [f"soak/{worker}/{i}" for i in range(load.persistent)]
    loops = [
        client_loop(load, f"soak-p-{worker}-{i}", False, [topic], board, stop)
        for i, topic in enumerate(topics)
    ]
    loops += [
        client_loop(load, f"soak-c-{worker}-{i}", True, topics, board, stop)
        for i in range(load.clean)
    ]
    tasks = [asyncio.ensure_future(coroutine) for coroutine in loops]
    while not stop.is_set():
        await asyncio.sleep(1.0)
        reports.put(board.take())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def worker(load: Load, index: int, reports: Any, stop: EventType) -> None:
    """A client process: its clients on one event loop (uvloop when there is one)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    try:
        import uvloop

        uvloop.run(worker_main(load, index, reports, stop))
    except ImportError:
        asyncio.run(worker_main(load, index, reports, stop))


# --------------------------------------------------------------------------- the report


@dataclass
class Row:
    minute: int
    seconds: float
    tally: Tally
    rss_mib: float | None
    store_mib: float
    restarts: list[float]  # seconds the broker was away, per restart in the interval

    def percentile(self, share: float) -> float:
        values = sorted(self.tally.connack_ms)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(len(values) * share))]

    @property
    def median(self) -> float:
        values = self.tally.connack_ms
        return statistics.median(values) if values else float("nan")

    def rate(self, count: int) -> float:
        return count / self.seconds if self.seconds else 0.0


HEADER = (
    "| minute | CONNACK median ms | CONNACK p90 ms | connects/s | QoS 1 msg/s acked | "
    "msg/s delivered | failed attempts | broker RSS MiB | store MiB | restart (s) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def line(row: Row) -> str:
    tally = row.tally
    rss = "-" if row.rss_mib is None else f"{row.rss_mib:.0f}"
    restarts = ", ".join(f"{s:.1f}" for s in row.restarts) or "-"
    return (
        f"| {row.minute} | {row.median:.2f} | {row.percentile(0.9):.2f} | "
        f"{row.rate(tally.connects):,.0f} | {row.rate(tally.acked):,.0f} | "
        f"{row.rate(tally.delivered):,.0f} | {tally.failures} | {rss} | "
        f"{row.store_mib:.1f} | {restarts} |"
    )


def verdict(first: Row, last: Row) -> tuple[bool, str]:
    """Whether `last` is within RATIO of `first`, and the ratios that say so."""
    ratios = {
        "CONNACK median": last.median / first.median,
        "CONNACK p90": last.percentile(0.9) / first.percentile(0.9),
        "connects/s": last.rate(last.tally.connects) / max(first.rate(first.tally.connects), 1e-9),
        "msg/s": last.rate(last.tally.acked) / max(first.rate(first.tally.acked), 1e-9),
    }
    within = (
        ratios["CONNACK median"] <= RATIO
        and ratios["CONNACK p90"] <= RATIO
        and ratios["connects/s"] >= 1 / RATIO
        and ratios["msg/s"] >= 1 / RATIO
    )
    said = ", ".join(f"{name} {value:.2f}x" for name, value in ratios.items())
    return within, said


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        broker = SoakBroker(Path(tmp), args.sync, args.mountpoint)
        broker.start()
        load = Load(
            broker.port,
            args.persistent,
            args.clean,
            args.messages,
            b"x" * args.payload,
            args.pause,
        )
        context = multiprocessing.get_context("spawn")
        reports = context.Queue()
        stop = context.Event()
        workers = [
            context.Process(target=worker, args=(load, i, reports, stop), daemon=True)
            for i in range(args.workers)
        ]
        for process in workers:
            process.start()
        for _ in workers:  # every process runs its clients before the clock starts
            reports.get(timeout=60)
        print(
            f"soak: {args.workers} client processes x ({args.persistent} persistent + "
            f"{args.clean} clean clients), {args.messages} QoS 1 messages per connection, "
            f"{args.pause} s between a client's connections, "
            f"restart every {args.restart_every:.0f} s, {args.duration:.0f} s "
            f"(store: {broker.store}, sync = {str(args.sync).lower()})",
            flush=True,
        )
        print(HEADER, flush=True)
        rows: list[Row] = []
        try:
            rows = measure(args, broker, reports)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
        finally:
            stop.set()
            for process in workers:
                process.join(5)
                if process.is_alive():
                    process.terminate()
            broker.stop()
    if len(rows) < 2:
        print("too short for a verdict: at least two intervals are needed")
        return 1
    within, said = verdict(rows[0], rows[-1])
    outcome = "within" if within else "NOT within"
    print(f"last interval against the first: {said}: {outcome} {RATIO}x")
    return 0 if within else 1


def measure(args: argparse.Namespace, broker: SoakBroker, reports: Any) -> list[Row]:
    start = time.monotonic()
    end = start + args.duration
    next_row = start + args.interval
    next_restart = start + args.restart_every / 2 if args.restart_every else float("inf")
    tally, restarts = Tally(), []
    rows: list[Row] = []
    row_start = start
    while True:
        now = time.monotonic()
        if now >= next_restart and now < end:
            restarts.append(broker.restart())
            next_restart += args.restart_every
            continue
        if now >= next_row or now >= end:
            row = Row(
                len(rows) + 1, now - row_start, tally, broker.rss_mib(), broker.store_mib(),
                restarts,
            )  # fmt: skip
            rows.append(row)
            print(line(row), flush=True)
            tally, restarts, row_start = Tally(), [], now
            next_row += args.interval
            if now >= end:
                return rows
            continue
        with contextlib.suppress(queue.Empty):
            tally.add(reports.get(timeout=max(0.01, min(next_row, next_restart) - now)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="A LevelDB-backed Nautilus under connect/publish/disconnect churn with "
        "restarts: per-interval CONNACK latency, connects/s, messages/s and RSS.",
    )
    parser.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument(
        "--restart-every", type=float, default=60.0, help="seconds between broker restarts "
        "(0: none; default 60)",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per row")
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--persistent", type=int, default=10, help="persistent clients each")
    parser.add_argument("--clean", type=int, default=10, help="clean clients each")
    parser.add_argument("--messages", type=int, default=20, help="QoS 1 per connection")
    parser.add_argument("--payload", type=int, default=64, help="bytes per message")
    parser.add_argument(
        "--pause", type=float, default=0.25, help="seconds between a client's connections, "
        "on average (default 0.25; 0: as fast as the broker answers)",
    )  # fmt: skip
    parser.add_argument("--no-sync", dest="sync", action="store_false", help="[store] sync = false")
    parser.add_argument(
        "--mountpoint", default="", help="the listener's mountpoint (a tree's keys)"
    )
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
