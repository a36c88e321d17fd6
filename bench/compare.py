# `python -m bench.compare`: every scenario against every broker, one broker at a time.
#
# Strategy: each measurement gets a fresh broker process, so no backlog, memory or client
# of one measurement leaks into the next. Brokers take turns within each repeat, so slow
# drift of the machine touches all of them alike; the report shows the median of the
# repeats and bench/results/ keeps every raw figure. A failed measurement is recorded with
# its error and the run goes on. Throughput scenarios run once per mode (--modes): the
# flood and paced variants of each come right after its bounded runs, with the brokers
# configured for that mode (bench/brokers.py, MODES).
#
# The generator (--generator): mqttgen (bench/mqttgen.c through bench/cgen.py) measures
# every throughput and latency cell when it can be built; the Python generator
# (bench/scenarios.py) the idle connections, and everything when mqttgen cannot run. With
# mqttgen the run also measures its headroom per flood scenario, within each repeat: its
# rate against `mqttgen sink`, and Mosquitto's with a second generator thread.
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from . import cgen, report
from .brokers import (
    BROKERS,
    HOST,
    MODES,
    BrokerError,
    BrokerSpec,
    RunningBroker,
    for_mode,
    raise_fd_limit,
)
from .raw import save_raw
from .scenarios import (
    BY_NAME,
    NOT_MEASURED,
    SCENARIOS,
    Measurement,
    Scenario,
    Settings,
    Target,
    in_modes,
    measure,
)

DEFAULT_BROKERS = "nautilus,mosquitto,amqtt"
COMPILED_MODES = "bounded,flood,paced"  # the default modes with mqttgen
PYTHON_MODES = "bounded,flood"  # the Python generator cannot pace a throughput load
QOS1_SETTLE = 0.5  # s without a delivery before QoS 1 `lost` is counted
DURATION = 4.0  # measured seconds per cell: a full run stays under ~25 minutes
# amqtt reads far faster than it delivers: flooded or paced it delivers ~0 msg/s (0-31
# in the floods of earlier runs) and each such cell takes long, so it is measured in the
# bounded rows, at the 5k QoS 1 latency row and with idle connections only.
AMQTT_ONLY = {"latency-qos1", "idle-10k"}
AMQTT_NOTE = (
    "amqtt: measured in the bounded rows, at 5k msg/s QoS 1 latency and with idle "
    "connections only; flooded or paced it reads far faster than it delivers, delivers "
    "~0 msg/s (0-31 msg/s in the floods of earlier runs) and each such cell takes long."
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = measure_all(args)
    if run is None:
        return 130
    page = report.render(run)
    print(page)
    if args.write:
        Path(args.write).write_text(page + _kept_sections(Path(args.write)))
    return 0


def measure_all(args: argparse.Namespace) -> report.Run | None:
    """Every measurement `args` asks for, summarised (medians); the raw figures go to
    bench/results/. None when interrupted (every broker started has been stopped)."""
    raise_fd_limit()
    # Ctrl-C and SIGTERM stop the run and its brokers, also when started in the background
    # (where SIGINT is inherited as ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    chosen = [BY_NAME[name] for name in args.scenarios.split(",")]
    scenarios = in_modes(chosen, args.modes.split(","))
    brokers, skipped = _available([BROKERS[name] for name in args.brokers.split(",")])
    if not brokers:
        raise SystemExit("nothing to measure: every broker asked for was skipped")
    print(
        f"estimated time: {_span(estimate(args, scenarios, brokers))}", file=sys.stderr, flush=True
    )
    busy = report.cpu_busy()
    if busy > 0.1:
        print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
    versions = _versions(brokers)
    machine0, own0 = report.cpu_seconds()
    started = time.monotonic()
    try:
        raw, calibration, headroom = _run_all(args, scenarios, brokers)
    except KeyboardInterrupt:
        print("interrupted: every broker started has been stopped", file=sys.stderr)
        return None
    machine1, own1 = report.cpu_seconds()
    others = (machine1 - machine0 - (own1 - own0)) / (time.monotonic() - started)
    load = {
        "CPU busy before the run": f"{busy:.0%}",
        "Other processes during the run": f"{others:.2f} CPUs on average",
    }
    if skipped:
        load["Brokers skipped"] = "; ".join(skipped)
    for key, after in _versions(brokers).items():
        if after != versions[key]:  # a commit in the checkout while it was measured
            print(f"warning: {key} changed during the run: {after}", file=sys.stderr)
            versions[key] += f", {after} by the end of the run"
    _save_raw(raw, calibration, headroom)
    print(f"took {_span(time.monotonic() - started)[1:]}", file=sys.stderr)
    run = _summary(args, scenarios, brokers, raw, calibration, load, versions)
    return dataclasses.replace(
        run,
        headroom={key: report.median(values) for key, values in headroom.items()},
        notes=_notes(args, scenarios, brokers),
    )


def _span(seconds: float) -> str:
    return f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} minutes"


