# `python -m bench.store_throughput`: QoS 1 to persistent subscribers with each store, side
# by side: Nautilus with the memory store and with LevelDB (fsync off and on), Mosquitto
# with persistence off and on.
#
# Strategy: compare's machinery does the measuring (a fresh broker per measurement in its
# own temporary directory, where the LevelDB store and Mosquitto's database live; brokers
# taking turns within each repeat; raw figures to bench/results/). This command only picks
# the brokers and the scenario and renders one table, a row per broker, with the ratio to
# Nautilus's memory store. `--write` regenerates the subsection of the page's "## Store"
# section from its heading to the end of its table; notes written after the table stay,
# and `compare` keeps the whole Store section when it rewrites the page.
from __future__ import annotations

import sys
from pathlib import Path

from . import compare, report

PROG = "python -m bench.store_throughput"
SCENARIO = "qos1-persistent"
BROKERS = "nautilus,nautilus-leveldb,nautilus-leveldb-sync,mosquitto,mosquitto-persist"
REFERENCE = "nautilus"  # the memory store: the ratio column divides by its figure
LABELS = {
    "nautilus": "Nautilus, memory store",
    "nautilus-leveldb": "Nautilus, LevelDB, `sync = false`",
    "nautilus-leveldb-sync": "Nautilus, LevelDB, `sync = true` (default)",
    "mosquitto": "Mosquitto, persistence off",
    "mosquitto-persist": "Mosquitto, `persistence true`",
}
SECTION = "## Store"
HEADING = "### QoS 1 to persistent subscribers"
ABOUT = """\
Four publishers (100 in flight each) to four subscribers with clean session off (client
ids new in every measurement), so every message is queued for a persistent session. With
LevelDB each message is written (entry, in-flight record) before its PUBACK goes out and
deleted when the subscriber acknowledges it; `sync = true` makes every commit (one per
event-loop turn) durable with fsync. Mosquitto's `persistence true` writes its database
every `autosave_interval` (30 min by default) and at exit, so during a run it does the
same work as without persistence. The ratio is to Nautilus's memory store in the same
mode; each figure is the median of the repeats.
"""


def main(argv: list[str] | None = None) -> int:
    args = compare.parse_args(
        argv,
        prog=PROG,
        description="QoS 1 throughput to persistent subscribers: Nautilus's memory and "
        "LevelDB stores and Mosquitto with and without persistence, one broker at a time.",
        brokers=BROKERS,
        scenarios=SCENARIO,
        calibrate=False,
        write_help="regenerate the store throughput table in the Store section of this page",
        modes="bounded,flood",
    )
    run = compare.measure_all(args)
    if run is None:
        return 130
    block = render(run, args.scenarios.split(","))
    print(block)
    if args.write:
        path = Path(args.write)
        page = path.read_text() if path.exists() else ""
        path.write_text(report.with_subsection(page, SECTION, HEADING, block))
    return 0


def render(run: report.Run, scenarios: list[str]) -> str:
    """The subsection: heading, how it was measured, one table per scenario."""
    machine = ", ".join(f"{k} {v}" for k, v in run.machine.items())
    settings = ", ".join(f"{k} {v}" for k, v in run.settings.items() if k != "idle connections")
    parts = [
        f"{HEADING}: memory, LevelDB, Mosquitto\n",
        f"`{run.command}`, {run.date}.  \nMachine: {machine}.  \nSettings: {settings}.\n",
        ABOUT,
    ]
    for name in scenarios:
        if len(scenarios) > 1:
            title = next(s.title for s in run.scenarios if s.base == name)
            parts.append(f"{title}:\n")
        parts.append(report.store_table(run, name, REFERENCE, LABELS))
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
