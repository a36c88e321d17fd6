# Rendering results as the Markdown page docs/performance.md.
#
# Strategy: the page is generated whole from one run, so figures, command line and
# machine description can never drift apart. Each cell is the median of the repeats.
from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from .brokers import MODES, BrokerSpec
from .scenarios import NOT_MEASURED, Measurement, Scenario

_MISSING = "n/a"
TARGET_RATIO = 10  # from the issue: Nautilus at least 10x amqtt in throughput
# From the flood issue: in every flood Nautilus delivers at least this share of its own
# bounded figure, and more than Mosquitto; QoS 1 floods deliver at least FLOOD_QOS1_SHARE
# of what was acknowledged, with no queue drops.
FLOOD_OF_BOUNDED = 0.9
FLOOD_QOS1_SHARE = 0.99

METHOD = """\
- One broker at a time on 127.0.0.1, a fresh process for every measurement (configs in
  `bench/brokers.py`). Nautilus: memory store (the LevelDB variants: an empty store in
  the broker's temporary directory). Mosquitto: persistence off (`persistence true` in
  its variant), TCP_NODELAY on (asyncio sets it on every socket). amqtt: from its own
  venv (`.venv-amqtt`, `requirements/amqtt.txt`), the anonymous-auth plugin only, logging
  at WARNING, on uvloop like Nautilus; it has no queue
  limits. Bounded rows, the latency and idle rows: Nautilus and Mosquitto with {bi}
  messages in flight and {bq} queued per client, as in every earlier run. Flood rows: both
  with {fi} in flight and the default queue length users run them with, {fq} messages per
  client, and their $SYS tree published every second.
- Load generator (`bench/loadgen.py`, `bench/client.py`): one process, one uvloop event
  loop, MQTT 3.1.1 over raw sockets, so the broker has the other core of a 2-core
  machine. PUBLISHes are encoded once with `broker.protocol` and written in batches;
  subscribers count deliveries by checking fixed headers with strided slices, ack QoS 1
  deliveries the same way, and read only once some bytes have piled up (SO_RCVLOWAT), so
  a broker writing packet by packet does not cost the generator a wake-up per packet.
- Throughput: messages received by all subscribers during the measured seconds, after a
  warm-up, divided by the elapsed time; what a broker still holds at the end is not
  counted. QoS 0 publishers write as fast as TCP accepts, QoS 1 publishers keep 100
  PUBLISHes unacknowledged. In bounded mode all of them also pause while more deliveries
  are owed than the backlog bound above, so a broker that queues without bound is
  measured at the rate it delivers.
- Flood: every throughput scenario again, open loop: publishers bounded only by TCP
  back-pressure and, at QoS 1, by their own window of 100, like devices that know nothing
  of subscribers. Accepted is what the broker took from publishers in the measured
  seconds: QoS 1 PUBACKs received; QoS 0 PUBLISHes it read, i.e. bytes the kernel
  accepted from the generator minus those still in the socket buffers of either end
  (`/proc/net/tcp`), which on loopback hold megabytes. Delivered % is delivered /
  (accepted x subscribers per message). Queue drops is the broker's own counter
  (`$SYS/<node>/queue/message/drop` in Nautilus, `$SYS/broker/publish/messages/dropped`
  in Mosquitto; amqtt has none) over the measured seconds, followed by one more client:
  its value at the start and end of the interval is interpolated between the $SYS rounds
  that arrived around each instant (every 1 s for Nautilus, every 2 s for Mosquitto), the
  load running on until a round after the end has arrived (n/a if none came in 3 rounds).
- Latency: one QoS 1 publisher paced at 5,000 msg/s, each payload stamped with
  `perf_counter_ns`; the subscriber (same process, QoS 1) records receive time minus
  stamp. p50 and p99 over the messages delivered in the measured seconds; the delivered
  rate shows whether the broker kept up.
- Idle connections: CONNECTs (keepalive 0) with 100 in progress at once. Connects/s is
  CONNACKs received over the time to the last one; memory is the broker's VmRSS one second
  after the last CONNACK minus VmRSS before the first CONNECT, per connection.
- Every cell is the median of the repeats; every raw figure is kept in `bench/results/`.
"""


@dataclass(frozen=True, slots=True)
class Run:
    """Everything the page describes: how the run was made and what it measured."""

    command: str
    date: str
    machine: dict[str, str]
    settings: dict[str, str]
    scenarios: Sequence[Scenario]
    brokers: Sequence[BrokerSpec]
    # (scenario name, broker name) -> the medians of its repeats
    results: dict[tuple[str, str], Measurement]
    calibration: Measurement | None = None


