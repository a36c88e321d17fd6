# Rendering results as the Markdown page docs/performance.md.
#
# Strategy: the page is generated whole from one run, so figures, command line and
# machine description can never drift apart. Each cell is the median of the repeats.
# The targets of issue 25 (Nautilus against Mosquitto, measured by a generator that is
# not the limit) are checked from the same cells, each with its figures.
from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from .brokers import MODES, BrokerSpec
from .scenarios import NOT_MEASURED, Measurement, Scenario

_MISSING = "n/a"
TARGET_RATIO = 10  # from the issue: Nautilus at least 10x amqtt in throughput
# Issue 25's targets for Nautilus against Mosquitto, medians on the 2-core machine:
OVER_MOSQUITTO = 1.5  # every flood and paced row delivers at least this x Mosquitto's
QOS1_SHARE = 0.999  # QoS 1 rows deliver this share of what was acknowledged, no drops
P99_OF_MOSQUITTO = 2.0  # latency rows: p99 at most this x Mosquitto's
FLOOD_OF_PACED = 0.9  # flood >= this x min(the same broker paced, the offered rate)
IDLE_KIB = 2.0  # idle memory per connection
# Headroom: Mosquitto's rate moving more than this with a second generator thread says
# the generator was (part of) the limit.
THREADS_MOVE = 0.10

# The sink and Mosquitto with a second generator thread, in Run.headroom.
SINK, MOSQUITTO_2T = "sink", "mosquitto-2threads"

# The (Nautilus, Mosquitto) pairs the targets compare: as measured without plugins
# (issue 25's targets), and both as the design card's users run them (bench/deployed.py,
# issue 42's: the same, and QoS 0 floods delivering 100 % where Mosquitto does).
PLAIN, DEPLOYED = ("nautilus", "mosquitto"), ("nautilus-deployed", "mosquitto-deployed")
QOS0_SHARE = 0.995  # "100 % delivered" (shown as 99.5 % and up), QoS 0 floods, deployed


def pairs_of(names: Iterable[str]) -> list[tuple[str, str]]:
    """The pairs whose brokers are both among `names`, the plain one first."""
    present = set(names)
    return [pair for pair in (PLAIN, DEPLOYED) if set(pair) <= present]


def headroom_pair(names: Iterable[str]) -> tuple[str, str]:
    """The Nautilus and Mosquitto of the generator headroom (Mosquitto is measured again
    with a second generator thread): the plain ones, or the deployed ones in a run
    without the plain Mosquitto."""
    present = set(names)
    return DEPLOYED if "mosquitto" not in present and DEPLOYED[1] in present else PLAIN


