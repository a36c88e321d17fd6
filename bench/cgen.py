# The compiled load generator, bench/mqttgen.c, from Python: building it, running it, its
# sink, and one measurement of a scenario with it (bench/README.md, "mqttgen").
#
# Strategy: the binary does all the work and prints JSON lines: an event at the moment
# publishing starts ("load"), at the start and at the end of the measured seconds, and
# the results last. `run` reads them as they come and calls back at each event, so what
# must be read at those same instants (the broker's CPU time, its queue drop counter
# through bench/drops.py) is read then. With a callback the binary is started with
# --hold: after "end" it keeps the load running until the callback has returned (we
# write a line to its stdin), as `scenarios._throughput` keeps it running until the drop
# counter's next round has arrived.
from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import packets
from .brokers import REPO
from .client import Login
from .drops import DropMonitor, open_monitor
from .scenarios import Measurement, Scenario, Settings, Target, cpu_seconds

SOURCE = REPO / "bench" / "mqttgen.c"
BINARY = REPO / "bench" / "bin" / "mqttgen"
_TOPOLOGIES = ("pairs", "fanout", "fanin", "shared")
MODES = ("bounded", "flood", "paced")  # of a throughput scenario
_READ_LOW_WATER = 16 * 1024  # the most a flood's subscriber waits for, as in the binary


class GeneratorError(RuntimeError):
    """mqttgen cannot be built, or a run failed (the message is its one line of why)."""


