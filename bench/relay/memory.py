# `python -m bench.relay memory`: the broker's memory under a flood while a relay consumer
# has attached and then stopped reading, against the same flood with no consumer and with
# the relay off.
#
# Strategy: a fresh broker per run (the relay with small memory bounds, `memory_events`),
# then, for the stalled case, a consumer that sends HELLO (start "earliest") on a plain
# socket and never reads it again: the relay writes to it until the kernel's buffers and
# its own write buffer are full, and then must hold nothing more for it than a position.
# One of bench/scenarios.py's flood measurements runs meanwhile, and this process reads the
# broker's VmRSS every second from start to end. Bounded means: the RSS stops growing
# once the log is full, with or without the stalled consumer.
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import socket
import statistics
import struct
import sys
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

from event_relay import frames

from ..brokers import (
    HOST,
    MODES,
    BrokerError,
    BrokerSpec,
    RunningBroker,
    for_mode,
    free_port,
    nautilus_toml,
    raise_fd_limit,
)
from ..scenarios import BY_NAME, Measurement, Scenario, Settings, Target, in_modes, measure, rss_kib
from . import page, parse, run

PROG = "python -m bench.relay memory"
DESCRIPTION = "The broker's memory under a flood, with a relay consumer that stops reading."
HEADING = "### Memory with a consumer that stops reading"
RELAY_TOML = """\
[event_relay]
enabled = true
address = "{host}:{port}"
memory_events = {events}
"""
SAMPLE = 1.0  # seconds between two RSS readings
FLAT = 0.05  # bounded: RSS grows less than this share over the second half of the flood


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    label: str
    relay: bool
    stalled: bool


VARIANTS = {
    v.name: v
    for v in (
        Variant("off", "relay off", relay=False, stalled=False),
        Variant("on", "relay on, no consumer", relay=True, stalled=False),
        Variant("stalled", "relay on, a consumer that stopped reading", relay=True, stalled=True),
    )
}


@dataclass(slots=True)
class Result:
    measurement: Measurement
    rss: list[int] = field(default_factory=list)  # KiB, one reading per SAMPLE seconds
    unread: int | None = None  # bytes waiting in the stalled consumer's socket at the end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", default=",".join(VARIANTS), help=", ".join(VARIANTS))
    parser.add_argument("--scenario", default="qos0-1to1", help="a throughput scenario")
    parser.add_argument("--memory-events", type=int, default=200_000, help="the relay's bound")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of flood")


QUICK = ["--repeats", "1", "--duration", "8"]


def main(argv: list[str]) -> tuple[str, str | None]:
    args = parse(argv, PROG, DESCRIPTION, add_arguments, QUICK)
    raise_fd_limit()
    variants = [VARIANTS[name] for name in args.variants.split(",")]
    (scenario,) = in_modes([BY_NAME[args.scenario]], ["flood"])
    settings = Settings(warmup=1.0, duration=args.duration)
    stamp = page.Stamp()
    results: dict[str, list[Result]] = {v.name: [] for v in variants}
    for repeat in range(args.repeats):
        for variant in variants:
            result = _measure(variant, scenario, settings, args.memory_events)
            results[variant.name].append(result)
            m = result.measurement
            error = f"  ERROR {m.error}" if m.error else ""
            print(
                f"  {variant.name:<8} run {repeat + 1}: "
                f"max RSS {page.mib(max(result.rss, default=None))} MiB, "
                f"delivered {page.rate(m.delivered)}/s{error}",
                file=sys.stderr,
                flush=True,
            )
    return render(args, stamp.finish(), scenario, variants, results), args.write


def _measure(variant: Variant, scenario: Scenario, settings: Settings, events: int) -> Result:
    mode = MODES[scenario.mode]
    relay = free_port()

    def command(workdir: Path, port: int) -> list[str]:
        config = nautilus_toml(mode).format(host=HOST, port=port)
        if variant.relay:
            config += RELAY_TOML.format(host=HOST, port=relay, events=events)
        (workdir / "nautilus.toml").write_text(config)
        return [sys.executable, "-m", "broker", "--config", str(workdir / "nautilus.toml")]

    spec: BrokerSpec = dataclasses.replace(for_mode(mode)["nautilus"], command=command)
    stalled = None
    try:
        with RunningBroker(spec) as broker:
            if variant.stalled:
                stalled = _stalled_consumer(relay)
            measurement, rss = run(_sampled(scenario, broker.target, settings))
            if (code := broker.exit_code()) is not None:
                measurement.error = f"broker exited with {code}: {broker.log_tail(5)}"
            return Result(measurement, rss, None if stalled is None else _unread(stalled))
    except (BrokerError, OSError) as exc:
        return Result(Measurement(error=f"{type(exc).__name__}: {exc}"))
    finally:
        if stalled is not None:
            stalled.close()


