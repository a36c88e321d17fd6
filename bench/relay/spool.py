# `python -m bench.relay spool`: what the relay's spool costs the broker, by durability.
#
# Strategy: bench.compare's machinery measures (a fresh broker per measurement, brokers
# taking turns within each repeat, every raw figure to bench/results/), with the brokers
# `nautilus` (relay off), `nautilus-relay-log` (relay on, memory only: durability none),
# `nautilus-relay-spool` and `nautilus-relay-acked` (a LevelDB spool in the broker's
# working directory, durability spool and acknowledged; bench/brokers.py), no consumer.
# This command renders one table: a row per scenario and mode, each durability's rate and
# its ratio to the relay off.
from __future__ import annotations

from .. import compare, report
from ..scenarios import Measurement
from . import compare_args, page

PROG = "python -m bench.relay spool"
DURABILITIES = {  # broker -> the durability it runs with
    "nautilus-relay-log": "none",
    "nautilus-relay-spool": "spool",
    "nautilus-relay-acked": "acknowledged",
}
BROKERS = ",".join(["nautilus", *DURABILITIES])
SCENARIOS = "qos0-1to1,qos1-4pairs"
DEFAULTS = {"--duration": "3"}  # unless the caller gives them
QUICK = {"--repeats": "1", "--duration": "2", "--scenarios": "qos1-4pairs"}
HEADING = "### What the spool costs"
ABOUT = """\
`bench.compare`'s scenarios and modes (bounded: publishers also wait while more
deliveries are owed than the backlog bound; flood: bounded only by TCP), Nautilus with
the relay off, and on with every hook relayed and no consumer for each `durability`:
`none` (memory only), `spool` (each loop turn's records written to a LevelDB spool as
one batch) and `acknowledged` (the same batch fsynced before the turn's PUBACKs go out).
The spool is on the same disk as everything else. QoS 0 acknowledges nothing, so
`acknowledged` only costs it the fsyncs.
"""


def main(argv: list[str]) -> tuple[str | None, str | None]:
    """The subsection (None when interrupted), and where to write it."""
    args = compare_args(
        argv,
        PROG,
        "Broker throughput with the event relay's spool, by durability",
        BROKERS,
        SCENARIOS,
        DEFAULTS,
        QUICK,
    )
    run = compare.measure_all(args)
    if run is None:
        return None, None
    return render(run), args.write


def render(run: report.Run) -> str:
    names = [b.name for b in run.brokers]
    relayed = [name for name in DURABILITIES if name in names]
    rows, errors = [], []
    for scenario in run.scenarios:
        m = {name: run.results.get((scenario.name, name)) or Measurement() for name in names}
        errors += [
            f"- {scenario.title}, {scenario.mode}, {b.label}: {m[b.name].error}\n"
            for b in run.brokers
            if m[b.name].error
        ]
        off = m["nautilus"].delivered if "nautilus" in m else None
        row = [scenario.title, scenario.mode, page.rate(off)]
        for name in relayed:
            row += [page.rate(m[name].delivered), page.ratio(m[name].delivered, off)]
        rows.append(row)
    columns = ["Scenario", "Mode", "Relay off msg/s"]
    for name in relayed:
        columns += [f"`{DURABILITIES[name]}` msg/s", "Ratio"]
    header = page.Header(run.command, run.date, run.machine)
    notes = "Errors and notes:\n\n" + "".join(errors) + "\n" if errors else ""
    settings = {k: v for k, v in run.settings.items() if k != "idle connections"}
    return page.block(HEADING, header, settings, ABOUT, notes, page.table(columns, rows))
