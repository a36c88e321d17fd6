# The benchmark scenarios and how one measurement of each is taken.
#
# Strategy: a measurement connects and subscribes every client first, starts the
# publishers, lets the broker settle for `warmup` seconds, then counts what subscribers
# received between two snapshots `duration` seconds apart. Throughput is delivered
# messages / elapsed: what the broker still holds at the end is not counted, so a broker
# that accepts floods faster than it delivers gains nothing. All clients live on one event
# loop in this process, which leaves the other core of a 2-core machine to the broker.
# Every throughput scenario runs in three modes: bounded (publishers also wait while too
# many deliveries are owed), flood (publishers bounded only by TCP and, at QoS 1, by
# their own window), where the same snapshots also read what the broker had accepted and
# its queue drop counter (bench/drops.py), and paced (publishers at a steady offered rate,
# `Scenario.paced_rate`; compiled generator only, bench/cgen.py). This module is the
# Python generator; bench/cgen.py takes the same measurements with bench/mqttgen.c.
from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import packets
from .client import Login, MqttClient, Uniform, open_client, subscribe
from .drops import DropMonitor, SysCounter, open_monitor
from .loadgen import Backlog, Flood, Paced, Windowed

if TYPE_CHECKING:
    from .client_layers import Transport

_READ_LOW_WATER = 16 * 1024  # QoS 0 subscribers: bytes waiting before a read
_CONNECT_CONCURRENCY = 100  # idle scenario: CONNECTs in progress at once
_SETTLE = 1.0  # idle scenario: seconds between the last CONNACK and the RSS reading


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    kind: str  # "throughput", "latency" or "idle"
    publishers: int = 0
    subscribers: int = 0
    qos: int = 0
    payload: int = 64
    # pairs: publisher i -> topic i -> subscriber i; fanout and fanin share one topic;
    # shared: the subscribers are one shared subscription group on that topic.
    topology: str = "pairs"
    window: int = 100  # QoS 1 PUBLISHes in flight per publisher
    # Throughput only: "bounded" publishers also wait for the backlog bound; "flood"
    # publishers do not, and the brokers run with their default queue limits
    # (bench/brokers.py, MODES); "paced" publishers send `paced_rate` msg/s, to brokers
    # configured as in flood mode.
    mode: str = "bounded"
    persistent: bool = False  # subscribers keep their sessions (clean session off)
    # Latency, and a throughput scenario in paced mode: PUBLISHes per second offered, all
    # publishers together (a fan-out delivers this x subscribers).
    rate: int = 0
    # Throughput: the rate of its paced mode (`in_modes` makes it `rate`), set above what
    # Mosquitto delivers flooded on the 2-core machine (~1.5x), so the paced row shows
    # who keeps up with a steady load beyond that.
    paced_rate: int = 0
    connections: int = 0  # idle: connections to open

    @property
    def bounded(self) -> bool:
        return self.mode == "bounded"

    @property
    def base(self) -> str:
        """The name without its mode: `qos0-1to1` for `qos0-1to1/flood`."""
        return self.name.partition("/")[0]

    @property
    def fanout(self) -> int:
        """Subscribers receiving each PUBLISH."""
        return self.subscribers if self.topology == "fanout" else 1