def _notes(
    args: argparse.Namespace, scenarios: list[Scenario], brokers: list[BrokerSpec]
) -> list[str]:
    notes = []
    if args.generator_note:
        notes.append(args.generator_note)
    if any(b.name == "amqtt" for b in brokers) and any(_skipped_for_amqtt(s) for s in scenarios):
        notes.append(AMQTT_NOTE)
    return notes


def _skipped_for_amqtt(scenario: Scenario) -> bool:
    if scenario.kind == "throughput":
        return not scenario.bounded
    return scenario.name not in AMQTT_ONLY


def _measures(broker: BrokerSpec, scenario: Scenario) -> bool:
    """Whether `broker` is measured in `scenario` (amqtt is not, in most open-loop rows)."""
    return broker.name != "amqtt" or not _skipped_for_amqtt(scenario)


# Seconds a cell takes beyond warm-up and measured seconds (start, connect, stop), by
# broker, and the idle scenario's connects per second, from runs on the 2-core machine.
_START = {"nautilus": 0.4, "mosquitto": 0.2, "amqtt": 1.2, report.SINK: 0.3}
_DROPS_WAIT = {"nautilus": 0.5, "mosquitto": 0.9}  # the drop counter's next round, on average
_CONNECTS = {"nautilus": 7000, "mosquitto": 8000, "amqtt": 700}


def estimate(
    args: argparse.Namespace, scenarios: list[Scenario], brokers: list[BrokerSpec]
) -> float:
    """Seconds the run will take, roughly: its cells (and headroom cells) x repeats."""

    def cell(name: str, scenario: Scenario) -> float:
        product = name.partition("-")[0]
        seconds = _START.get(product, 0.5)
        if scenario.kind == "idle":
            return seconds + args.idle_connections / _CONNECTS.get(name, 2000) + 1.2
        seconds += args.warmup + args.duration
        if scenario.kind == "throughput" and not scenario.bounded:
            seconds += _DROPS_WAIT.get(product, 0.0)
        counts_lost = scenario.kind == "throughput" or args.generator == "c"
        if scenario.qos and counts_lost and args.settle:
            seconds += 2 * args.settle + 0.1  # two quiet periods at least
        return seconds

    total = sum(cell(b.name, s) for s in scenarios for b in brokers if _measures(b, s))
    for scenario in _headroom_scenarios(args, scenarios):
        total += cell(report.SINK, scenario)
        if _headroom_mosquitto(brokers) is not None:
            total += cell("mosquitto", scenario)
    return total * args.repeats


def _available(brokers: list[BrokerSpec]) -> tuple[list[BrokerSpec], list[str]]:
    """The brokers that can run here, and why each of the others cannot (printed at
    once, one line each): amqtt without its venv is skipped, the others still run."""
    available, skipped = [], []
    for broker in brokers:
        why = broker.missing() if broker.missing else None
        if why:
            print(f"skipping {broker.label}: {why}", file=sys.stderr, flush=True)
            skipped.append(f"{broker.label}: {why}")
        else:
            available.append(broker)
    return available, skipped