def machine(versions: dict[str, str]) -> dict[str, str]:
    """The machine description printed above the tables."""
    return {
        "CPU": _cpu_model(),
        "nproc": str(os.cpu_count()),
        "Kernel": platform.release(),
        "Python": platform.python_version(),
        "uvloop": _version("uvloop"),
        **versions,
    }


def median(measurements: Sequence[Measurement]) -> Measurement:
    """Field-wise median of repeated measurements; errors are kept, joined."""
    result = Measurement()
    for field in fields(Measurement):
        values = [getattr(m, field.name) for m in measurements]
        values = [v for v in values if v is not None]
        if field.name == "error":
            result.error = "; ".join(sorted(set(values))) or None
        elif values:
            setattr(result, field.name, statistics.median(values))
    return result


def render(run: Run) -> str:
    parts = [
        "# Performance\n",
        "Generated by `bench/` (see bench/README.md); do not edit by hand, rerun instead.\n",
        f"Command: `{run.command}`  \nDate: {run.date}\n",
        _table(["Machine", ""], [[k, v] for k, v in run.machine.items()]),
        "Settings: " + ", ".join(f"{k} {v}" for k, v in run.settings.items()) + ".\n",
    ]
    kinds = {s.kind for s in run.scenarios}
    if any(s.kind == "throughput" and s.bounded for s in run.scenarios):
        parts += ["## Throughput (delivered msg/s)\n", _throughput(run), _target(run)]
    if _floods(run):
        parts += ["## Flood (publishers bounded only by TCP)\n", _flood(run), _flood_targets(run)]
    if "latency" in kinds:
        parts += ["## Latency (QoS 1, publisher paced)\n", _latency(run)]
    if "idle" in kinds:
        parts += ["## Idle connections\n", _idle(run)]
    if run.calibration is not None:
        parts += ["## Load generator capacity\n", _calibration(run.calibration)]
    errors = _errors(run)
    if errors:
        parts += ["## Errors and notes\n", errors]
    parts += ["## Method\n", _method()]
    return "\n".join(parts)


def _method() -> str:
    """METHOD with the queue limits the brokers ran with."""
    limits = {"b": MODES["bounded"].limits, "f": MODES["flood"].limits}
    figures = {}
    for key, value in limits.items():
        assert value is not None
        figures[f"{key}i"], figures[f"{key}q"] = f"{value.inflight:,}", f"{value.queued:,}"
    return METHOD.format(**figures)


def _throughput(run: Run) -> str:
    names = [b.name for b in run.brokers]
    header = ["Scenario", *(b.label for b in run.brokers)]
    ratios = [
        (a, b)
        for a, b in (("nautilus", "amqtt"), ("nautilus", "mosquitto"))
        if {a, b} <= set(names)
    ]
    header += [f"{_label(run, a)} / {_label(run, b)}" for a, b in ratios]
    rows = []
    for scenario in _bounded(run):
        rates = {n: _get(run, scenario, n).delivered for n in names}
        rows.append(
            [scenario.title]
            + [_rate(rates[n]) for n in names]
            + [_ratio(rates[a], rates[b]) for a, b in ratios]
        )
    return _table(header, rows)


def _target(run: Run) -> str:
    """The issue's goal, checked: Nautilus at least 10x amqtt in every throughput row."""
    if not {"nautilus", "amqtt"} <= {b.name for b in run.brokers}:
        return ""
    ratios = {}
    for scenario in _bounded(run):
        ours, theirs = (_get(run, scenario, n) for n in ("nautilus", "amqtt"))
        if (theirs.error or "").startswith(NOT_MEASURED):
            continue  # a feature amqtt does not have
        ratios[scenario.title] = (
            ours.delivered / theirs.delivered if ours.delivered and theirs.delivered else 0.0
        )
    if not ratios:
        return ""
    missed = [title for title, ratio in ratios.items() if ratio < TARGET_RATIO]
    lowest = min(ratios, key=ratios.__getitem__)
    verdict = f"not met in: {'; '.join(missed)}" if missed else "met"
    return (
        f"Target, Nautilus at least {TARGET_RATIO:g}x amqtt in every row: {verdict} "
        f"(lowest {ratios[lowest]:.1f}x, {lowest}).\n"
    )


def _flood(run: Run) -> str:
    rows = []
    for scenario in _floods(run):
        for broker in run.brokers:
            m = _get(run, scenario, broker.name)
            share = _delivered_share(scenario, m)
            rows.append(
                [
                    scenario.title,
                    broker.label,
                    _rate(m.delivered),
                    _rate(m.accepted),
                    _MISSING if share is None else f"{share:.1%}",
                    _count(m.drops),
                ]
            )
    header = ["Scenario", "Broker", "Delivered msg/s", "Accepted msg/s", "Delivered %"]
    return (
        "Publishers write as fast as TCP accepts (QoS 1: 100 unacknowledged each), "
        "whatever has been delivered; the brokers run with their default queue limits. A "
        "broker that reads faster than it delivers has to push back or drop.\n\n"
        + _table([*header, "Queue drops"], rows)
    )