def _stalled_consumer(port: int) -> socket.socket:
    """Attached from the oldest event, then never read again."""
    sock = socket.create_connection((HOST, port))
    hello = {"version": 1, "name": "stalled", "start": "earliest", "types": None}
    sock.sendall(frames.frame(frames.HELLO, hello))
    return sock


def _unread(sock: socket.socket) -> int:
    """Bytes the kernel holds for the socket, unread (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0]


async def _sampled(
    scenario: Scenario, target: Target, settings: Settings
) -> tuple[Measurement, list[int]]:
    task = asyncio.ensure_future(measure(scenario, target, settings))
    readings = []
    next_reading = time.monotonic()
    while not task.done():
        if (kib := rss_kib(target.pid)) is not None:
            readings.append(kib)
        next_reading += SAMPLE
        await asyncio.wait([task], timeout=max(0.0, next_reading - time.monotonic()))
    return task.result(), readings


def render(
    args: argparse.Namespace,
    header: page.Header,
    scenario: Scenario,
    variants: list[Variant],
    results: dict[str, list[Result]],
) -> str:
    settings = {
        "repeats": str(args.repeats),
        "flood": f"{scenario.title}, {args.duration:g} s after a 1 s warm-up",
        "`memory_events`": f"{args.memory_events:,}",
    }
    about = f"""\
A flood ({scenario.title}: publishers bounded only by TCP, the flood-mode broker
configuration of `bench.compare`) against a fresh broker with the relay off, or on with
every hook, payloads full and `memory_events` as above (its other bounds at their
defaults); "stopped reading" is a consumer that attached from `earliest` and then never
read its socket. The broker's VmRSS is read every second; the start is the first reading
(broker idle), growth is from the middle of the run to its end. Medians of the repeats.
"""
    rows, peaks, growth = [], {}, {}
    for variant in variants:
        runs = [r for r in results[variant.name] if r.rss]
        if not runs:
            rows.append([variant.label] + ["n/a"] * 6)
            continue
        start = statistics.median(r.rss[0] for r in runs)
        peak = statistics.median(max(r.rss) for r in runs)
        middle = statistics.median(r.rss[len(r.rss) // 2] for r in runs)
        end = statistics.median(r.rss[-1] for r in runs)
        peaks[variant.name] = peak
        growth[variant.name] = (end - middle) / middle
        unread = [r.unread for r in runs if r.unread is not None]
        delivered = [d for r in runs if (d := r.measurement.delivered) is not None]
        rows.append(
            [
                variant.label,
                page.mib(start),
                page.mib(peak),
                page.mib(end),
                f"{(end - middle) / 1024:+,.1f}",
                page.rate(statistics.median(delivered) if delivered else None),
                f"{statistics.median(unread) / 1024:,.0f} KiB" if unread else "",
            ]
        )
    columns = [
        "Broker",
        "RSS at start (MiB)",
        "Max RSS (MiB)",
        "RSS at the end (MiB)",
        "Growth, 2nd half (MiB)",
        "Delivered msg/s",
        "Unread at the consumer",
    ]
    verdict = (
        f"Target, memory bounded with a consumer that stops reading (its broker's RSS grows "
        f"less than {FLAT:.0%} over the second half of the flood): "
    )
    if "stalled" not in growth:
        verdict += "not measured.\n"
    else:
        met = "met" if growth["stalled"] < FLAT else "NOT met"
        verdict += f"{met} ({growth['stalled']:+.1%}"
        if "on" in peaks:
            verdict += (
                f"; max RSS {page.ratio(peaks['stalled'], peaks['on'])} that with no consumer"
            )
        verdict += ").\n"
    errors = sorted(
        {
            f"- {v.label}: {r.measurement.error}\n"
            for v in variants
            for r in results[v.name]
            if r.measurement.error
        }
    )
    notes = "Errors and notes:\n\n" + "".join(errors) + "\n" if errors else ""
    return page.block(HEADING, header, settings, about, notes + verdict, page.table(columns, rows))