def _versions(brokers: list[BrokerSpec]) -> dict[str, str]:
    """One line per product: the variants of a broker (its stores) share its version."""
    products: dict[Callable[[], str], str] = {}
    for broker in brokers:
        products.setdefault(broker.version, broker.label.partition(",")[0])
    return {f"{product} version": version() for version, product in products.items()}


# Sections of the page that other benchmarks own (bench/transports.py; bench/acl.py,
# jwt_connect.py, webhooks.py; bench/store_throughput.py, store_startup.py; bench/relay/)
# start at one of these headings and are kept, from the first of them on, when the
# comparison rewrites the page.
KEPT_SECTIONS = (
    "## Transports: TLS and WebSockets",
    "## Plugins",
    "## Store",
    "## Event relay",
    "## Spark",
    "## Clustering",
)


def _kept_sections(path: Path) -> str:
    if not path.exists():
        return ""
    text = path.read_text()
    starts = [i for h in KEPT_SECTIONS if (i := text.find(f"\n{h}\n")) >= 0]
    return "" if not starts else "\n" + text[min(starts) + 1 :]


Raw = dict[tuple[str, str], list[Measurement]]


def _run_all(
    args: argparse.Namespace, scenarios: list[Scenario], brokers: list[BrokerSpec]
) -> tuple[Raw, list[Measurement], Raw]:
    """The cells, the Python generator's calibration (against the null broker) and
    mqttgen's headroom cells ((flood scenario, report.SINK or report.MOSQUITTO_2T) ->
    measurements)."""
    raw: Raw = defaultdict(list)
    headroom: Raw = defaultdict(list)
    calibration = []
    if args.calibrate and args.generator == "python":
        for _ in range(args.repeats):
            calibration.append(_measure_on(BROKERS["null"], BY_NAME["qos0-1to1"], args))
    configured = {name: for_mode(mode) for name, mode in MODES.items()}
    with_headroom = {s.name for s in _headroom_scenarios(args, scenarios)}
    mosquitto = _headroom_mosquitto(brokers)
    for scenario in scenarios:
        for _ in range(args.repeats):
            for broker in brokers:
                if not _measures(broker, scenario):
                    continue
                spec = configured[scenario.mode][broker.name]
                raw[scenario.name, broker.name].append(_measure_on(spec, scenario, args))
            if scenario.name in with_headroom:
                headroom[scenario.name, report.SINK].append(_measure_sink(scenario, args))
                if mosquitto is not None:
                    spec = configured[scenario.mode][mosquitto]
                    m = _measure_on(spec, scenario, args, threads=2, label="mosquitto-2threads")
                    headroom[scenario.name, report.MOSQUITTO_2T].append(m)
    return raw, calibration, headroom


def _headroom_mosquitto(brokers: list[BrokerSpec]) -> str | None:
    """The Mosquitto measured again with a second generator thread, if the run has it:
    the plain one, or the deployed one in a run without it (report.headroom_pair)."""
    names = {b.name for b in brokers}
    _, mosquitto = report.headroom_pair(names)
    return mosquitto if mosquitto in names else None


def _headroom_scenarios(args: argparse.Namespace, scenarios: list[Scenario]) -> list[Scenario]:
    """The flood scenarios whose generator headroom is measured (with mqttgen only)."""
    if not args.calibrate or args.generator != "c":
        return []
    return [s for s in scenarios if s.kind == "throughput" and s.mode == "flood"]


def _interrupt(signum: int, frame: object) -> None:
    # As SIGINT: the event loop's runner turns that into cancelling the measurement.
    signal.raise_signal(signal.SIGINT)


ALL_SCENARIOS = ",".join(scenario.name for scenario in SCENARIOS)