def _flood_targets(run: Run) -> str:
    """The flood issue's targets for Nautilus, checked per scenario."""
    names = {b.name for b in run.brokers}
    if "nautilus" not in names:
        return ""
    rows, missed = [], []
    for scenario in _floods(run):
        checks = [
            _of_bounded(run, scenario),
            _over_mosquitto(run, scenario) if "mosquitto" in names else None,
            _qos1_complete(run, scenario) if scenario.qos else None,
        ]
        rows.append([scenario.title] + [_verdict(c) for c in checks])
        if any(c is not None and not c[0] for c in checks):
            missed.append(scenario.title)
    header = [
        "Scenario",
        f"Nautilus >= {FLOOD_OF_BOUNDED:g}x its bounded figure",
        "Nautilus > Mosquitto",
        f"QoS 1: >= {FLOOD_QOS1_SHARE:.0%} of acked delivered, no drops",
    ]
    verdict = f"not met in: {'; '.join(missed)}" if missed else "met"
    return f"Flood targets for Nautilus: {verdict}.\n\n" + _table(header, rows)


def _of_bounded(run: Run, flood: Scenario) -> tuple[bool, str] | None:
    bounded = next((s for s in _bounded(run) if s.name == flood.base), None)
    if bounded is None:
        return None  # the bounded mode was not run
    ours, before = _get(run, flood, "nautilus").delivered, _get(run, bounded, "nautilus").delivered
    if not before or ours is None:
        return None
    return ours >= FLOOD_OF_BOUNDED * before, f"{ours / before:.2f}x"


def _over_mosquitto(run: Run, flood: Scenario) -> tuple[bool, str] | None:
    ours, theirs = (_get(run, flood, n).delivered for n in ("nautilus", "mosquitto"))
    if ours is None or theirs is None:
        return None
    figure = _ratio(ours, theirs) if ours and theirs else f"{_rate(ours)} vs {_rate(theirs)} msg/s"
    return ours > theirs, figure


def _qos1_complete(run: Run, flood: Scenario) -> tuple[bool, str] | None:
    m = _get(run, flood, "nautilus")
    share = _delivered_share(flood, m)
    if share is None:
        return None
    complete = share >= FLOOD_QOS1_SHARE
    if m.drops is None:  # not counted: only a shortfall decides
        return None if complete else (False, f"{share:.1%}, drops {_MISSING}")
    drops = round(m.drops)
    return complete and drops == 0, f"{share:.1%}, {drops:,} drops"


def _verdict(check: tuple[bool, str] | None) -> str:
    if check is None:
        return _MISSING
    held, figure = check
    return f"{'yes' if held else 'NO'} ({figure})"


def _delivered_share(scenario: Scenario, m: Measurement) -> float | None:
    """Delivered / (accepted x subscribers per message)."""
    if m.delivered is None or not m.accepted:
        return None
    return m.delivered / (m.accepted * scenario.fanout)


def store_table(
    run: Run, scenario: str, reference: str, labels: Mapping[str, str] | None = None
) -> str:
    """One row per broker, for the modes of `scenario` that were run: delivered msg/s
    (flood: also delivered %) and the ratio to the `reference` broker in the same mode.
    `labels` name the rows instead of the brokers' own labels; errors come first, so the
    table ends what this returns."""
    labels = labels or {}
    modes = [s for s in run.scenarios if s.base == scenario]
    names = [b.name for b in run.brokers]
    header, rows = ["Broker"], [[labels.get(b.name, b.label)] for b in run.brokers]
    for mode in modes:
        rates = {n: _get(run, mode, n).delivered for n in names}
        header.append(f"{mode.mode}: delivered msg/s")
        for row, name in zip(rows, names, strict=True):
            row.append(_rate(rates[name]))
        if not mode.bounded:
            header.append(f"{mode.mode}: delivered %")
            for row, name in zip(rows, names, strict=True):
                share = _delivered_share(mode, _get(run, mode, name))
                row.append(_MISSING if share is None else f"{share:.1%}")
        if reference in names:
            reference_label = labels.get(reference, _label(run, reference))
            header.append(f"{mode.mode}: ratio to {reference_label}")
            for row, name in zip(rows, names, strict=True):
                row.append(_ratio(rates[name], rates[reference], digits=2))
    errors = [
        f"- {labels.get(b.name, b.label)}, {mode.mode}: {m.error}\n"
        for mode in modes
        for b in run.brokers
        if (m := _get(run, mode, b.name)).error
    ]
    return ("Errors and notes:\n\n" + "".join(errors) + "\n" if errors else "") + _table(
        header, rows
    )


