# `python -m bench.relay sinks`: the same events (every PUBLISH's on_publish) through HTTP
# webhooks, through the relay to one consumer, and through the Courier sidecar push, side
# by side under the same publisher load, with the broker without any of them as reference.
#
# Strategy: each measurement starts its sink in a process of its own (bench/relay/
# sinkserver.py: an HTTP endpoint answering 200, or a TCP server counting Courier
# frames; the relay's consumer is bench/relay/broker.py's), then a fresh broker sending
# it the events, then runs one of bench/scenarios.py's throughput measurements. While it
# runs, this process notes the instants at which the scenario's clock starts and stops;
# the sink's Tally gives the events it got between them. Sinks and broker are stopped in
# `finally` (RunningBroker), whatever happens.
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

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
from ..scenarios import BY_NAME, Measurement, Scenario, Settings, Target, in_modes, measure
from . import page, parse, run, tally

PROG = "python -m bench.relay sinks"
DESCRIPTION = "The same events through webhooks, the relay and the Courier sidecar push."
HEADING = "### The same events through webhooks, the relay and the Courier sidecar"
ABOUT = """\
Every PUBLISH's `on_publish` event, and only those, sent out three ways by Nautilus under
the same load as `bench.compare`'s scenario of that name: *webhooks*, the webhooks
plugin posting each event to a local aiohttp endpoint that answers 200 (`max_pending_events
= 1000`, its default: beyond that many posts in flight, events are dropped); *relay*, the
relay server (`hooks = ["on_publish"]`) with one consumer process reading `batches()` from
`latest`; *Courier sidecar*, the push of `[event_relay.sidecar]` (`pool_size = 4`, the
relay server off) to a local TCP server counting its frames. Each sink is a process of its
own on the same two cores. Events/s is what the sink received during the scenario's
measured seconds; "of published" divides it by the PUBLISHes the broker accepted.
"""
WEBHOOK_TOML = """\
[plugins.webhooks]
enabled = true

[[plugins.webhooks.endpoints]]
hook = "on_publish"
url = "http://{host}:{port}/on_publish"
"""
RELAY_TOML = """\
[event_relay]
enabled = true
address = "{host}:{relay}"
hooks = ["on_publish"]
"""
SIDECAR_TOML = """\
[event_relay]
hooks = ["on_publish"]

[event_relay.sidecar]
enabled = true
hostname = "{host}"
port = {port}
hooks = ["on_publish"]
"""


@dataclass(frozen=True, slots=True)
class Sink:
    name: str
    label: str
    toml: str  # added to the broker's config ({host}, {port} of the sink, {relay} port)
    server: str | None = None  # bench/relay/sinkserver.py's kind, when the sink is a server
    consumer: bool = False  # a relay consumer beside the broker (bench/relay/broker.py)


SINKS = {
    sink.name: sink
    for sink in (
        Sink("none", "no events sent", ""),
        Sink("webhooks", "webhooks", WEBHOOK_TOML, server="http"),
        Sink("relay", "relay, one consumer", RELAY_TOML, consumer=True),
        Sink("sidecar", "Courier sidecar", SIDECAR_TOML, server="courier"),
    )
}


@dataclass(slots=True)
class Result:
    measurement: Measurement
    events: float | None = None  # per second, at the sink


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sinks", default=",".join(SINKS), help=", ".join(SINKS))
    parser.add_argument("--scenarios", default="qos0-1to1,qos1-4pairs", help="comma-separated")
    parser.add_argument("--modes", default="bounded,flood", help="comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds")
    parser.add_argument("--backlog", type=int, default=Settings().backlog)


QUICK = ["--scenarios", "qos0-1to1", "--repeats", "1", "--duration", "2"]


def main(argv: list[str]) -> tuple[str, str | None]:
    args = parse(argv, PROG, DESCRIPTION, add_arguments, QUICK)
    raise_fd_limit()
    sinks = [SINKS[name] for name in args.sinks.split(",")]
    scenarios = in_modes([BY_NAME[n] for n in args.scenarios.split(",")], args.modes.split(","))
    settings = Settings(warmup=args.warmup, duration=args.duration, backlog=args.backlog)
    stamp = page.Stamp()
    results: dict[tuple[str, str], list[Result]] = {}
    for scenario in scenarios:
        for _ in range(args.repeats):
            for sink in sinks:  # taking turns, so drift touches them alike
                result = _measure(sink, scenario, settings)
                results.setdefault((scenario.name, sink.name), []).append(result)
                m = result.measurement
                error = f"  ERROR {m.error}" if m.error else ""
                print(
                    f"  {scenario.name:<20} {sink.name:<9} delivered {page.rate(m.delivered)}/s"
                    f"  accepted {page.rate(m.accepted)}/s  sink {page.rate(result.events)}"
                    f" events/s{error}",
                    file=sys.stderr,
                    flush=True,
                )
    return render(args, stamp.finish(), scenarios, sinks, results), args.write