def parse_args(
    argv: list[str] | None,
    *,
    prog: str = "python -m bench.compare",
    description: str = "Run the benchmark scenarios against several MQTT brokers, one at a time.",
    brokers: str = DEFAULT_BROKERS,
    scenarios: str = ALL_SCENARIOS,
    calibrate: bool = True,
    write_help: str = "write the Markdown report here",
    modes: str | None = None,
) -> argparse.Namespace:
    """The command line of `compare`; another command (bench/store_throughput.py) passes
    its own name and defaults (`modes`: None for bounded, flood and paced with mqttgen,
    bounded and flood with the Python generator)."""
    defaults = Settings()
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--brokers", default=brokers, help=f"from {', '.join(BROKERS)}")
    parser.add_argument("--scenarios", default=scenarios, help="comma-separated")
    parser.add_argument(
        "--modes",
        default=modes,
        help="throughput modes, comma-separated: bounded (publishers wait for the backlog "
        "bound), flood (only TCP and the QoS 1 window; brokers at their default limits), "
        f"paced (a steady offered rate; mqttgen only); default {COMPILED_MODES} with "
        f"mqttgen, {PYTHON_MODES} with the Python generator",
    )
    parser.add_argument(
        "--generator",
        choices=("c", "python"),
        help="c: mqttgen (bench/mqttgen.c) for every throughput and latency cell, the "
        "Python generator for idle connections; python: the Python generator for all. "
        "Default: c when mqttgen can be built here",
    )
    parser.add_argument("--duration", type=float, default=DURATION, help="seconds")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="seconds")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell")
    parser.add_argument(
        "--backlog",
        type=int,
        default=defaults.backlog,
        help="deliveries owed before bounded-mode publishers wait; 0: no bound",
    )
    parser.add_argument("--idle-connections", type=int, default=defaults.idle_connections)
    parser.add_argument(
        "--idle-timeout", type=float, default=defaults.idle_timeout, help="seconds to connect"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=QOS1_SETTLE,
        help="QoS 1 throughput: seconds without a delivery, after the load, before the "
        "acknowledged messages never delivered are counted; 0: not counted",
    )
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=calibrate,
        help="also measure the generator's headroom (mqttgen: against its sink and with a "
        "second thread against Mosquitto, per flood scenario; Python: the null broker)",
    )
    parser.add_argument("--write", metavar="PATH", help=write_help)
    args = parser.parse_args(argv)
    args.prog = prog
    args.argv = sys.argv[1:] if argv is None else argv
    args.generator_note = None
    if args.generator is None:
        try:
            cgen.path()
            args.generator = "c"
        except cgen.GeneratorError as exc:
            args.generator = "python"
            args.generator_note = (
                f"mqttgen cannot run here ({exc}): the Python generator measured every cell"
            )
            print(f"generator: Python; {args.generator_note}", file=sys.stderr, flush=True)
    elif args.generator == "c" and not cgen.available():
        parser.error("--generator c: mqttgen cannot be built here")
    if args.modes is None:
        args.modes = COMPILED_MODES if args.generator == "c" else PYTHON_MODES
    unknown = set(args.brokers.split(",")) - set(BROKERS)
    unknown |= set(args.scenarios.split(",")) - set(BY_NAME)
    unknown |= set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown broker, scenario or mode: {', '.join(sorted(unknown))}")
    if args.generator == "python" and "paced" in args.modes.split(","):
        parser.error("the paced mode needs mqttgen (--generator c)")
    return args


def _measure_on(
    broker: BrokerSpec,
    scenario: Scenario,
    args: argparse.Namespace,
    threads: int = 1,
    label: str | None = None,
) -> Measurement:
    """One cell: a fresh broker, measured by the generator of `args` (mqttgen with
    `threads` event-loop threads; idle connections always by the Python generator)."""
    if scenario.topology in broker.unsupported:
        result = Measurement(error=f"{NOT_MEASURED}: {broker.unsupported[scenario.topology]}")
        _progress(label or broker.name, scenario, result)
        return result
    try:
        with RunningBroker(broker) as running:
            result = _run(_measure(scenario, running.target, args, threads))
            if (code := running.exit_code()) is not None:
                result.error = f"broker exited with code {code}: {running.log_tail(5)}"
    except (BrokerError, OSError, cgen.GeneratorError) as exc:
        result = Measurement(error=f"{type(exc).__name__}: {exc}")
    _progress(label or broker.name, scenario, result)
    return result


