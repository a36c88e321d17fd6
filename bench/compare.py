# `python -m bench.compare`: every scenario against every broker, one broker at a time.
#
# Strategy: each measurement gets a fresh broker process, so no backlog, memory or client
# of one measurement leaks into the next. Brokers take turns within each repeat, so slow
# drift of the machine touches all of them alike; the report shows the median of the
# repeats and bench/results/ keeps every raw figure. A failed measurement is recorded with
# its error and the run goes on. Throughput scenarios run once per mode (--modes): the
# flood variant of each comes right after its bounded runs, with the brokers configured
# for that mode (bench/brokers.py, MODES).
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shlex
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from . import report
from .brokers import (
    BROKERS,
    MODES,
    REPO,
    BrokerError,
    BrokerSpec,
    RunningBroker,
    for_mode,
    raise_fd_limit,
)
from .scenarios import (
    BY_NAME,
    NOT_MEASURED,
    SCENARIOS,
    Measurement,
    Scenario,
    Settings,
    in_modes,
    measure,
)

DEFAULT_BROKERS = "nautilus,mosquitto,amqtt"
RESULTS = REPO / "bench" / "results"


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
    busy = report.cpu_busy()
    if busy > 0.1:
        print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
    versions = _versions(brokers)
    machine0, own0 = report.cpu_seconds()
    started = time.monotonic()
    try:
        raw, calibration = _run_all(args, scenarios, brokers)
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
    _save_raw(raw, calibration)
    return _summary(args, scenarios, brokers, raw, calibration, load, versions)


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


def _run_all(
    args: argparse.Namespace, scenarios: list[Scenario], brokers: list[BrokerSpec]
) -> tuple[dict[tuple[str, str], list[Measurement]], list[Measurement]]:
    raw: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    calibration = []
    if args.calibrate:
        for _ in range(args.repeats):
            calibration.append(_measure_on(BROKERS["null"], BY_NAME["qos0-1to1"], args))
    configured = {name: for_mode(mode) for name, mode in MODES.items()}
    for scenario in scenarios:
        for _ in range(args.repeats):
            for broker in brokers:
                spec = configured[scenario.mode][broker.name]
                raw[scenario.name, broker.name].append(_measure_on(spec, scenario, args))
    return raw, calibration


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
) -> argparse.Namespace:
    """The command line of `compare`; another command (bench/store_throughput.py) passes
    its own name and defaults."""
    defaults = Settings()
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--brokers", default=brokers, help=f"from {', '.join(BROKERS)}")
    parser.add_argument("--scenarios", default=scenarios, help="comma-separated")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="throughput modes, comma-separated: bounded (publishers wait for the backlog "
        "bound), flood (only TCP and the QoS 1 window; brokers at their default limits)",
    )
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds")
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
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=calibrate,
        help="also measure the generator against the null broker",
    )
    parser.add_argument("--write", metavar="PATH", help=write_help)
    args = parser.parse_args(argv)
    args.prog = prog
    args.argv = sys.argv[1:] if argv is None else argv
    unknown = set(args.brokers.split(",")) - set(BROKERS)
    unknown |= set(args.scenarios.split(",")) - set(BY_NAME)
    unknown |= set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown broker, scenario or mode: {', '.join(sorted(unknown))}")
    return args


def _measure_on(broker: BrokerSpec, scenario: Scenario, args: argparse.Namespace) -> Measurement:
    if scenario.topology in broker.unsupported:
        result = Measurement(error=f"{NOT_MEASURED}: {broker.unsupported[scenario.topology]}")
        _progress(broker, scenario, result)
        return result
    try:
        with RunningBroker(broker) as running:
            result = _run(measure(scenario, running.target, _settings(args)))
            if (code := running.exit_code()) is not None:
                result.error = f"broker exited with code {code}: {running.log_tail(5)}"
    except (BrokerError, OSError) as exc:
        result = Measurement(error=f"{type(exc).__name__}: {exc}")
    _progress(broker, scenario, result)
    return result


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        warmup=args.warmup,
        duration=args.duration,
        backlog=args.backlog,
        idle_connections=args.idle_connections,
        idle_timeout=args.idle_timeout,
    )


def _run(coro: Coroutine[Any, Any, Measurement]) -> Measurement:
    """Run one measurement on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _progress(broker: BrokerSpec, scenario: Scenario, m: Measurement) -> None:
    figures = {
        "delivered/s": m.delivered,
        "accepted/s": m.accepted,
        "drops": m.drops,
        "p50 ms": m.p50_ms,
        "p99 ms": m.p99_ms,
        "connected": m.connections,
        "conn/s": m.connect_rate,
        "KiB/conn": m.kib_per_connection,
    }
    text = "  ".join(f"{k} {v:,.2f}" for k, v in figures.items() if v is not None)
    error = f"  ERROR {m.error}" if m.error else ""
    print(f"{scenario.name:<24} {broker.name:<21} {text}{error}", file=sys.stderr, flush=True)


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
            "backlog bound (bounded mode)": f"{args.backlog:,} deliveries",
            "idle connections": f"{args.idle_connections:,}",
        },
        scenarios=scenarios,
        brokers=brokers,
        results={key: report.median(values) for key, values in raw.items()},
        calibration=report.median(calibration) if calibration else None,
    )


def _save_raw(
    raw: dict[tuple[str, str], list[Measurement]], calibration: list[Measurement]
) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / time.strftime("%Y%m%d-%H%M%S.json")
    data = {f"{s}/{b}": [dataclasses.asdict(m) for m in ms] for (s, b), ms in raw.items()}
    data["calibration"] = [dataclasses.asdict(m) for m in calibration]
    path.write_text(json.dumps(data, indent=1))
    print(f"raw results: {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
