# `python -m bench.transports`: throughput over TLS and WebSockets beside plain TCP, for
# Nautilus and Mosquitto, each started with a TCP, a TLS, a WebSocket and a secure
# WebSocket listener.
#
# Strategy: compare's machinery does the measuring (bench/scenarios.py: the same
# publishers, subscribers, modes and drop counter; a fresh broker per measurement); this
# command adds the transport. The load generator's clients reach the broker's listener of
# that transport (bench/client_layers.py: uvloop's TLS, or a WebSocket handshake by
# websockets' sans-I/O client and frames handled in bulk); `tcp` is the untouched TCP
# path of every other benchmark. Brokers and transports take turns within each repeat, so
# slow drift of the machine touches every cell alike. Every cell also records the CPU the
# broker and the generator used during the measured seconds (a side near one core is the
# one that limits), and QoS 1 runs count, once the load has stopped and deliveries have
# settled, the messages acknowledged to the publisher that never reached the subscriber.
# The generator's own capacity over each transport is measured against bench/nullbroker.py
# listening over that transport. Certificates are made at run time by trustme.
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import shutil
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from websockets.exceptions import WebSocketException

from . import compare, report
from .brokers import (
    HOST,
    MODES,
    BrokerError,
    BrokerSpec,
    Mode,
    RunningBroker,
    for_mode,
    free_port,
    mosquitto_conf,
    mosquitto_path,
    nautilus_toml,
    raise_fd_limit,
)
from .client_layers import NAMES, Certificates, Transport, make_certificates, transports
from .raw import save_raw
from .scenarios import BY_NAME, Measurement, Scenario, Settings, in_modes, measure

