# `python -m bench.relay overhead`: broker throughput with the event relay off and on
# (every hook relayed, payloads full), bounded and flooded.
#
# Strategy: bench.compare's machinery measures (a fresh broker per measurement, brokers
# taking turns within each repeat, every raw figure to bench/results/), with the brokers
# `nautilus` (relay off), `nautilus-relay-log` (relay on, no consumer: what appending
# costs) and `nautilus-relay` (relay on and one consumer process reading every event from
# `latest` with `batches()`, started beside the broker by bench/relay/broker.py). Each
# `nautilus-relay` leaves its consumer's count in a Tally file in a directory this command
# names (bench/brokers.py, RELAY_TALLIES); compare starts brokers scenario by scenario,
# repeat by repeat, so the i-th file belongs to the i // repeats-th scenario. This command
# renders one table: a row per scenario and mode, the ratios to the relay off, and what the
# consumer received.
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .. import compare, report
from ..brokers import RELAY_TALLIES
from ..scenarios import Measurement, Scenario
from . import compare_args, page, tally

PROG = "python -m bench.relay overhead"
BROKERS = "nautilus,nautilus-relay-log,nautilus-relay"
SCENARIOS = "qos0-1to1,qos1-4pairs,fanout-1to100"
DEFAULTS = {"--duration": "3"}  # unless the caller gives them
QUICK = {"--scenarios": "qos0-1to1", "--repeats": "1", "--duration": "2"}
TARGET = 0.85  # relay on with a consumer: at most 15% below relay off (the issue)
HEADING = "### Broker throughput with the relay off and on"
ABOUT = """\
`bench.compare`'s scenarios and modes (bounded: publishers also wait while more
deliveries are owed than the backlog bound; flood: bounded only by TCP, the brokers at
their default queue length), Nautilus with the relay off, on with no consumer (the cost
of appending every event to the log), and on with one consumer: a process of its own
reading every event from `latest` with `RelayClient.batches()`, on the same two cores as
the broker and the load generator. The relay runs with its defaults: every hook (QoS 0:
`on_publish` and `on_deliver` per message, QoS 1: also `on_delivery_complete`), payloads
full, memory only (1,000,000 events), the C message recorder (a message's publish and
deliveries kept as one compact record). "Consumer events/s" is what the consumer received
per second while events flowed; divided by the broker's deliveries per second it is 2 for
QoS 0 and 3 for QoS 1 when the consumer keeps up (about 1.01 for the fan-out: one
`on_publish` per 100 deliveries). "Events lost" is what a consumer that fell out of the
retained range missed (it then goes on from the oldest event retained).
"""


def main(argv: list[str]) -> tuple[str | None, str | None]:
    """The subsection (None when interrupted), and where to write it."""
    args = compare_args(
        argv,
        PROG,
        "Broker throughput with the event relay off and on, bounded and flooded",
        BROKERS,
        SCENARIOS,
        DEFAULTS,
        QUICK,
    )
    with tempfile.TemporaryDirectory(prefix="bench-relay-tallies-") as tallies:
        os.environ[RELAY_TALLIES] = tallies
        try:
            run = compare.measure_all(args)
        finally:
            del os.environ[RELAY_TALLIES]
        if run is None:
            return None, None
        consumed = _consumed(Path(tallies), run.scenarios, args.repeats)
    return render(run, consumed), args.write


Consumed = tuple[float | None, int]  # the consumer's events/s while the load ran, events lost


def _consumed(directory: Path, scenarios: Sequence[Scenario], repeats: int) -> dict[str, Consumed]:
    """Scenario name -> what the consumer got, medians of the repeats; empty when the
    files do not match the measurements one to one."""
    files = sorted(directory.glob("*.tally"))
    if len(files) != len(scenarios) * repeats:
        if files:
            print(
                f"warning: {len(files)} consumer counts for {len(scenarios)} x {repeats} "
                "measurements: not shown",
                file=sys.stderr,
            )
        return {}
    runs: dict[str, list[tally.Sample]] = {}
    rates: dict[str, list[float]] = {}
    for i, path in enumerate(files):
        name = scenarios[i // repeats].name
        samples = tally.read(path)
        runs.setdefault(name, []).append(samples[-1] if samples else (0.0, 0, 0))
        if (rate := tally.flowing_rate(samples)) is not None:
            rates.setdefault(name, []).append(rate)
    return {
        name: (
            statistics.median(rates[name]) if name in rates else None,
            round(statistics.median(last[2] for last in lasts)),
        )
        for name, lasts in runs.items()
    }


def render(run: report.Run, consumed: dict[str, Consumed]) -> str:
    names = [b.name for b in run.brokers]
    rows, verdicts, errors = [], {}, []
    for scenario in run.scenarios:
        m = {name: run.results.get((scenario.name, name)) or Measurement() for name in names}
        errors += [
            f"- {scenario.title}, {scenario.mode}, {b.label}: {m[b.name].error}\n"
            for b in run.brokers
            if m[b.name].error
        ]
        off = m.get("nautilus", Measurement()).delivered
        idle = m.get("nautilus-relay-log", Measurement()).delivered
        on = m.get("nautilus-relay", Measurement()).delivered
        rate, lost = consumed.get(scenario.name, (None, 0))
        held = None if not off or on is None else on >= TARGET * off
        if held is not None:
            verdicts[f"{scenario.title}, {scenario.mode}"] = held
        rows.append(
            [
                scenario.title,
                scenario.mode,
                page.rate(off),
                page.rate(idle),
                page.ratio(idle, off),
                page.rate(on),
                page.ratio(on, off),
                "n/a" if held is None else ("yes" if held else "NO"),
                page.rate(rate),
                "n/a" if rate is None or not on else f"{rate / on:.2f}",
                f"{lost:,}" if scenario.name in consumed else "n/a",
            ]
        )
    columns = [
        "Scenario",
        "Mode",
        "Relay off msg/s",
        "On, no consumer msg/s",
        "Ratio",
        "On, one consumer msg/s",
        "Ratio",
        f"At most {1 - TARGET:.0%} lower",
        "Consumer events/s",
        "Events per delivery",
        "Events lost",
    ]
    missed = [row for row, held in verdicts.items() if not held]
    verdict = (
        f"Target, broker throughput at most {1 - TARGET:.0%} lower with every event relayed "
        f"(relay on with one consumer against relay off): "
        + (
            f"NOT met in {len(missed)} of {len(verdicts)} rows ({'; '.join(missed)})"
            if missed
            else f"met in all {len(verdicts)} rows"
        )
        + ".\n"
    )
    settings = {k: v for k, v in run.settings.items() if k != "idle connections"}
    header = page.Header(run.command, run.date, run.machine)
    notes = "Errors and notes:\n\n" + "".join(errors) + "\n" if errors else ""
    return page.block(HEADING, header, settings, ABOUT, notes + verdict, page.table(columns, rows))