def _measure(
    scenario: Scenario, target: Target, args: argparse.Namespace, threads: int = 1
) -> Coroutine[Any, Any, Measurement]:
    if args.generator == "c" and scenario.kind in ("throughput", "latency"):
        return cgen.measure(scenario, target, _settings(args), threads)
    return measure(scenario, target, _settings(args))


def _measure_sink(scenario: Scenario, args: argparse.Namespace) -> Measurement:
    """mqttgen (one thread) against `mqttgen sink`: its own ceiling in `scenario`."""

    async def against_sink() -> Measurement:
        async with cgen.sink() as port:
            return await cgen.measure(scenario, Target(HOST, port), _settings(args))

    try:
        result = _run(against_sink())
    except (OSError, cgen.GeneratorError) as exc:
        result = Measurement(error=f"{type(exc).__name__}: {exc}")
    _progress(report.SINK, scenario, result)
    return result


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        warmup=args.warmup,
        duration=args.duration,
        backlog=args.backlog,
        idle_connections=args.idle_connections,
        idle_timeout=args.idle_timeout,
        settle=args.settle,
    )


def _run(coro: Coroutine[Any, Any, Measurement]) -> Measurement:
    """Run one measurement on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _progress(broker: str, scenario: Scenario, m: Measurement) -> None:
    figures = {
        "delivered/s": m.delivered,
        "accepted/s": m.accepted,
        "drops": m.drops,
        "p50 ms": m.p50_ms,
        "p99 ms": m.p99_ms,
        "lost": m.lost,
        "gen cpu": m.loadgen_cpu,
        "connected": m.connections,
        "conn/s": m.connect_rate,
        "KiB/conn": m.kib_per_connection,
    }
    text = "  ".join(f"{k} {v:,.2f}" for k, v in figures.items() if v is not None)
    error = f"  ERROR {m.error}" if m.error else ""
    print(f"{scenario.name:<24} {broker:<21} {text}{error}", file=sys.stderr, flush=True)


def _summary(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    brokers: list[BrokerSpec],
    raw: dict[tuple[str, str], list[Measurement]],
    calibration: list[Measurement],
    load: dict[str, str],
    versions: dict[str, str],
) -> report.Run:
    return report.Run(
        command=shlex.join([*args.prog.split(), *args.argv]),
        date=time.strftime("%Y-%m-%d %H:%M %Z"),
        machine=report.machine(versions) | load,
        settings={
            "repeats": str(args.repeats),
            "warmup": f"{args.warmup:g} s",
            "duration": f"{args.duration:g} s",
            "modes": args.modes.replace(",", ", "),
            "generator": "mqttgen (C), 1 thread" if args.generator == "c" else "Python",
            "backlog bound (bounded mode)": f"{args.backlog:,} deliveries",
            "QoS 1 settle": f"{args.settle:g} s",
            "idle connections": f"{args.idle_connections:,}",
        },
        scenarios=scenarios,
        brokers=brokers,
        results={key: report.median(values) for key, values in raw.items()},
        calibration=report.median(calibration) if calibration else None,
        generator=args.generator,
        settle=args.settle,
    )


def _save_raw(raw: Raw, calibration: list[Measurement], headroom: Raw) -> None:
    data: dict[str, Any] = {
        f"{s}/{b}": [dataclasses.asdict(m) for m in ms] for (s, b), ms in raw.items()
    }
    data["calibration"] = [dataclasses.asdict(m) for m in calibration]
    data["headroom"] = {
        f"{s}/{what}": [dataclasses.asdict(m) for m in ms] for (s, what), ms in headroom.items()
    }
    save_raw("compare", data)


if __name__ == "__main__":
    sys.exit(main())