def _measure(sink: Sink, scenario: Scenario, settings: Settings) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-relay-sink-") as work:
        counted = Path(work) / "sink.tally"
        try:
            with ExitStack() as stack:
                port = 0
                if sink.server is not None:
                    server = stack.enter_context(RunningBroker(_server(sink.server, counted)))
                    port = server.target.port
                broker = stack.enter_context(RunningBroker(_broker(sink, scenario, port, counted)))
                measurement, start, end = run(_measured(scenario, broker.target, settings))
                if (code := broker.exit_code()) is not None:
                    measurement.error = f"broker exited with {code}: {broker.log_tail(5)}"
        except (BrokerError, OSError) as exc:
            return Result(Measurement(error=f"{type(exc).__name__}: {exc}"))
        if sink.name == "none":
            return Result(measurement)
        samples = tally.read(counted) if counted.exists() else []
        return Result(measurement, tally.rate_between(samples, start, end) if samples else 0.0)


async def _measured(
    scenario: Scenario, target: Target, settings: Settings
) -> tuple[Measurement, float, float]:
    """The measurement, and (about) the instants its clock starts and stops: it connects
    its few clients in a few milliseconds, then sleeps `warmup` and `duration` too."""
    task = asyncio.ensure_future(measure(scenario, target, settings))
    await asyncio.sleep(settings.warmup)
    start = time.monotonic()
    await asyncio.sleep(settings.duration)
    end = time.monotonic()
    return await task, start, end


def _server(kind: str, counted: Path) -> BrokerSpec:
    def command(workdir: Path, port: int) -> list[str]:
        argv = [sys.executable, "-m", "bench.relay.sinkserver", kind, "--port", str(port)]
        return [*argv, "--tally", str(counted)]

    return BrokerSpec(f"sink-{kind}", f"{kind} sink", command, lambda: "-")


def _broker(sink: Sink, scenario: Scenario, sink_port: int, counted: Path) -> BrokerSpec:
    mode = MODES[scenario.mode]

    def command(workdir: Path, port: int) -> list[str]:
        relay = free_port()
        path = workdir / "nautilus.toml"
        path.write_text(
            nautilus_toml(mode).format(host=HOST, port=port)
            + sink.toml.format(host=HOST, port=sink_port, relay=relay)
        )
        broker = [sys.executable, "-m", "broker", "--config", str(path)]
        if not sink.consumer:
            return broker
        wrapper = [sys.executable, "-m", "bench.relay.broker", f"--relay={HOST}:{relay}"]
        return [*wrapper, f"--tally={counted}", "--", *broker]

    return dataclasses.replace(for_mode(mode)["nautilus"], command=command)


def render(
    args: argparse.Namespace,
    header: page.Header,
    scenarios: list[Scenario],
    sinks: list[Sink],
    results: dict[tuple[str, str], list[Result]],
) -> str:
    settings = {
        "repeats": str(args.repeats),
        "warmup": f"{args.warmup:g} s",
        "duration": f"{args.duration:g} s",
        "backlog bound (bounded mode)": f"{args.backlog:,} deliveries",
    }
    rows, errors = [], []
    for scenario in scenarios:
        baseline = _median(
            r.measurement.delivered for r in results.get((scenario.name, "none"), [])
        )
        for sink in sinks:
            runs = results.get((scenario.name, sink.name), [])
            errors += [
                f"- {scenario.title}, {scenario.mode}, {sink.label}: {r.measurement.error}\n"
                for r in runs
                if r.measurement.error
            ]
            delivered = _median(r.measurement.delivered for r in runs)
            accepted = _median(r.measurement.accepted for r in runs)
            events = _median(r.events for r in runs)
            rows.append(
                [
                    scenario.title,
                    scenario.mode,
                    sink.label,
                    page.rate(events) if sink.name != "none" else "",
                    _share(events, accepted) if sink.name != "none" else "",
                    page.rate(delivered),
                    page.ratio(delivered, baseline),
                ]
            )
    columns = [
        "Scenario",
        "Mode",
        "Events go to",
        "Events/s at the sink",
        "Of published",
        "Broker delivered msg/s",
        "Of no events sent",
    ]
    notes = "Errors and notes:\n\n" + "".join(sorted(set(errors))) + "\n" if errors else ""
    return page.block(HEADING, header, settings, ABOUT, notes, page.table(columns, rows))


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _share(events: float | None, accepted: float | None) -> str:
    return "n/a" if events is None or not accepted else f"{events / accepted:.0%}"