_BROKERS = """\
- One broker at a time on 127.0.0.1, a fresh process for every measurement (configs in
  `bench/brokers.py`). Nautilus: memory store (the LevelDB variants: an empty store in
  the broker's temporary directory). Mosquitto: persistence off (`persistence true` in
  its variant), TCP_NODELAY on (asyncio sets it on every socket). amqtt: from its own
  venv (`.venv-amqtt`, `requirements/amqtt.txt`), the anonymous-auth plugin only, logging
  at WARNING, on uvloop like Nautilus; it has no queue
  limits. Bounded rows, the latency and idle rows: Nautilus and Mosquitto with {bi}
  messages in flight and {bq} queued per client, as in every earlier run. Flood and paced
  rows: both with {fi} in flight and the default queue length users run them with, {fq}
  messages per client, and their $SYS tree published every second.
"""
_DEPLOYED = """\
- Deployed variants (`bench/deployed.py`), as the design card's users run the brokers:
  no anonymous clients, every client logs in and every PUBLISH and SUBSCRIBE is checked
  against a per-user ACL pattern (`%u/#`; the load's clients are the user `bench`, whose
  tree holds the scenarios' topics, the drop counter's client a user that may read $SYS
  only). Nautilus: `auth_jwt` (HS256), the `acl` plugin, LevelDB (`sync = true`), the
  event relay with one consumer process reading every event (its CPU not counted).
  Mosquitto: `password_file` (PBKDF2-SHA512, as `mosquitto_passwd` writes it),
  `acl_file`, `persistence true`.
"""
_MQTTGEN = """\
- Load generator: mqttgen (`bench/mqttgen.c`, driven by `bench/cgen.py`), compiled C,
  one process with one epoll event-loop thread (the broker has the other core of a
  2-core machine), MQTT 3.1.1 over plain TCP, every client connected and subscribed
  before the first PUBLISH. PUBLISHes are encoded once per publisher and written in
  batches of up to 64 KiB; subscribers parse every packet, ack QoS 1 deliveries with one
  write per read, and are woken only once some bytes have piled up (SO_RCVLOWAT, the read
  mark: 16 KiB in a QoS 0 flood, an eighth of the broker's in-flight window's bytes at
  QoS 1, every byte when paced), so a broker that writes packet by packet does not pay a
  wake-up per packet. Every payload starts with a CLOCK_MONOTONIC stamp written when the
  packet is handed to the kernel, then the publisher's number and a sequence number:
  latency is measured on every delivery, and a QoS 1 row counts exactly which
  acknowledged messages never arrived. Its headroom per scenario is in "Generator
  headroom". The Python generator (`bench/loadgen.py`, `bench/client.py`: one uvloop
  process) measures only the idle connections here, and the TLS and WebSocket transports
  (their own section): mqttgen speaks plain TCP only.
"""
_PYTHON = """\
- Load generator (`bench/loadgen.py`, `bench/client.py`): one process, one uvloop event
  loop, MQTT 3.1.1 over raw sockets, so the broker has the other core of a 2-core
  machine. PUBLISHes are encoded once with `broker.protocol` and written in batches;
  subscribers count deliveries by checking fixed headers with strided slices, ack QoS 1
  deliveries the same way, and read only once some bytes have piled up (SO_RCVLOWAT), so
  a broker writing packet by packet does not cost the generator a wake-up per packet.
  It cannot pace a throughput load, so this run has no paced rows.
"""
_THROUGHPUT = """\
- Throughput: messages received by all subscribers during the measured seconds, after a
  warm-up, divided by the elapsed time; what a broker still holds at the end is not
  counted. QoS 0 publishers write as fast as TCP accepts, QoS 1 publishers keep 100
  PUBLISHes unacknowledged. In bounded mode all of them also pause while more deliveries
  are owed than the backlog bound above (messages published x subscribers per message -
  delivered), so a broker that queues without bound is measured at the rate it delivers.
- Flood: every throughput scenario again, open loop: publishers bounded only by TCP
  back-pressure and, at QoS 1, by their own window of 100, like devices that know nothing
  of subscribers. Accepted is what the broker took from publishers in the measured
  seconds: QoS 1 PUBACKs received; QoS 0 PUBLISHes it read, i.e. bytes the kernel
  accepted from the generator minus those still in the socket buffers of either end
  (`SIOCOUTQ`, `/proc/net/tcp`), which on loopback hold megabytes. Delivered % is
  delivered / (accepted x subscribers per message). Queue drops is the broker's own
  counter (`$SYS/<node>/queue/message/drop` in Nautilus,
  `$SYS/broker/publish/messages/dropped` in Mosquitto; amqtt has none) over the measured
  seconds, followed by one more client: its value at the start and end of the interval
  is interpolated between the $SYS rounds that arrived around each instant (every 1 s for
  Nautilus, every 2 s for Mosquitto), the load running on until a round after the end has
  arrived (n/a if none came in 3 rounds).
"""
_PACED = """\
- Paced: every throughput scenario again, the publishers offering a fixed total rate
  (split evenly, what is due sent every millisecond, at most 10 ms of missed schedule at
  once; QoS 1 also within the window of 100), the brokers configured as for flood. The
  rates are ~1.5x what Mosquitto delivers flooded on this machine, so the row shows who
  keeps up with a steady load beyond that. Offered counts deliveries (fan-out: PUBLISHes
  x 100 subscribers).
- QoS 1 rows: once the load has stopped, the generator waits until nothing has arrived for
  {settle} (10 s at most) and counts the acknowledged messages never delivered over the
  whole run; "delivered of acked" in the targets is 1 - lost / acked.
"""
_LATENCY_C = """\
- Latency: the publishers paced at the row's rate, one both Mosquitto and Nautilus keep
  up with; p50, p99 and p99.9 of receive time minus stamp over every delivery of the
  measured seconds; the delivered rate shows whether the broker kept up.
"""
_LATENCY_PYTHON = """\
- Latency: one QoS 1 publisher paced at 5,000 msg/s, each payload stamped with
  `perf_counter_ns`; the subscriber (same process, QoS 1) records receive time minus
  stamp. p50 and p99 over the messages delivered in the measured seconds; the delivered
  rate shows whether the broker kept up.
"""
_REST = """\
- Idle connections (Python generator): CONNECTs (keepalive 0) with 100 in progress at
  once. Connects/s is CONNACKs received over the time to the last one; memory is the
  broker's VmRSS one second after the last CONNACK minus VmRSS before the first CONNECT,
  per connection.
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
    calibration: Measurement | None = None  # the Python generator against the null broker
    # "c": mqttgen measured the throughput and latency cells; "python": bench/loadgen.py
    generator: str = "python"
    # mqttgen's headroom: (flood scenario name, SINK or MOSQUITTO_2T) -> the medians
    headroom: dict[tuple[str, str], Measurement] = field(default_factory=dict)
    notes: Sequence[str] = ()  # shown under "Errors and notes"
    settle: float = 0.0  # seconds without a delivery before QoS 1 `lost` is counted


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
    for field_ in fields(Measurement):
        values = [getattr(m, field_.name) for m in measurements]
        values = [v for v in values if v is not None]
        if field_.name == "error":
            result.error = "; ".join(sorted(set(values))) or None
        elif values:
            setattr(result, field_.name, statistics.median(values))
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
    if _bounded(run):
        parts += ["## Throughput (delivered msg/s)\n", _throughput(run), _target(run)]
    if _floods(run):
        parts += ["## Flood (publishers bounded only by TCP)\n", _flood(run)]
    if _paced(run):
        parts += ["## Paced (a steady offered rate, above Mosquitto's flood rate)\n"]
        parts += [_paced_table(run)]
    if "latency" in kinds:
        parts += ["## Latency (publishers paced)\n", _latency(run)]
    if "idle" in kinds:
        parts += ["## Idle connections\n", _idle(run)]
    for pair in pairs_of(b.name for b in run.brokers):
        targets = _targets(run, pair)
        if targets:
            heading = "Targets: Nautilus against Mosquitto"
            if pair == DEPLOYED:
                heading += ", both as deployed"
            parts += [f"## {heading}\n", targets]
    if run.headroom:
        parts += ["## Generator headroom\n", _headroom(run)]
    elif run.calibration is not None:
        parts += ["## Load generator capacity\n", _calibration(run.calibration)]
    errors = _errors(run)
    if errors:
        parts += ["## Errors and notes\n", errors]
    parts += ["## Method\n", _method(run)]
    return "\n".join(part for part in parts if part)


def _method(run: Run) -> str:
    """The method, for the generator of the run, with the queue limits the brokers ran
    with."""
    limits = {"b": MODES["bounded"].limits, "f": MODES["flood"].limits}
    figures = {}
    for key, value in limits.items():
        assert value is not None
        figures[f"{key}i"], figures[f"{key}q"] = f"{value.inflight:,}", f"{value.queued:,}"
    compiled = run.generator == "c"
    parts = [_BROKERS.format(**figures)]
    if any(b.name in DEPLOYED for b in run.brokers):
        parts.append(_DEPLOYED)
    parts += [_MQTTGEN if compiled else _PYTHON, _THROUGHPUT]
    if compiled:
        settle = f"{run.settle:g} s" if run.settle else "a moment"
        parts.append(_PACED.format(settle=settle))
    parts += [_LATENCY_C if compiled else _LATENCY_PYTHON, _REST]
    return "".join(parts)


def _throughput(run: Run) -> str:
    names = [b.name for b in run.brokers]
    header = ["Scenario", *(b.label for b in run.brokers)]
    ratios = [(a, b) for a, b in (("nautilus", "amqtt"), PLAIN, DEPLOYED) if {a, b} <= set(names)]
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
        for broker in _measured(run, scenario):
            m = _get(run, scenario, broker.name)
            share = _delivered_share(scenario, m)
            rows.append(
                [
                    scenario.title,
                    broker.label,
                    _rate(m.delivered),
                    _rate(m.accepted),
                    _percent(share),
                    _count(m.drops),
                    _cpu(m),
                ]
            )
    header = ["Scenario", "Broker", "Delivered msg/s", "Accepted msg/s", "Delivered %"]
    return (
        "Publishers write as fast as TCP accepts (QoS 1: 100 unacknowledged each), "
        "whatever has been delivered; the brokers run with their default queue limits. A "
        "broker that reads faster than it delivers has to push back or drop. CPU: cores "
        "the broker's and the generator's processes used during the measured seconds.\n\n"
        + _table([*header, "Queue drops", "CPU broker / generator"], rows)
    )


def _paced_table(run: Run) -> str:
    rows = []
    for scenario in _paced(run):
        offered = scenario.rate * scenario.fanout
        for broker in _measured(run, scenario):
            m = _get(run, scenario, broker.name)
            share = _share(m.delivered, offered)
            rows.append(
                [
                    scenario.title,
                    broker.label,
                    _rate(offered),
                    _rate(m.delivered),
                    _percent(share),
                    _rate(m.accepted),
                    _count(m.drops),
                    _cpu(m),
                ]
            )
    header = ["Scenario", "Broker", "Offered msg/s", "Delivered msg/s", "Of offered"]
    return (
        "Publishers send a fixed total rate, ~1.5x what Mosquitto delivers flooded on this "
        "machine (fan-out: offered deliveries, PUBLISHes x 100); the brokers run as in the "
        "flood rows. Accepted: PUBLISHes the broker read (QoS 1: acked), per second.\n\n"
        + _table([*header, "Accepted msg/s", "Queue drops", "CPU broker / generator"], rows)
    )


def _measured(run: Run, scenario: Scenario) -> list[BrokerSpec]:
    """The brokers with a cell for `scenario` (amqtt has none in most open-loop rows)."""
    return [b for b in run.brokers if (scenario.name, b.name) in run.results]


def _cpu(m: Measurement) -> str:
    broker = _MISSING if m.broker_cpu is None else f"{m.broker_cpu:.2f}"
    generator = _MISSING if m.loadgen_cpu is None else f"{m.loadgen_cpu:.2f}"
    return f"{broker} / {generator}"


# -- the targets ------------------------------------------------------------------------

# One checked target: held (None: could not be checked), Nautilus's figure, Mosquitto's.
Check = tuple[bool | None, str, str]


def _targets(run: Run, pair: tuple[str, str]) -> str:
    """The targets for Nautilus against Mosquitto (`pair`: their broker names), one row
    per check: issue 25's, and for the deployed pair issue 42's."""
    rows: list[list[str]] = []
    missed: list[str] = []

    def add(row: str, target: str, check: Check) -> None:
        held, ours, theirs = check
        verdict = _MISSING if held is None else "yes" if held else "NO"
        rows.append([row, target, ours, theirs, verdict])
        if held is False:
            missed.append(f"{row} ({target})")

    throughput = [s for s in run.scenarios if s.kind == "throughput"]
    for scenario in throughput:
        row = f"{scenario.title}, {scenario.mode}"
        if not scenario.bounded:
            target = f"delivered >= {OVER_MOSQUITTO:g}x Mosquitto"
            add(row, target, _over_mosquitto(run, scenario, pair))
        if scenario.qos:
            target = f"QoS 1: >= {QOS1_SHARE:.1%} of acked delivered, no queue drops"
            add(row, target, _qos1_complete(run, scenario, pair))
        elif pair == DEPLOYED and scenario.mode == "flood":
            target = "QoS 0: 100 % delivered where Mosquitto delivers 100 %"
            add(row, target, _qos0_complete(run, scenario, pair))
        if scenario.mode == "flood":
            reference = _flood_reference(run, scenario, pair)
            if reference is not None:
                target, check = reference
                add(row, target, check)
    for scenario in (s for s in run.scenarios if s.kind == "latency"):
        add(scenario.title, f"p99 <= {P99_OF_MOSQUITTO:g}x Mosquitto's", _p99(run, scenario, pair))
    for scenario in (s for s in run.scenarios if s.kind == "idle"):
        add(
            scenario.title,
            f"memory <= {IDLE_KIB:g} KiB per connection",
            _idle_memory(run, scenario, pair),
        )
    if not rows:
        return ""
    checked = sum(1 for r in rows if r[-1] != _MISSING)
    verdict = "all met" if not missed else f"{checked - len(missed)} of {checked} met"
    issue = "Issue 42 (both as deployed)" if pair == DEPLOYED else "Issue 25"
    intro = (
        f"{issue}, medians on this machine: {verdict}"
        + (f"; not met: {'; '.join(missed)}" if missed else "")
        + ". n/a: not measured in this run.\n\n"
    )
    return intro + _table(["Row", "Target", "Nautilus", "Mosquitto", "Met"], rows)


def _over_mosquitto(run: Run, scenario: Scenario, pair: tuple[str, str]) -> Check:
    ours, theirs = (_get(run, scenario, n).delivered for n in pair)
    if ours is None or theirs is None:
        return None, _rate(ours), _rate(theirs)
    held = ours >= OVER_MOSQUITTO * theirs
    return held, f"{_rate(ours)} ({_ratio(ours, theirs, 2)})", _rate(theirs)


def _qos1_complete(run: Run, scenario: Scenario, pair: tuple[str, str]) -> Check:
    ours, theirs = (_completeness(scenario, _get(run, scenario, n)) for n in pair)
    return ours[0], ours[1], theirs[1]


def _qos0_complete(run: Run, scenario: Scenario, pair: tuple[str, str]) -> Check:
    """A QoS 0 flood delivers all it accepted, checked where Mosquitto does (n/a where
    it does not: a row where dropping is what both brokers are expected to do)."""
    ours, theirs = (_delivered_share(scenario, _get(run, scenario, n)) for n in pair)
    figures = _percent(ours), _percent(theirs)
    if ours is None or theirs is None or theirs < QOS0_SHARE:
        return None, *figures
    return ours >= QOS0_SHARE, *figures


def _completeness(scenario: Scenario, m: Measurement) -> tuple[bool | None, str]:
    """QoS 1: the share of acknowledged messages delivered (from `lost` when counted, else
    delivered / accepted over the measured seconds) and the queue drops."""
    if m.lost is not None and m.acked:
        share: float | None = 1 - m.lost / (m.acked * scenario.fanout)
        figure = f"{share:.2%} ({_count(m.lost)} lost of {_count(m.acked)})"
    else:
        share = _delivered_share(scenario, m)
        figure = _MISSING if share is None else f"{share:.2%} (delivered / accepted)"
    if share is None:
        return None, _MISSING
    complete = share >= QOS1_SHARE
    if m.drops is None:  # not counted (bounded mode, or no round came): only the share
        return complete, figure
    drops = round(m.drops)
    return complete and drops == 0, f"{figure}, {drops:,} drops"


def _flood_reference(run: Run, flood: Scenario, pair: tuple[str, str]) -> tuple[str, Check] | None:
    """Nautilus flooded against the same broker paced (a paced row offers more than it
    delivers, so against what it delivered there, or the offered rate if lower); without
    a paced row, against its bounded row."""
    paced = _mode_of(run, flood, "paced")
    reference = paced or _mode_of(run, flood, "bounded")
    if reference is None:
        return None
    nautilus, mosquitto = pair
    ours = _get(run, flood, nautilus).delivered
    before = _get(run, reference, nautilus).delivered
    theirs = _get(run, flood, mosquitto).delivered
    theirs_before = _get(run, reference, mosquitto).delivered
    if paced is not None:
        offered = paced.rate * paced.fanout
        target = f"flood >= {FLOOD_OF_PACED:g}x min(paced delivered, offered)"
        base = None if before is None else min(before, offered)
        theirs_base = None if theirs_before is None else min(theirs_before, offered)
    else:
        target = f"flood >= {FLOOD_OF_PACED:g}x bounded (no paced row)"
        base, theirs_base = before, theirs_before
    figure = f"{_rate(theirs)} / {_rate(theirs_base)} ({_ratio(theirs, theirs_base, 2)})"
    if ours is None or not base:
        return target, (None, f"{_rate(ours)} / {_rate(base)}", figure)
    held = ours >= FLOOD_OF_PACED * base
    return target, (held, f"{_rate(ours)} / {_rate(base)} ({ours / base:.2f}x)", figure)


def _mode_of(run: Run, scenario: Scenario, mode: str) -> Scenario | None:
    return next(
        (
            s
            for s in run.scenarios
            if s.kind == "throughput" and s.base == scenario.base and s.mode == mode
        ),
        None,
    )


def _p99(run: Run, scenario: Scenario, pair: tuple[str, str]) -> Check:
    ours, theirs = (_get(run, scenario, n) for n in pair)
    figures = (_latency_figure(ours), _latency_figure(theirs))
    if ours.p99_ms is None or not theirs.p99_ms:
        return None, figures[0], figures[1]
    held = ours.p99_ms <= P99_OF_MOSQUITTO * theirs.p99_ms
    return held, f"{figures[0]} ({ours.p99_ms / theirs.p99_ms:.1f}x)", figures[1]


def _latency_figure(m: Measurement) -> str:
    return _MISSING if m.p99_ms is None else f"{m.p99_ms:.2f} ms at {_rate(m.delivered)} msg/s"


def _idle_memory(run: Run, scenario: Scenario, pair: tuple[str, str]) -> Check:
    ours, theirs = (_get(run, scenario, n).kib_per_connection for n in pair)
    figures = [_MISSING if v is None else f"{v:.1f} KiB" for v in (ours, theirs)]
    return None if ours is None else ours <= IDLE_KIB, figures[0], figures[1]


def _delivered_share(scenario: Scenario, m: Measurement) -> float | None:
    """Delivered / (accepted x subscribers per message)."""
    return _share(m.delivered, m.accepted and m.accepted * scenario.fanout)


def _share(part: float | None, whole: float | None) -> float | None:
    """part / whole; None when either is unknown or the whole is 0."""
    return None if part is None or not whole else part / whole


def _percent(share: float | None) -> str:
    return _MISSING if share is None else f"{share:.1%}"


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
                row.append(_percent(share))
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
    return [s for s in run.scenarios if s.kind == "throughput" and s.mode == "flood"]


def _paced(run: Run) -> list[Scenario]:
    return [s for s in run.scenarios if s.kind == "throughput" and s.mode == "paced"]


def _latency(run: Run) -> str:
    rows = []
    latency = [s for s in run.scenarios if s.kind == "latency"]
    cells = [_get(run, s, b.name) for s in latency for b in _measured(run, s)]
    p999 = any(m.p999_ms is not None for m in cells)  # the compiled generator's
    for scenario in latency:
        for broker in _measured(run, scenario):
            m = _get(run, scenario, broker.name)
            row = [scenario.title, broker.label, _rate(scenario.rate * scenario.fanout)]
            row += [_ms(m.p50_ms), _ms(m.p99_ms)] + ([_ms(m.p999_ms)] if p999 else [])
            rows.append([*row, _rate(m.delivered)])
    header = ["Scenario", "Broker", "Offered msg/s", "p50 (ms)", "p99 (ms)"]
    header += ["p99.9 (ms)"] if p999 else []
    return _table([*header, "Delivered msg/s"], rows)


def _idle(run: Run) -> str:
    rows = []
    for scenario in (s for s in run.scenarios if s.kind == "idle"):
        for broker in _measured(run, scenario):
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


def _headroom(run: Run) -> str:
    """Per flood scenario: mqttgen against its sink, Mosquitto with one and two generator
    threads, and the generator's CPU in the Mosquitto and Nautilus cells."""
    rows = []
    unsure = []
    nautilus, mosquitto = headroom_pair(b.name for b in run.brokers)
    for scenario in _floods(run):
        sink = run.headroom.get((scenario.name, SINK)) or Measurement()
        two = run.headroom.get((scenario.name, MOSQUITTO_2T)) or Measurement()
        one = _get(run, scenario, mosquitto)
        ours = _get(run, scenario, nautilus)
        moved = None
        if one.delivered and two.delivered:
            moved = two.delivered / one.delivered
            if abs(moved - 1) > THREADS_MOVE:
                unsure.append(scenario.title)
        rows.append(
            [
                scenario.title,
                _rate(sink.delivered),
                _MISSING if sink.loadgen_cpu is None else f"{sink.loadgen_cpu:.2f}",
                _rate(one.delivered),
                _rate(two.delivered),
                _MISSING if moved is None else f"{moved:.2f}x",
                _ratio(sink.delivered, one.delivered),
                _cores(one.loadgen_cpu),
                _cores(ours.loadgen_cpu),
            ]
        )
    header = [
        "Flood scenario",
        "mqttgen vs sink, 1 thread (delivered msg/s)",
        "its CPU (cores)",
        "Mosquitto, 1 thread",
        "Mosquitto, 2 threads",
        "2 / 1 threads",
        "Sink / Mosquitto",
        "Generator CPU vs Mosquitto",
        "Generator CPU vs Nautilus",
    ]
    verdict = (
        f"Mosquitto's rate moved by more than {THREADS_MOVE:.0%} with a second generator "
        f"thread in: {'; '.join(unsure)}: there the generator may be part of the limit."
        if unsure
        else f"Mosquitto's rate moved by at most {THREADS_MOVE:.0%} with a second generator "
        "thread in every row measured: the generator was not the limit."
    )
    return (
        "The generator is not the limit when it reaches far more against `mqttgen sink` (a "
        "broker-less epoll loop that answers and forwards like a broker, one core: the "
        "ceiling of generator and a near-free broker together) than against any broker, "
        "and when the fastest broker's rate does not move with a second generator thread. "
        "Generator CPU: cores mqttgen used in the flood cells of the throughput tables (one "
        f"thread). {verdict}\n\n" + _table(header, rows)
    )


def _cores(value: float | None) -> str:
    return _MISSING if value is None else f"{value:.2f}"


def _errors(run: Run) -> str:
    lines = [f"- {note}" for note in run.notes]
    lines += [
        f"- {scenario} / {broker}: {m.error}"
        for (scenario, broker), m in run.results.items()
        if m.error
    ]
    lines += [
        f"- {scenario} / {what}: {m.error}"
        for (scenario, what), m in run.headroom.items()
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