def path() -> Path:
    """The binary, built first (`make bench/bin/mqttgen`) when it is missing or older
    than its source and a C compiler is there."""
    fresh = BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime
    if fresh:
        return BINARY
    if shutil.which("cc") is None or shutil.which("make") is None:
        if BINARY.exists():  # stale, but nothing here can rebuild it
            return BINARY
        raise GeneratorError(
            f"{BINARY.relative_to(REPO)} is missing and there is no cc to build it"
        )
    built = subprocess.run(
        ["make", "-C", str(REPO), "--no-print-directory", str(BINARY.relative_to(REPO))],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        lines = (built.stderr or built.stdout).strip().splitlines() or ["no output"]
        raise GeneratorError(f"building {BINARY.relative_to(REPO)} failed: {lines[-1]}")
    return BINARY


def available() -> bool:
    """Whether mqttgen can run here (building it if need be)."""
    try:
        path()
    except GeneratorError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Load:
    """What `mqttgen run` does; the fields are its options."""

    publishers: int
    subscribers: int
    topology: str = "pairs"  # pairs, fanout, fanin or shared
    qos: int = 0
    payload: int = 64  # bytes; QoS 1 needs at least 16 (stamp, publisher, sequence number)
    window: int = 100  # QoS 1 PUBLISHes unacknowledged per publisher
    mode: str = "flood"  # or "paced", at `rate`
    rate: float = 0.0  # messages per second, all publishers together
    # Bounded: publishers also wait while this many deliveries are owed (messages
    # published x subscribers per message - delivered), as bench/loadgen.py's Backlog; 0:
    # no bound. A flood with a bound is the bounded mode of bench/scenarios.py.
    backlog: int = 0
    warmup: float = 1.0
    duration: float = 5.0
    settle: float = 1.0  # QoS 1: quiet seconds before `lost` is counted; 0: not counted
    persistent: bool = False  # subscribers with clean session off (ids new every run)
    threads: int = 1
    id_prefix: str = "mqttgen"
    # Subscribers' SO_RCVLOWAT in bytes (1: off); None: the binary's own choice (16 KiB in
    # a QoS 0 flood, an eighth of the window's bytes in a QoS 1 flood, off when paced).
    read_low_water: int | None = None
    # Paced: read marks as in a flood (publishers' PUBACKs too), for a throughput row;
    # a latency row reads every packet at once.
    bulk_reads: bool = False
    username: str | None = None  # the CONNECTs' credentials (None: none)
    password: str | None = None
    sub_port: int | None = None  # subscribers on another broker (a bridge's far side)

    def argv(self, host: str, port: int) -> list[str]:
        args = ["run", "--host", host, "--port", str(port)]
        args += ["--publishers", str(self.publishers), "--subscribers", str(self.subscribers)]
        args += ["--topology", self.topology, "--qos", str(self.qos)]
        args += ["--payload", str(self.payload), "--window", str(self.window)]
        args += ["--mode", self.mode, "--warmup", str(self.warmup)]
        args += ["--duration", str(self.duration), "--settle", str(self.settle)]
        args += ["--threads", str(self.threads), "--clean-id-prefix", self.id_prefix]
        if self.mode == "paced":
            args += ["--rate", str(self.rate)]
        if self.backlog:
            args += ["--backlog", str(self.backlog)]
        if self.persistent:
            args.append("--persistent")
        if self.read_low_water is not None:
            args += ["--read-low-water", str(self.read_low_water)]
        if self.bulk_reads:
            args.append("--bulk-reads")
        if self.username is not None:
            args += ["--username", self.username]
        if self.password is not None:
            args += ["--password", self.password]
        if self.sub_port is not None:
            args += ["--sub-port", str(self.sub_port)]
        return args


# Called with "load", "start" and "end" at those moments; the load goes on until it returns.
EventCallback = Callable[[str], Awaitable[None]]


async def run(
    host: str, port: int, load: Load, on_event: EventCallback | None = None
) -> dict[str, Any]:
    """Run the generator against a broker listening at host:port; its results (see
    bench/README.md for the fields). Raises GeneratorError with the binary's reason when
    it fails (a refused CONNACK, a connection reset)."""
    argv = [str(path()), *load.argv(host, port)]
    if on_event is not None:
        argv.append("--hold")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if on_event is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None  # PIPEs, as asked
    errors = asyncio.ensure_future(proc.stderr.read())  # one line, if it fails
    result: dict[str, Any] | None = None
    try:
        async for line in proc.stdout:
            message = json.loads(line)
            name = message.get("event")
            if name is None:
                result = message
                continue
            if on_event is not None:
                await on_event(name)
                if name == "end" and proc.stdin is not None:
                    proc.stdin.write(b"\n")  # the load may stop now
                    await proc.stdin.drain()
    except BaseException:  # the callback failed, or we were cancelled: stop the load
        # Only here: killing a child that has exited races asyncio's child watcher.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    finally:
        code = await proc.wait()
        stderr = (await errors).decode(errors="replace").strip()
    if code != 0 or result is None:
        raise GeneratorError(stderr.splitlines()[-1] if stderr else f"mqttgen exited with {code}")
    return result


@contextlib.asynccontextmanager
async def sink() -> AsyncIterator[int]:
    """`mqttgen sink` on an ephemeral 127.0.0.1 port, for the `async with` block; yields
    the port."""
    proc = await asyncio.create_subprocess_exec(
        str(path()), "sink", "--port", "0", stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 10.0)
        if not line:
            raise GeneratorError(f"mqttgen sink exited with {await proc.wait()}")
        yield int(json.loads(line)["port"])
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def load_of(
    scenario: Scenario,
    settings: Settings,
    threads: int = 1,
    inflight: int | None = None,
    login: Login | None = None,
) -> Load:
    """The load of a throughput scenario in any mode (bounded: a flood with the
    `settings.backlog` bound; paced: at `scenario.rate`, reading in bulk as a flood does,
    so the paced and flood rows differ only by how the publishers send) or of a latency
    scenario (paced at its rate, every packet read at once); `inflight`: QoS 1 deliveries
    the broker sends a subscriber before it waits for acks, when known (the subscribers'
    read mark stays below it); `login`: every client's username and password (None:
    anonymous)."""
    mode = "paced" if scenario.kind == "latency" else scenario.mode
    if scenario.kind not in ("throughput", "latency") or mode not in MODES:
        raise ValueError(f"mqttgen runs throughput and latency loads only, not {scenario.name}")
    if scenario.topology not in _TOPOLOGIES:
        raise ValueError(f"unknown topology {scenario.topology!r}")
    return Load(
        publishers=scenario.publishers,
        subscribers=scenario.subscribers,
        topology=scenario.topology,
        qos=scenario.qos,
        payload=scenario.payload,
        window=scenario.window,
        mode="flood" if mode == "bounded" else mode,
        rate=float(scenario.rate),
        backlog=settings.backlog if mode == "bounded" else 0,
        warmup=settings.warmup,
        duration=settings.duration,
        settle=settings.settle,
        persistent=scenario.persistent,
        threads=threads,
        id_prefix=scenario.base,
        read_low_water=_read_low_water(scenario, mode, inflight, settings.backlog),
        bulk_reads=scenario.kind == "throughput" and mode == "paced",
        username=None if login is None else login.username,
        password=None if login is None else login.password,
    )


def _read_low_water(
    scenario: Scenario, mode: str, inflight: int | None, backlog: int
) -> int | None:
    """A QoS 1 throughput row's subscribers wait for an eighth of what the broker sends
    before it waits for their acks, as in `scenarios._subscriber_low_water` (bounded: and
    for at most a quarter of their share of the bound, as the binary does on its own);
    otherwise the binary chooses."""
    bulk = mode in ("flood", "bounded") or (scenario.kind == "throughput" and mode == "paced")
    if not bulk or not scenario.qos or inflight is None:
        return None
    size = len(packets.publish("bench/0", packets.payload_of(scenario.payload), 1, 1))
    mark = min(_READ_LOW_WATER, inflight * size // 8)
    if mode == "bounded" and backlog:
        mark = min(mark, backlog * size // (4 * scenario.subscribers))
    return max(1, mark)


async def measure(
    scenario: Scenario, target: Target, settings: Settings, threads: int = 1
) -> Measurement:
    """One measurement of `scenario` with mqttgen, as `scenarios.measure` takes one with
    the Python generator: the broker's CPU time and its queue drop counter are read at
    the start and the end of the measured seconds. `lost` is counted when
    `settings.settle` is set, as there."""
    if target.transport is not None:
        raise ValueError("mqttgen speaks MQTT over plain TCP only")
    load = load_of(scenario, settings, threads, target.inflight, target.login)
    monitor: DropMonitor | None = None
    if target.drops is not None:
        monitor = await open_monitor(
            target.host,
            target.port,
            f"{scenario.base}-sys",
            target.drops,
            login=target.sys_login,
        )
    marks: dict[str, tuple[float, float | None]] = {}
    counted = True

    async def on_event(name: str) -> None:
        nonlocal counted
        now = time.perf_counter()
        if name == "load" and monitor is not None:
            monitor.start(now)
        elif name in ("start", "end"):
            marks[name] = now, cpu_seconds(target.pid)
        if name == "end" and monitor is not None:  # under the same load, as _throughput
            counted = await monitor.until_round_after(now)

    try:
        result = await run(target.host, target.port, load, on_event)
    finally:
        if monitor is not None:
            monitor.close()
    (t0, broker0), (t1, broker1) = marks["start"], marks["end"]
    elapsed = result["elapsed_s"]
    measurement = Measurement(
        delivered=result["delivered_per_s"],
        accepted=result["accepted_per_s"],
        p50_ms=result["p50_ms"],
        p99_ms=result["p99_ms"],
        p999_ms=result["p999_ms"],
        lost=None if result["lost"] is None else float(result["lost"]),
        acked=None if result["acked_total"] is None else float(result["acked_total"]),
        loadgen_cpu=result["cpu_s"] / elapsed,
    )
    if broker0 is not None and broker1 is not None:
        measurement.broker_cpu = (broker1 - broker0) / (t1 - t0)
    if monitor is not None and counted:
        measurement.drops = monitor.between(t0, t1)
    elif monitor is not None:
        measurement.error = "drops not counted: no $SYS round within 3 periods after the end"
    return measurement