# Paced rates: ~1.5x what Mosquitto 2.0.11 delivered flooded with mqttgen on the 2-core
# machine (medians of five runs of 1 + 3 s, 2026-11-27): QoS 0 1 -> 1 ~312k msg/s (296k
# to 400k), 4 pairs ~290k, QoS 1 4 pairs ~138k, persistent ~127k, fan-out ~387k
# deliveries/s (3.9k PUBLISHes), fan-in ~299k, shared group ~134k. QoS 0 1 -> 1 was
# 480k, which Mosquitto's 322k in the full run of that day left at 1.49x: now 600k.
SCENARIOS = (
    Scenario(
        "qos0-1to1", "QoS 0, 1 -> 1, 16 B", "throughput", 1, 1, payload=16, paced_rate=600_000
    ),
    Scenario("qos0-4pairs", "QoS 0, 4 pairs, 64 B", "throughput", 4, 4, paced_rate=450_000),
    Scenario(
        "qos1-4pairs",
        "QoS 1, 4 pairs, 100 in flight, 64 B",
        "throughput",
        4,
        4,
        qos=1,
        paced_rate=220_000,
    ),
    Scenario(
        "qos1-persistent",
        "QoS 1, 4 pairs, persistent subscribers, 64 B",
        "throughput",
        4,
        4,
        qos=1,
        persistent=True,
        paced_rate=190_000,
    ),
    Scenario(
        "fanout-1to100",
        "QoS 0, fan-out 1 -> 100, 64 B",
        "throughput",
        1,
        100,
        topology="fanout",
        paced_rate=6_000,
    ),
    Scenario(
        "fanin-10to1",
        "QoS 0, fan-in 10 -> 1, 64 B",
        "throughput",
        10,
        1,
        topology="fanin",
        paced_rate=450_000,
    ),
    Scenario(
        "shared-qos1",
        "QoS 1, 4 publishers -> shared group of 4, 64 B",
        "throughput",
        4,
        4,
        qos=1,
        topology="shared",
        paced_rate=200_000,
    ),
    Scenario("latency-qos1", "QoS 1 latency at 5k msg/s, 64 B", "latency", 1, 1, qos=1, rate=5000),
    # Paced at rates both brokers keep up with (issue 25): latency under moderate load.
    Scenario(
        "latency-qos0", "QoS 0 latency, 4 pairs at 100k msg/s, 64 B", "latency", 4, 4, rate=100_000
    ),
    Scenario(
        "latency-qos1-48k",
        "QoS 1 latency, 4 pairs at 48k msg/s, 64 B",
        "latency",
        4,
        4,
        qos=1,
        rate=48_000,
    ),
    Scenario("idle-10k", "10k idle connections", "idle", connections=10_000),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


def in_modes(scenarios: Iterable[Scenario], modes: Iterable[str]) -> list[Scenario]:
    """Each throughput scenario once per mode (`<name>/flood` in flood mode; in paced
    mode `<name>/paced`, its `rate` its `paced_rate`); the latency and idle scenarios
    once."""
    modes = list(modes)
    result = []
    for scenario in scenarios:
        if scenario.kind != "throughput":
            result.append(scenario)
            continue
        for mode in modes:
            if mode == "bounded":
                result.append(scenario)
            elif mode == "paced":
                name = f"{scenario.name}/paced"
                result.append(replace(scenario, name=name, mode=mode, rate=scenario.paced_rate))
            else:
                result.append(replace(scenario, name=f"{scenario.name}/{mode}", mode=mode))
    return result


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the generator logs in with: every load client as `load`, the drop counter's
    client as `sys`, a user of its own that may read $SYS (the load's user may not)."""

    load: Login
    sys: Login


@dataclass(frozen=True, slots=True)
class Target:
    """Where the broker listens, and what a measurement needs to know of it."""

    host: str
    port: int
    pid: int | None = None  # when its memory can be read
    # QoS 1 deliveries a subscriber gets before the broker waits for its acks (None: not
    # known, taken as the publishers' window)
    inflight: int | None = None
    drops: SysCounter | None = None  # its queue drop counter, if it has one
    transport: Transport | None = None  # TLS or WebSockets (bench/client_layers.py); None: TCP
    credentials: Credentials | None = None  # None: clients connect anonymously

    @property
    def login(self) -> Login | None:
        """The load clients' username and password (None: anonymous)."""
        return None if self.credentials is None else self.credentials.load

    @property
    def sys_login(self) -> Login | None:
        """The drop counter client's username and password (None: anonymous)."""
        return None if self.credentials is None else self.credentials.sys


NOT_MEASURED = "not measured"  # the error of a scenario a broker cannot serve


@dataclass(slots=True)
class Measurement:
    delivered: float | None = None  # msg/s received by subscribers
    # msg/s the broker took from publishers: QoS 0 PUBLISHes read, QoS 1 PUBACKs sent
    accepted: float | None = None
    drops: float | None = None  # the broker's queue drop counter over the measured seconds
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None  # compiled generator only
    connections: int | None = None
    connect_rate: float | None = None  # CONNACKs per second
    kib_per_connection: float | None = None
    error: str | None = None
    # With Settings.settle: QoS 1 messages acknowledged to the publishers and never
    # delivered, counted over the whole run once the load stopped and deliveries settled.
    lost: float | None = None
    acked: float | None = None  # with `lost`: PUBACKs received over the whole run
    # CPU used during the measured seconds, in cores: the load generator's process, and
    # the broker's process (when its pid is known).
    loadgen_cpu: float | None = None
    broker_cpu: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """How long and how hard to measure; the same for every broker."""

    warmup: float = 1.0  # seconds of load before counting starts
    duration: float = 5.0  # seconds counted
    backlog: int = 20_000  # deliveries owed before publishers wait (0: no bound)
    idle_connections: int = 10_000
    idle_timeout: float = 60.0  # seconds allowed for opening the idle connections
    # Throughput, QoS 1: after the load, wait until deliveries stop (this long without
    # one, at most 10 s) and count what was acknowledged and never delivered (`lost`).
    # 0: not counted.
    settle: float = 0.0


async def measure(scenario: Scenario, target: Target, settings: Settings) -> Measurement:
    """Run one measurement of `scenario` against a broker that is already listening."""
    if scenario.kind == "idle":
        return await _idle(target, settings.idle_connections, settings.idle_timeout)
    if why := python_cannot(scenario):
        return Measurement(error=f"{NOT_MEASURED}: {why}")
    if scenario.kind == "latency":
        return await _latency(scenario, target, settings)
    return await _throughput(scenario, target, settings)


def python_cannot(scenario: Scenario) -> str | None:
    """Why this Python generator cannot take the measurement (bench/cgen.py can), or None:
    it paces one QoS 1 publisher only, and no throughput load."""
    if scenario.kind == "throughput" and scenario.mode == "paced":
        return "paced mode needs mqttgen (--generator c)"
    if scenario.kind == "latency" and (scenario.publishers, scenario.qos) != (1, 1):
        return "the Python generator paces one QoS 1 pair only: needs mqttgen (--generator c)"
    return None


def _topics(scenario: Scenario) -> tuple[list[str], list[str]]:
    """Publisher topics and the topic each subscriber receives on (exact topics: no
    wildcard matching)."""
    if scenario.topology == "pairs":
        topics = [f"bench/{i}" for i in range(scenario.publishers)]
        return topics, topics[: scenario.subscribers]
    return ["bench/0"] * scenario.publishers, ["bench/0"] * scenario.subscribers


def _filter(scenario: Scenario, topic: str) -> str:
    """What a subscriber subscribes to in order to receive `topic`."""
    return f"$share/bench/{topic}" if scenario.topology == "shared" else topic


async def _subscribers(
    scenario: Scenario, target: Target, filters: list[str], payload: bytes, settings: Settings
) -> list[MqttClient]:
    size = Uniform.publish(filters[0], payload, scenario.qos).size + _overhead(target)
    low_water = _subscriber_low_water(scenario, target, settings, size, len(filters))
    # Persistent sessions of this measurement only: never one a store kept from before.
    run = f"-{secrets.token_hex(4)}" if scenario.persistent else ""

    async def one(i: int, topic: str) -> MqttClient:
        uniform = Uniform.publish(topic, payload, scenario.qos)
        client = await open_client(
            target.host,
            target.port,
            f"{scenario.base}-sub{i}{run}",
            uniform=uniform,
            clean_session=not scenario.persistent,
            transport=target.transport,
            login=target.login,
        )
        await subscribe(client, _filter(scenario, topic), scenario.qos)
        client.read_in_bulk(low_water)
        return client

    return list(await asyncio.gather(*(one(i, topic) for i, topic in enumerate(filters))))


def _overhead(target: Target) -> int:
    """Bytes on the wire around each packet from a broker that encrypts or frames every
    packet on its own (0 over TCP): the read marks count what the socket receives."""
    return 0 if target.transport is None else target.transport.packet_overhead


def _subscriber_low_water(
    scenario: Scenario, target: Target, settings: Settings, size: int, subscribers: int
) -> int:
    """Bytes a subscriber lets pile up before reading: a fraction of what it must get.

    A subscriber waiting for more than the broker will send before hearing back would
    stall the run: QoS 1 deliveries stop at the broker's in-flight window until acked
    (100 in bounded mode, the broker's default in flood mode), and QoS 0 publishers stop
    at the backlog bound, which every subscriber holding just under the mark could reach.
    """
    if scenario.qos:
        return min(_READ_LOW_WATER, (target.inflight or scenario.window) * size // 8)
    limit = _backlog_limit(scenario, settings)
    return min(_READ_LOW_WATER, limit * size // (4 * subscribers)) or _READ_LOW_WATER


async def _publishers(scenario: Scenario, target: Target) -> list[MqttClient]:
    uniform = Uniform.puback() if scenario.qos else None
    pubs = await asyncio.gather(
        *(
            open_client(
                target.host,
                target.port,
                f"{scenario.base}-pub{i}",
                uniform=uniform,
                transport=target.transport,
                login=target.login,
            )
            for i in range(scenario.publishers)
        )
    )
    if uniform is not None:  # PUBACKs for an eighth of the window per wake-up
        for pub in pubs:
            pub.read_in_bulk(scenario.window * (uniform.size + _overhead(target)) // 8)
    return list(pubs)


async def _throughput(scenario: Scenario, target: Target, settings: Settings) -> Measurement:
    topics, filters = _topics(scenario)
    payload = packets.payload_of(scenario.payload)
    subs = pubs = []
    monitor = None
    try:
        subs = await _subscribers(scenario, target, filters, payload, settings)
        pubs = await _publishers(scenario, target)
        monitor = await _drop_monitor(scenario, target)
        backlog = _start_publishing(scenario, subs, pubs, topics, payload, settings)
        if monitor is not None:
            monitor.start(time.perf_counter())
        await asyncio.sleep(settings.warmup)
        received0, accepted0, t0 = _total(subs), backlog.accepted(), time.perf_counter()
        cpu0 = time.process_time(), cpu_seconds(target.pid)
        await asyncio.sleep(settings.duration)
        received1, accepted1, t1 = _total(subs), backlog.accepted(), time.perf_counter()
        cpu1 = time.process_time(), cpu_seconds(target.pid)
        # Under the same load, until the drop counter has been published after t1.
        counted = monitor is None or await monitor.until_round_after(t1)
        for publisher in backlog.publishers:
            publisher.stop()
        lost = acked = None
        if settings.settle and scenario.qos:
            lost = await _lost(subs, pubs, scenario.fanout, settings.settle)
            acked = float(sum(pub.acked for pub in pubs))
    finally:
        _close(subs + pubs)
        if monitor is not None:
            monitor.close()
    elapsed = t1 - t0
    result = Measurement(
        delivered=(received1 - received0) / elapsed,
        accepted=(accepted1 - accepted0) / elapsed,
        lost=lost,
        acked=acked,
        loadgen_cpu=(cpu1[0] - cpu0[0]) / elapsed,
    )
    if cpu0[1] is not None and cpu1[1] is not None:
        result.broker_cpu = (cpu1[1] - cpu0[1]) / elapsed
    if monitor is not None and counted:
        result.drops = monitor.between(t0, t1)
    elif monitor is not None:  # the end of the interval is unknown: no figure at all
        result.error = "drops not counted: no $SYS round within 3 periods after the end"
    return result


async def _drop_monitor(scenario: Scenario, target: Target) -> DropMonitor | None:
    """A client following the broker's queue drop counter, in flood mode."""
    if scenario.bounded or target.drops is None:
        return None
    return await open_monitor(
        target.host,
        target.port,
        f"{scenario.base}-sys",
        target.drops,
        target.transport,
        target.sys_login,
    )


def _start_publishing(
    scenario: Scenario,
    subs: list[MqttClient],
    pubs: list[MqttClient],
    topics: list[str],
    payload: bytes,
    settings: Settings,
) -> Backlog:
    backlog = Backlog(subs, scenario.fanout, _backlog_limit(scenario, settings))
    for pub, topic in zip(pubs, topics, strict=True):
        if scenario.qos:
            Windowed(pub, packets.publish_ring(topic, payload), scenario.window, backlog)
        else:
            Flood(pub, topic, payload, backlog)
    for publisher in backlog.publishers:
        publisher.start()
    return backlog


async def _latency(scenario: Scenario, target: Target, settings: Settings) -> Measurement:
    topics, filters = _topics(scenario)
    latencies: list[int] = []
    clients = []
    try:
        # No uniform run here: every delivery goes through the parser to read its stamp.
        sub = await open_client(
            target.host, target.port, "latency-sub", latencies=latencies, login=target.login
        )
        clients.append(sub)
        await subscribe(sub, filters[0], scenario.qos)
        pub = await open_client(
            target.host, target.port, "latency-pub", uniform=Uniform.puback(), login=target.login
        )
        clients.append(pub)
        pump = Paced(pub, topics[0], scenario.payload, scenario.rate, scenario.window)
        pump.start()
        await asyncio.sleep(settings.warmup)
        first, t0 = len(latencies), time.perf_counter()
        await asyncio.sleep(settings.duration)
        last, t1 = len(latencies), time.perf_counter()
        pump.stop()
    finally:
        _close(clients)
    window = sorted(latencies[first:last])
    if not window:
        return Measurement(delivered=0.0, error="no message delivered")
    return Measurement(
        delivered=len(window) / (t1 - t0),
        p50_ms=_percentile(window, 0.50) / 1e6,
        p99_ms=_percentile(window, 0.99) / 1e6,
    )


async def _idle(target: Target, count: int, timeout: float) -> Measurement:
    clients: list[MqttClient] = []
    failures: list[BaseException] = []
    gate = asyncio.Semaphore(_CONNECT_CONCURRENCY)
    last = started = time.perf_counter()
    before = rss_kib(target.pid)

    async def one(i: int) -> None:
        nonlocal last
        async with gate:
            try:
                client = await open_client(
                    target.host, target.port, f"idle-{i}", login=target.login
                )
                clients.append(client)
                last = time.perf_counter()
            except OSError as exc:  # refused, reset, timed out or CONNACK refused
                failures.append(exc)

    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    try:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.sleep(_SETTLE)
        after = rss_kib(target.pid)
    finally:
        _close(clients)
    connected = len(clients)
    result = Measurement(connections=connected, connect_rate=connected / max(last - started, 1e-9))
    if before is not None and after is not None and connected:
        result.kib_per_connection = (after - before) / connected
    if connected < count:
        result.error = f"{connected} of {count} connected in {timeout:.0f} s" + (
            f" (first error: {failures[0]!r})" if failures else ""
        )
    return result


async def _lost(subs: list[MqttClient], pubs: list[MqttClient], fanout: int, quiet: float) -> float:
    """Once the publishers have stopped: deliveries owed for every PUBACK received that
    never arrived, after `quiet` seconds without a delivery or an ack (10 s at most)."""
    for client in subs + pubs:  # the last few packets may be fewer bytes than the mark
        if not client.transport.is_closing():
            client.read_in_bulk(1)
    deadline = time.perf_counter() + 10.0
    last = -1, -1
    while time.perf_counter() < deadline:
        now = _total(subs), sum(pub.acked for pub in pubs)
        if now == last:
            break
        last = now
        await asyncio.sleep(quiet)
    owed = sum(pub.acked for pub in pubs) * fanout
    return float(max(0, owed - _total(subs)))


def _backlog_limit(scenario: Scenario, settings: Settings) -> int:
    return settings.backlog if scenario.bounded else 0


def _total(clients: list[MqttClient]) -> int:
    return sum(client.received for client in clients)


def _close(clients: list[MqttClient]) -> None:
    for client in clients:
        if client.transport is not None:
            client.transport.abort()


def _percentile(ordered: list[int], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) a process has used, from /proc/<pid>/stat (Linux)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_kib(pid: int | None) -> int | None:
    """Resident set size of a process in KiB, from /proc/<pid>/status (Linux)."""
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None
