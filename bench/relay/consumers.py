# `python -m bench.relay consumers`: events per second from the relay to 1 and to 4
# consumers, each in a process of its own, reading a log of N events from "earliest" to
# its end with the real client (bench/relay/consumer_process.py): as raw batches (`batches()`,
# events as msgpack arrays) and decoded (`async for`, events as dicts), reported apart.
#
# Strategy: one log server (bench/relay/logserver.py) per run, filled once; in each repeat
# every (form, consumers) cell starts its consumers, lets them import, then starts them
# at once and takes each one's first and last instant. Per consumer: N / its own time;
# aggregate: all events / (last end - first start). The log server and the consumers share
# the machine's two cores, so 4 consumers are also 4 processes competing for them.
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

import msgpack

from ..brokers import REPO, BrokerSpec, RunningBroker, child_env
from . import logserver, page, parse

TARGET = 200_000  # events/s to one consumer (the issue)
FORMS = ("raw", "decoded")
PROG = "python -m bench.relay consumers"
DESCRIPTION = "Events per second from the relay to 1 and to 4 consumers, raw and decoded."
HEADING = "### Events per second to consumers"
ABOUT = """\
One relay (its log and server in a process of their own, no broker) holding the events
of the settings above, read from `earliest` to the end by 1 and by 4 consumers at once,
each a process running `event_relay.client.RelayClient` on uvloop: *raw* iterates
`batches()` (events as msgpack arrays, as a forwarding sink would), *decoded* iterates the
client itself (each event a dict with named fields). Per consumer: events / its own time
from connect to the last event; aggregate: all events / (last end - first start). The
relay and the consumers share the machine's two cores.
"""


@dataclass(frozen=True, slots=True)
class Cell:
    form: str
    consumers: int


@dataclass(slots=True)
class Result:
    aggregate: float
    per_consumer: float  # the median consumer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=2_000_000, help="events in the log")
    parser.add_argument("--consumers", default="1,4", help="consumer counts, comma-separated")
    parser.add_argument("--forms", default=",".join(FORMS), help="raw, decoded")
    parser.add_argument("--repeats", type=int, default=3)


QUICK = ["--events", "1000000", "--repeats", "1"]


def main(argv: list[str]) -> tuple[str, str | None]:
    args = parse(argv, PROG, DESCRIPTION, add_arguments, QUICK)
    cells = [
        Cell(form, int(n)) for form in args.forms.split(",") for n in args.consumers.split(",")
    ]
    stamp = page.Stamp()
    results: dict[Cell, list[Result]] = {cell: [] for cell in cells}
    spec = BrokerSpec(
        "relay-log",
        "relay log server",
        lambda workdir, port: [
            *(sys.executable, "-m", "bench.relay.logserver"),
            *("--port", str(port), "--events", str(args.events)),
        ],
        lambda: "-",
    )
    with RunningBroker(spec) as server:
        for repeat in range(args.repeats):
            for cell in cells:
                result = _measure(server.target.port, args.events, cell)
                results[cell].append(result)
                print(
                    f"  {cell.form:<8} x{cell.consumers} run {repeat + 1}: "
                    f"{result.aggregate:10,.0f} events/s, "
                    f"{result.per_consumer:10,.0f} per consumer",
                    file=sys.stderr,
                    flush=True,
                )
    return render(args, stamp.finish(), results), args.write


def _measure(port: int, events: int, cell: Cell) -> Result:
    argv = [sys.executable, "-m", "bench.relay.consumer_process", "--port", str(port)]
    argv += ["--events", str(events), "--form", cell.form]
    children: list[subprocess.Popen[str]] = []
    try:
        for _ in range(cell.consumers):
            children.append(
                subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env=child_env(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for child in children:  # every one imported, then all at once
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"consumer exited with {child.wait()}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        spans = []
        for child in children:
            out, _ = child.communicate(timeout=600)
            if child.returncode:
                raise RuntimeError(f"consumer exited with {child.returncode}")
            times = json.loads(out)
            spans.append((times["start"], times["end"]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return Result(
        aggregate=events * len(spans) / wall,
        per_consumer=statistics.median(events / (end - start) for start, end in spans),
    )


def bytes_per_event() -> float:
    sample = logserver.events(2 * logserver.CLIENTS)
    packer = msgpack.Packer()
    return sum(len(packer.pack(values)) for _, values in sample) / len(sample)


def render(args: argparse.Namespace, header: page.Header, results: dict[Cell, list[Result]]) -> str:
    medians = {
        cell: Result(
            statistics.median(r.aggregate for r in runs),
            statistics.median(r.per_consumer for r in runs),
        )
        for cell, runs in results.items()
    }
    settings = {
        "events in the log": f"{args.events:,} (on_publish and on_deliver in turn, 64 B "
        f"payloads, {bytes_per_event():.0f} B per event encoded)",
        "repeats": str(args.repeats),
    }
    verdict = ""
    if (one := medians.get(Cell("raw", 1))) is not None:
        met = "met" if one.aggregate >= TARGET else "NOT met"
        verdict = (
            f"Target, at least {TARGET:,} events/s to one consumer: {met} "
            f"({page.rate(one.aggregate)} events/s raw, {page.ratio(one.aggregate, TARGET)} "
            "the target).\n"
        )
    rows = []
    for cell, m in medians.items():
        single = medians.get(Cell(cell.form, 1))
        rows.append(
            [
                cell.form,
                str(cell.consumers),
                page.rate(m.aggregate),
                page.rate(m.per_consumer),
                page.ratio(m.aggregate, single.aggregate if single else None),
            ]
        )
    columns = ["Form", "Consumers", "Events/s, all", "Events/s per consumer", "All / 1 consumer"]
    return page.block(HEADING, header, settings, ABOUT, verdict, page.table(columns, rows))