def _bounded(run: Run) -> list[Scenario]:
    return [s for s in run.scenarios if s.kind == "throughput" and s.bounded]


def _floods(run: Run) -> list[Scenario]:
    return [s for s in run.scenarios if s.kind == "throughput" and not s.bounded]


def _latency(run: Run) -> str:
    rows = []
    for scenario in (s for s in run.scenarios if s.kind == "latency"):
        for broker in run.brokers:
            m = _get(run, scenario, broker.name)
            rows.append(
                [scenario.title, broker.label, _ms(m.p50_ms), _ms(m.p99_ms), _rate(m.delivered)]
            )
    return _table(["Scenario", "Broker", "p50 (ms)", "p99 (ms)", "Delivered msg/s"], rows)


def _idle(run: Run) -> str:
    rows = []
    for scenario in (s for s in run.scenarios if s.kind == "idle"):
        for broker in run.brokers:
            m = _get(run, scenario, broker.name)
            kib = _MISSING if m.kib_per_connection is None else f"{m.kib_per_connection:.1f}"
            conns = _MISSING if m.connections is None else f"{m.connections:,.0f}"
            rows.append([scenario.title, broker.label, conns, _rate(m.connect_rate), kib])
    header = ["Scenario", "Broker", "Connected", "Connects/s", "RSS per connection (KiB)"]
    return _table(header, rows)


def _calibration(m: Measurement) -> str:
    return (
        "The 1 -> 1 QoS 0 16 B scenario against `bench/nullbroker.py`, a byte pipe that "
        "forwards the publisher's bytes unparsed: the most this generator can send and "
        "count on this machine.\n\n"
        + _table(["Published msg/s", "Delivered msg/s"], [[_rate(m.accepted), _rate(m.delivered)]])
    )


def _errors(run: Run) -> str:
    lines = [
        f"- {scenario} / {broker}: {m.error}"
        for (scenario, broker), m in run.results.items()
        if m.error
    ]
    return "\n".join(lines) + "\n" if lines else ""


def _get(run: Run, scenario: Scenario, broker: str) -> Measurement:
    return run.results.get((scenario.name, broker)) or Measurement()


def _label(run: Run, name: str) -> str:
    return next(b.label for b in run.brokers if b.name == name)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _rate(value: float | None) -> str:
    return _MISSING if value is None else f"{value:,.0f}"


def _count(value: float | None) -> str:
    return _MISSING if value is None else f"{round(value):,}"


def _ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    return _MISSING if not a or not b else f"{a / b:.{digits}f}x"


def _ms(value: float | None) -> str:
    return _MISSING if value is None else f"{value:.2f}"


def cpu_seconds() -> tuple[float, float]:
    """CPU-seconds used so far by the whole machine, and by this process and its children.

    The difference over a run is the CPU other processes took from it; children count
    once they have been waited for, as every broker is when stopped.
    """
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:9]]  # user .. steal
    machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return machine, own.user + own.system + own.children_user + own.children_system


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over `seconds`, from /proc/stat: load from elsewhere."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# -- subsections of docs/performance.md that their own commands regenerate ------------


def with_subsection(page: str, section: str, heading: str, text: str, intro: str = "") -> str:
    """`page` with `text` in place of the subsection whose heading starts with `heading`,
    from the heading to the end of its first table (notes written after the table stay);
    added at the end of `section` (made at the end of the page, with `intro`, when
    missing) when there is none."""
    start = page.find(f"\n{heading}")
    if start >= 0:
        return page[: start + 1] + text + page[_table_end(page, start + 1) :]
    found = page.find(f"\n{section}\n")
    if found < 0:
        opening = f"{section}\n\n{intro}\n" if intro else f"{section}\n\n"
        return (page.rstrip("\n") + "\n\n" if page else "") + opening + text
    following = page.find("\n## ", found + 1)
    end = len(page) if following < 0 else following + 1
    rest = "\n" + page[end:] if end < len(page) else ""
    return page[:end].rstrip("\n") + "\n\n" + text + rest


def _table_end(page: str, start: int) -> int:
    """Where the first table after `start` ends (after its last line), or where the next
    heading starts if there is no table before it."""
    heading = page.find("\n#", start + 1)
    limit = len(page) if heading < 0 else heading + 1
    table = page.find("\n|", start, limit)
    if table < 0:
        return limit
    end = table + 1
    while end < len(page) and page.startswith("|", end):
        newline = page.find("\n", end)
        end = len(page) if newline < 0 else newline + 1
    return end
