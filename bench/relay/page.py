# The "## Event relay" section of docs/performance.md: one subsection per measurement.
#
# Strategy: as bench/store_throughput.py does for the Store section, each command renders
# its subsection whole (heading, command, date and commit, machine, settings, how it was
# measured, the targets checked, then the table) and `--write` replaces it in the page from
# its heading to the end of its table; notes written by hand after the table stay, and
# `bench.compare` keeps the whole section when it rewrites the page.
from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import report
from ..brokers import BROKERS

SECTION = "## Event relay"
INTRO = """\
The event relay ([event-relay.md](event-relay.md)) measured by `python -m bench.relay`
(one subcommand per subsection; `--write docs/performance.md` regenerates its subsection,
`bench.compare` keeps this section when it rewrites the page). Medians of the repeats.
"""


@dataclass(frozen=True, slots=True)
class Header:
    """What the page says of a run: its command line, date and machine."""

    command: str
    date: str
    machine: dict[str, str]


class Stamp:
    """A run being measured: when and where, and how busy the machine was meanwhile."""

    def __init__(self) -> None:
        busy = report.cpu_busy()
        if busy > 0.1:
            print(f"warning: CPUs already {busy:.0%} busy, figures will be low", file=sys.stderr)
        self.command = shlex.join(["python", "-m", "bench.relay", *sys.argv[1:]])
        self.date = time.strftime("%Y-%m-%d %H:%M %Z")
        self.machine = report.machine({"Nautilus version": BROKERS["nautilus"].version()})
        self.machine["CPU busy before the run"] = f"{busy:.0%}"
        self._cpu = report.cpu_seconds()
        self._started = time.monotonic()

    def finish(self) -> Header:
        """The header, with the CPU that other processes took during the run."""
        machine1, own1 = report.cpu_seconds()
        machine0, own0 = self._cpu
        others = (machine1 - machine0 - (own1 - own0)) / (time.monotonic() - self._started)
        machine = self.machine | {"Other processes during the run": f"{others:.2f} CPUs"}
        return Header(self.command, self.date, machine)


def block(
    heading: str,
    header: Header,
    settings: Mapping[str, str],
    about: str,
    verdict: str,
    table: str,
) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in header.machine.items())
    lines = [
        f"{heading}\n",
        f"`{header.command}`, {header.date}.  \nMachine: {machine}.  \n"
        f"Settings: {', '.join(f'{k} {v}' for k, v in settings.items())}.\n",
        about,
    ]
    if verdict:
        lines.append(verdict)
    lines.append(table)
    return "\n".join(lines)


def write(path: Path, heading: str, text: str) -> None:
    page = path.read_text() if path.exists() else ""
    path.write_text(report.with_subsection(page, SECTION, heading, text, INTRO))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}x"


def mib(kib: float | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:,.0f}"