PROG = "python -m bench.transports"
SECTION = "## Transports: TLS and WebSockets"
READING = "Reading:"  # a paragraph starting so, after the tables, is kept by --write
SCENARIOS = {
    "qos0-1to1": BY_NAME["qos0-1to1"],
    "qos1-1to1": Scenario(
        "qos1-1to1", "QoS 1, 1 -> 1, 100 in flight, 16 B", "throughput", 1, 1, qos=1, payload=16
    ),
}
BROKERS = ("nautilus", "mosquitto")
LABELS = {"nautilus": "Nautilus", "mosquitto": "Mosquitto", "null": "null broker"}
TRANSPORT_LABELS = {"tcp": "TCP", "tls": "TLS", "ws": "WebSocket", "wss": "WebSocket + TLS"}
SETTLE = 0.3  # QoS 1: seconds without a delivery before what was lost is counted


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, compare._interrupt)
    certificates = make_certificates()
    try:
        run = measure_all(args, certificates)
    except KeyboardInterrupt:
        print("interrupted: every broker started has been stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(certificates.directory, ignore_errors=True)
    block = render(run)
    print(block)
    if args.write:
        path = Path(args.write)
        page = path.read_text() if path.exists() else ""
        path.write_text(with_section(page, block))
    return 0


_MODES = ("bounded", "flood")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Throughput over TCP, TLS and WebSockets, Nautilus beside Mosquitto, "
        "one broker at a time; each broker runs a listener of every transport.",
    )
    parser.add_argument("--brokers", default=",".join(BROKERS), help="nautilus, mosquitto")
    parser.add_argument(
        "--transports", default=",".join(NAMES), help=f"comma-separated, from {', '.join(NAMES)}"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=", ".join(SCENARIOS))
    # Not paced: the Python generator (the one with TLS and WebSockets) cannot pace a load.
    parser.add_argument("--modes", default=",".join(_MODES), help=", ".join(_MODES))
    parser.add_argument("--duration", type=float, default=3.0, help="seconds")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="seconds")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell")
    parser.add_argument(
        "--backlog",
        type=int,
        default=defaults.backlog,
        help="deliveries owed before bounded-mode publishers wait; 0: no bound",
    )
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the generator against the null broker over each transport",
    )
    parser.add_argument(
        "--write", metavar="PATH", help=f"regenerate the '{SECTION}' section of this page"
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    unknown = set(args.brokers.split(",")) - set(BROKERS)
    unknown |= set(args.transports.split(",")) - set(NAMES)
    unknown |= set(args.scenarios.split(",")) - set(SCENARIOS)
    unknown |= set(args.modes.split(",")) - set(_MODES)
    if unknown:
        parser.error(f"unknown broker, transport, scenario or mode: {', '.join(sorted(unknown))}")
    return args


# The brokers: every listener in every run, the measured one on the port RunningBroker
# waits for, the others on free ports.


def _ports(measured: str, port: int) -> dict[str, int]:
    return {name: port if name == measured else free_port() for name in NAMES}


def _nautilus(mode: Mode, measured: str, certs: Certificates) -> Callable[[Path, int], list[str]]:
    types = {"tcp": "tcp", "tls": "ssl", "ws": "ws", "wss": "wss"}

    def command(workdir: Path, port: int) -> list[str]:
        ports = _ports(measured, port)
        text = nautilus_toml(mode).format(host=HOST, port=ports["tcp"])
        for name in ("tls", "ws", "wss"):
            text += f'[[listeners]]\ntype = "{types[name]}"\naddress = "{HOST}:{ports[name]}"\n'
            if name in ("tls", "wss"):
                text += f'certfile = "{certs.cert}"\nkeyfile = "{certs.key}"\n'
        config = workdir / "nautilus.toml"
        config.write_text(text)
        return [sys.executable, "-m", "broker", "--config", str(config)]

    return command


def _mosquitto(mode: Mode, measured: str, certs: Certificates) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        ports = _ports(measured, port)
        text = mosquitto_conf(mode).format(host=HOST, port=ports["tcp"])
        for name in ("tls", "ws", "wss"):
            text += f"listener {ports[name]} {HOST}\n"
            if name in ("ws", "wss"):
                # libwebsockets binds every address (IPv6 too) unless told IPv4.
                text += "protocol websockets\nsocket_domain ipv4\n"
            if name in ("tls", "wss"):
                text += f"certfile {certs.cert}\nkeyfile {certs.key}\n"
        config = workdir / "mosquitto.conf"
        config.write_text(text)
        return [mosquitto_path(), "-c", str(config)]

    return command


def _null(measured: str, certs: Certificates) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        argv = [sys.executable, "-m", "bench.nullbroker", "--host", HOST, "--port", str(port)]
        if measured in ("tls", "wss"):
            argv += ["--certfile", str(certs.cert), "--keyfile", str(certs.key)]
        if measured in ("ws", "wss"):
            argv.append("--websocket")
        return argv

    return command


def broker_spec(name: str, mode: Mode, transport: str, certs: Certificates) -> BrokerSpec:
    """`name` configured for `mode`, listening on every transport, measured on `transport`."""
    if name == "null":
        return BrokerSpec("null", LABELS["null"], _null(transport, certs), lambda: "-")
    make = _nautilus if name == "nautilus" else _mosquitto
    return replace(for_mode(mode)[name], command=make(mode, transport, certs))


# Measuring


@dataclass(slots=True)
class Results:
    """Raw measurements by (scenario name, transport, broker), and of the null broker."""

    raw: dict[tuple[str, str, str], list[Measurement]]
    calibration: dict[str, list[Measurement]]
    ciphers: dict[str, str]  # broker: TLS version and cipher the generator negotiated


@dataclass(frozen=True, slots=True)
class Run:
    command: str
    date: str
    machine: dict[str, str]
    settings: dict[str, str]
    scenarios: list[Scenario]
    brokers: list[str]
    transports: list[str]
    results: Results

    def median(self, scenario: str, transport: str, broker: str) -> Measurement:
        return report.median(self.results.raw.get((scenario, transport, broker), []))


def measure_all(args: argparse.Namespace, certs: Certificates) -> Run:
    chosen = [SCENARIOS[name] for name in args.scenarios.split(",")]
    scenarios = in_modes(chosen, args.modes.split(","))
    brokers = args.brokers.split(",")
    names = args.transports.split(",")
    clients = transports(names, certs)
    settings = Settings(
        warmup=args.warmup, duration=args.duration, backlog=args.backlog, settle=SETTLE
    )
    busy = report.cpu_busy()
    if busy > 0.1:
        print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
    versions = _versions(brokers)
    machine0, own0 = report.cpu_seconds()
    started = time.monotonic()
    results = Results(defaultdict(list), defaultdict(list), {})
    if args.calibrate:
        for _ in range(args.repeats):
            for name in names:
                spec = broker_spec("null", MODES["bounded"], name, certs)
                m = _measure_on(spec, BY_NAME["qos0-1to1"], clients[name], settings, results)
                results.calibration[name].append(m)
    for scenario in scenarios:
        mode = MODES[scenario.mode]
        for _ in range(args.repeats):
            for name in names:
                for broker in brokers:
                    spec = broker_spec(broker, mode, name, certs)
                    m = _measure_on(spec, scenario, clients[name], settings, results)
                    results.raw[scenario.name, name, broker].append(m)
    machine1, own1 = report.cpu_seconds()
    others = (machine1 - machine0 - (own1 - own0)) / (time.monotonic() - started)
    after = _versions(brokers)
    for key, version in after.items():
        if version != versions[key]:
            print(f"warning: {key} changed during the run: {version}", file=sys.stderr)
            versions[key] += f", {version} by the end of the run"
    _save_raw(results)
    return Run(
        command=shlex.join([*PROG.split(), *args.argv]),
        date=time.strftime("%Y-%m-%d %H:%M %Z"),
        machine=report.machine(versions)
        | {
            "CPU busy before the run": f"{busy:.0%}",
            "Other processes during the run": f"{others:.2f} CPUs on average",
        },
        settings={
            "repeats": str(args.repeats),
            "warmup": f"{args.warmup:g} s",
            "duration": f"{args.duration:g} s",
            "transports": args.transports.replace(",", ", "),
            "modes": args.modes.replace(",", ", "),
            "backlog bound (bounded mode)": f"{args.backlog:,} deliveries",
        },
        scenarios=scenarios,
        brokers=brokers,
        transports=names,
        results=results,
    )


def _versions(brokers: list[str]) -> dict[str, str]:
    specs = for_mode(MODES["bounded"])
    return {f"{LABELS[name]} version": specs[name].version() for name in brokers}


def _measure_on(
    spec: BrokerSpec,
    scenario: Scenario,
    transport: Transport,
    settings: Settings,
    results: Results,
) -> Measurement:
    try:
        with RunningBroker(spec) as running:
            # tcp: exactly the TCP path of every other benchmark.
            via = None if transport.name == "tcp" else transport
            target = replace(running.target, transport=via)
            if transport.ssl is not None and spec.name not in (*results.ciphers, "null"):
                results.ciphers[spec.name] = _run(_cipher(transport, target.port))
            result = _run(measure(scenario, target, settings))
            if (code := running.exit_code()) is not None:
                result.error = f"broker exited with code {code}: {running.log_tail(5)}"
    except (BrokerError, OSError, WebSocketException) as exc:
        result = Measurement(error=f"{type(exc).__name__}: {exc}")
    _progress(spec, scenario, transport, result)
    return result


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on a fresh event loop, uvloop when installed (as bench.compare does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _cipher(transport: Transport, port: int) -> str:
    """The TLS version and cipher the generator's clients negotiate with the listener."""

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

    probe = Probe()
    await transport.connect(probe, HOST, port)
    cipher = probe.transport.get_extra_info("cipher")
    probe.transport.close()
    return f"{cipher[1]} {cipher[0]}" if cipher else "unknown"


def _progress(spec: BrokerSpec, scenario: Scenario, transport: Transport, m: Measurement) -> None:
    figures = {
        "delivered/s": m.delivered,
        "accepted/s": m.accepted,
        "drops": m.drops,
        "lost": m.lost,
        "broker cpu": m.broker_cpu,
        "gen cpu": m.loadgen_cpu,
    }
    text = "  ".join(f"{k} {v:,.2f}" for k, v in figures.items() if v is not None)
    error = f"  ERROR {m.error}" if m.error else ""
    print(
        f"{scenario.name:<18} {transport.name:<4} {spec.name:<10} {text}{error}",
        file=sys.stderr,
        flush=True,
    )


def _save_raw(results: Results) -> None:
    data: dict[str, object] = {
        f"{s}/{t}/{b}": [dataclasses.asdict(m) for m in ms] for (s, t, b), ms in results.raw.items()
    }
    data["calibration"] = {
        t: [dataclasses.asdict(m) for m in ms] for t, ms in results.calibration.items()
    }
    data["ciphers"] = results.ciphers
    save_raw("transports", data)


# The report

ABOUT = """\
The same load as `bench.compare`'s scenarios, one publisher and one subscriber, over each
transport: plain TCP (the generator's usual path), TLS (`ssl` listener; the generator
encrypts with the stdlib `ssl` module's SSLObject over its TCP transport), MQTT over
WebSockets (`ws` listener, path `/mqtt`, subprotocol `mqtt`; the generator does the
upgrade with the `websockets` library's sans-I/O client, then writes one masked binary
frame per write and unwraps the broker's frames in bulk) and, as "WebSocket + TLS", both
(`wss`); see `bench/client_layers.py`. Both brokers run with a listener of every transport in
every measurement (Nautilus: `type = "tcp"`, `"ssl"`, `"ws"`, `"wss"`; Mosquitto: `listener`
blocks with `certfile`/`keyfile` and `protocol websockets`), a certificate issued by a
throw-away CA (trustme, ECDSA P-256) and the queue limits of each mode as in
`bench.compare`: bounded mode, publishers also wait while 20,000 deliveries are owed;
flood, open loop, bounded only by the transport and at QoS 1 by 100 messages in flight,
the brokers at their default queue length of 1,000. "vs TCP" divides by the same broker
over TCP in the same mode. CPU is what the broker's process and the generator's process
used during the measured seconds, in cores: on this 2-core machine a side near 1.0 is the
one that limits. Lost (QoS 1) is counted per run once the publisher has stopped and
deliveries have settled: PUBACKs the publisher received minus messages the subscriber
received, over the whole run.
"""


def render(run: Run) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in run.machine.items())
    settings = ", ".join(f"{k} {v}" for k, v in run.settings.items())
    ciphers = ", ".join(f"{LABELS[b]} {c}" for b, c in run.results.ciphers.items())
    parts = [
        f"{SECTION}\n",
        f"`{run.command}`, {run.date}.  \nMachine: {machine}.  \nSettings: {settings}"
        + (f"; TLS negotiated: {ciphers}" if ciphers else "")
        + ".\n",
        ABOUT,
        "### Delivered msg/s\n",
        _side_by_side(run),
        _losses(run),
        "### Every cell: flood figures and CPU\n",
        _cells(run),
    ]
    if run.results.calibration:
        parts += ["### Load generator capacity per transport\n", _calibration(run)]
    if errors := _errors(run):
        parts += [errors]
    return "\n".join(parts)


def _side_by_side(run: Run) -> str:
    header = ["Scenario", "Mode", "Transport"]
    for broker in run.brokers:
        header += [f"{LABELS[broker]} msg/s", f"{LABELS[broker]} vs TCP"]
    both = "nautilus" in run.brokers and "mosquitto" in run.brokers
    if both:
        header.append("Nautilus / Mosquitto")
    rows = []
    for scenario in run.scenarios:
        for name in run.transports:
            row = [scenario.title, scenario.mode, TRANSPORT_LABELS[name]]
            for broker in run.brokers:
                delivered = run.median(scenario.name, name, broker).delivered
                tcp = run.median(scenario.name, "tcp", broker).delivered
                row += [_rate(delivered), _ratio(delivered, tcp, 2)]
            if both:
                n = run.median(scenario.name, name, "nautilus").delivered
                m = run.median(scenario.name, name, "mosquitto").delivered
                row.append(_ratio(n, m, 2))
            rows.append(row)
    return _table(header, rows)


def _losses(run: Run) -> str:
    """One line per broker: QoS 1 messages acknowledged and never delivered, in any run."""
    lines = []
    for broker in run.brokers:
        runs = lost = 0
        where = []
        for (scenario, transport, name), ms in run.results.raw.items():
            if name != broker:
                continue
            for m in ms:
                if m.lost is None:
                    continue
                runs += 1
                if m.lost:
                    lost += int(m.lost)
                    where.append(f"{scenario} over {transport}: {m.lost:,.0f}")
        if not runs:
            continue
        if lost:
            text = (
                f"**{LABELS[broker]} LOST {lost:,} acknowledged QoS 1 messages** "
                f"({'; '.join(where)})"
            )
        else:
            text = f"{LABELS[broker]}: none lost in {runs} QoS 1 runs"
        lines.append(f"- {text}.")
    if not lines:
        return ""
    return "QoS 1, acknowledged to the publisher and never delivered:\n\n" + "\n".join(lines) + "\n"


def _cells(run: Run) -> str:
    header = [
        "Scenario",
        "Mode",
        "Transport",
        "Broker",
        "Delivered msg/s",
        "Accepted msg/s",
        "Delivered %",
        "Queue drops",
        "Lost (QoS 1), per run",
        "Broker CPU",
        "Generator CPU",
    ]
    rows = []
    for scenario in run.scenarios:
        for name in run.transports:
            for broker in run.brokers:
                m = run.median(scenario.name, name, broker)
                raw = run.results.raw.get((scenario.name, name, broker), [])
                lost = [f"{r.lost:,.0f}" for r in raw if r.lost is not None]
                share = None
                if m.delivered is not None and m.accepted:
                    share = m.delivered / (m.accepted * scenario.fanout)
                flood = not scenario.bounded
                rows.append(
                    [
                        scenario.title,
                        scenario.mode,
                        TRANSPORT_LABELS[name],
                        LABELS[broker],
                        _rate(m.delivered),
                        _rate(m.accepted),
                        f"{share:.1%}" if share is not None else "n/a",
                        _count(m.drops) if flood else "",
                        ", ".join(lost) if lost else "",
                        _cores(m.broker_cpu),
                        _cores(m.loadgen_cpu),
                    ]
                )
    return _table(header, rows)


def _calibration(run: Run) -> str:
    header = [
        "Transport",
        "Published msg/s",
        "Delivered msg/s",
        "vs TCP",
        "Generator CPU",
        "Null broker CPU",
    ]
    tcp = report.median(run.results.calibration.get("tcp", [])).delivered
    rows = []
    for name in run.transports:
        m = report.median(run.results.calibration.get(name, []))
        published = None if m.accepted is None else m.accepted
        rows.append(
            [
                TRANSPORT_LABELS[name],
                _rate(published),
                _rate(m.delivered),
                _ratio(m.delivered, tcp, 2),
                _cores(m.loadgen_cpu),
                _cores(m.broker_cpu),
            ]
        )
    intro = (
        "The QoS 0 1 -> 1 16 B scenario (bounded) against `bench/nullbroker.py` listening over"
        " each transport: a byte pipe that forwards the publisher's MQTT bytes unparsed"
        " (decrypted and encrypted again for TLS; unmasked, and sent on as one binary frame"
        " per chunk read, as Nautilus frames a loop turn's writes, for WebSockets). It is"
        " the most this generator sends and counts over the transport on this machine"
        " (a lower bound where the generator's CPU is well under 1: the pipe, in Python,"
        " then limits).\n"
    )
    return intro + "\n" + _table(header, rows)


def _errors(run: Run) -> str:
    lines = []
    for (scenario, transport, broker), ms in sorted(run.results.raw.items()):
        for m in ms:
            if m.error:
                lines.append(f"- {scenario} over {transport} / {LABELS[broker]}: {_line(m.error)}")
    for transport, ms in run.results.calibration.items():
        for m in ms:
            if m.error:
                lines.append(f"- calibration over {transport}: {_line(m.error)}")
    return "Errors and notes:\n\n" + "\n".join(sorted(set(lines))) + "\n" if lines else ""


def _line(error: str) -> str:
    """An error on one line: its first and last lines (a traceback's exception)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "n/a" if a is None or not b else f"{a / b:.{digits}f}x"


def _cores(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def with_section(page: str, block: str) -> str:
    """`page` with `block` as its transports section: in place of the old one (whose
    paragraphs from the first line starting with READING on are kept), else before
    "## Plugins" (else at the end)."""
    start = page.find(f"\n{SECTION}\n")
    if start >= 0:
        following = page.find("\n## ", start + 1)
        end = len(page) if following < 0 else following + 1
        old = page[start + 1 : end]
        kept = old.find(f"\n{READING}")
        tail = "\n" + old[kept + 1 :] if kept >= 0 else "\n"
        return page[: start + 1] + block.rstrip("\n") + "\n" + tail + page[end:]
    plugins = page.find("\n## Plugins\n")
    if plugins < 0:
        return (page.rstrip("\n") + "\n\n" if page else "") + block
    return page[: plugins + 1] + block.rstrip("\n") + "\n\n" + page[plugins + 1 :]


if __name__ == "__main__":
    sys.exit(main())
