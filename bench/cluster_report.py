# The "## Clustering" section of docs/performance.md, from the raw results of
# bench/cluster.py.
#
# Strategy: the section is an introduction (what was run, on what machine) and one
# subsection per figure, each naming the command and date that produced it; `--write`
# regenerates the introduction and the subsections of the figures this run measured, and
# keeps the others and the paragraphs from the first line starting with "Reading:" on
# (the human's reading of the figures), as bench/transports.py keeps its own.
from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SECTION = "## Clustering"
READING = "Reading:"
PLACEHOLDER = f"{READING} _to be written: what these figures say._\n"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_PORT = re.compile(r"127\.0\.0\.1:\d+")
Result = dict[str, Any]
Raw = Mapping[str, Sequence[Result]]

HEADINGS = {
    "throughput": "### Throughput: one node, clustered, across nodes",
    "latency": "### Latency of the hop between nodes",
    "propagation": "### Subscription propagation",
    "connect": "### Connect rate with the Redis store",
    "migration": "### Queue migration between nodes",
}
LAYOUT_TITLES = {
    "plain": "one node, no cluster (baseline)",
    "local": "2-node cluster, both on A",
    "hop": "2-node cluster, A -> B",
    "fanout": "3-node cluster, A -> B and C",
}

ABOUT = """\
Every measurement starts a fresh cluster: `python -m broker` processes (one per node) on
127.0.0.1, each with `[cluster] node_name` a, b or c, `address = "127.0.0.1:0"`,
`metadata = "redis"`, `[plugins.redis_subs]` pointing at a redis-server the command starts
itself (`--save "" --appendonly no`, emptied before every cluster), the memory store
unless said otherwise, HTTP off and the queue limits of `bench.compare` (100 in flight;
100,000 queued in bounded mode, 1,000 in flood mode). A node is measured once its log
says its link to every other node is up, and once a probe published on the publisher's
node has reached every subscriber (the subscription has propagated). The load generator
is `bench.compare`'s (one process, one uvloop loop, MQTT 3.1.1 over raw sockets,
`bench/loadgen.py`), 16-byte payloads. Every process shares the machine's cores: the
nodes, Redis and the generator (CPU columns: cores used during the measured seconds,
read from `/proc/<pid>/stat`). Figures are medians of the repeats; raw figures are in
`bench/results/cluster-*.json`.
"""

INTROS = {
    "throughput": """\
One publisher, one subscriber per subscribing node, on one topic. Bounded: QoS 0
publishers write as fast as TCP accepts and pause while more than the backlog bound of
deliveries are owed, QoS 1 publishers keep 100 PUBLISHes unacknowledged and the same
pause; flood: open loop, bounded only by TCP and at QoS 1 by the window of 100
(`bench/loadgen.py`'s Flood and Windowed). Delivered is what the subscribers received
per second (both of them in the fan-out rows: two deliveries per message); "vs one
node" divides by the one-node row of the same QoS and mode. Accepted is what the
publisher's node took (QoS 1: PUBACKs); delivered % = delivered / (accepted x
subscribers). Lost (QoS 1): once the publisher stopped and deliveries settled, PUBACKs
received x subscribers minus messages delivered, over the whole run, one figure per run.
""",
    "latency": """\
One QoS 1 publisher paced at {rate:,} msg/s (100 in flight at most), each payload
stamped with the generator's monotonic clock (`perf_counter_ns`, CLOCK_MONOTONIC); the
subscriber (QoS 1, same process, same clock) records receive time minus stamp. p50, p99
and max over the messages delivered in the measured seconds (after the warm-up);
median of the repeats.
""",
    "propagation": """\
A 2-node cluster. A subscriber on B subscribes to a topic never used before; from the
moment its SUBACK is read, a client on A publishes to that topic (QoS 0) every
millisecond; the delay is the first delivery's arrival minus the SUBACK's (both read by
the generator, monotonic clock), so it includes up to a millisecond of the publishing
interval. Then UNSUBSCRIBE, 20 ms, and the next topic: {samples} samples per case (at
most 30 s of them; a sample with no delivery within 10 s counts as missed). Under load,
a QoS 0 stream runs meanwhile from another client on A to another on B: bounded (paused
while 20,000 deliveries are owed, the throughput figure's bounded mode) or a flood (open
loop, the nodes at the flood mode's 1,000 queued); its delivered rate is shown.
""",
    "connect": """\
{connects:,} clients connecting (MQTT 3.1.1, clean session, keepalive 0, {concurrency} CONNECTs
in flight at once) to a plain node, and to node A of a 2-node cluster, which registers
every client id in Redis before its CONNACK. Connects/s is CONNACKs over the time to the
last; CONNACK p50/p99 is each client's TCP connect + CONNECT -> CONNACK.
""",
    "migration": """\
A 2-node cluster (B and C) with the LevelDB store (`sync = false`) and
`max_offline_messages = -1`. A client (clean session off) subscribes at QoS 1 on B and
disconnects; a publisher on B then publishes the queued messages (QoS 1, 100 in flight,
each numbered in its payload) and gets every PUBACK, so they are in B's store. The
client then connects to C (clean session off, acknowledging every message): the times
are from writing its CONNECT, "msg/s" is messages over the time from CONNACK to the
last one; "exactly once" means every number arrived and none twice. Sizes from 100,000
on are measured once.
""",
}

FIGURES = ("throughput", "latency", "propagation", "connect", "migration")


@dataclass(slots=True)
class Args:
    """The settings of a `python -m bench.cluster` run (bench/cluster.py parses them)."""

    seconds: float = 3.0
    warmup: float = 1.0
    repeats: int = 3
    backlog: int = 20_000
    rate: int = 1000
    samples: int = 200
    connects: int = 2000
    concurrency: int = 50
    queue: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    only: list[str] = field(default_factory=lambda: list(FIGURES))
    write: str | None = None
    argv: list[str] = field(default_factory=list)
    metadata: str = "redis"  # the clusters' metadata backend: "redis" or "swc"
    swc_sync: bool = False  # swc: [cluster.swc] sync = true
    store: str = "memory"  # the nodes' store for throughput and latency, or "leveldb"


def cell(raw: Raw, key: str) -> Sequence[Result]:
    return raw.get(key, [])


def median(results: Sequence[Result], key: str) -> float | None:
    values = [
        r[key]
        for r in results
        if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
    ]
    return statistics.median(values) if values else None


def median_cpu(results: Sequence[Result]) -> dict[str, float]:
    labels: dict[str, list[float]] = {}
    for result in results:
        for label, value in (result.get("cpu") or {}).items():
            labels.setdefault(label, []).append(value)
    return {label: statistics.median(values) for label, values in labels.items()}


# -- the section ------------------------------------------------------------------------


def intro(meta: Mapping[str, Any]) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in meta.get("machine", {}).items())
    return (
        f"{SECTION}\n\n`{meta.get('command', '')}`, {meta.get('date', '')} "
        f"(the whole run: {meta.get('elapsed_s', '?')} s).  \nMachine: {machine}.\n\n{ABOUT}"
    )


def figure_text(figure: str, args: Args, raw: Raw, command: str, date: str) -> str:
    """One figure's subsection: heading, how it was run, its table, its notes."""
    settings = {
        "throughput": f"repeats {args.repeats}, warm-up {args.warmup:g} s, measured "
        f"{args.seconds:g} s, backlog bound (bounded mode) {args.backlog:,} deliveries",
        "latency": f"repeats {args.repeats}, warm-up {args.warmup:g} s, measured "
        f"{args.seconds:g} s, {args.rate:,} msg/s",
        "propagation": f"{args.samples} samples per case",
        "connect": f"repeats {args.repeats}, {args.connects:,} clients, "
        f"{args.concurrency} in flight",
        "migration": f"queued {', '.join(f'{n:,}' for n in args.queue)}; "
        f"repeats {args.repeats} below 100,000",
    }[figure]
    table = TABLES[figure](args, raw)
    about = INTROS[figure].format(
        rate=args.rate,
        samples=args.samples,
        connects=args.connects,
        concurrency=args.concurrency,
    )
    if args.metadata == "swc":  # the cluster nodes keep the metadata themselves
        settings += '; metadata = "swc" (no Redis: the cluster rows hold it in the nodes)'
        settings += ", sync = true" if args.swc_sync else ""
    parts = [
        HEADINGS[figure] + "\n",
        f"`{command}`, {date}; {settings}.\n",
        about,
        table,
    ]
    if notes := _notes(raw, figure):
        parts.append(notes)
    return "\n".join(parts)


def render(meta: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    """The whole section, as a first --write makes it."""

    body = [texts[f] for f in FIGURES if f in texts]
    return "\n".join([intro(meta), *body, PLACEHOLDER])


def with_section(page: str, meta: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    """`page` with its Clustering section regenerated: the introduction and the
    subsections in `texts` new, the other subsections and the "Reading:" paragraphs kept.
    A page without the section gets it at its end."""

    start = page.find(f"\n{SECTION}\n")
    if start < 0:
        return (page.rstrip("\n") + "\n\n" if page else "") + render(meta, texts)
    following = page.find("\n## ", start + 1)
    end = len(page) if following < 0 else following + 1
    old = page[start + 1 : end]
    reading = old.find(f"\n{READING}")
    tail = old[reading + 1 :] if reading >= 0 else PLACEHOLDER
    body = old[:reading] if reading >= 0 else old
    kept = {f: text for f, text in _subsections(body).items() if f not in texts}
    merged = {**kept, **texts}
    block = "\n".join([intro(meta), *(merged[f] for f in FIGURES if f in merged)])
    block = block.rstrip("\n") + "\n\n" + tail.rstrip("\n") + "\n"
    rest = page[end:]
    return page[: start + 1] + block + ("\n" + rest if rest else "")


def _subsections(body: str) -> dict[str, str]:
    """The figure subsections of an existing section, by figure name."""
    found = {}
    for figure, heading in HEADINGS.items():
        start = body.find(f"\n{heading}\n")
        if start < 0:
            continue
        following = body.find("\n### ", start + 1)
        end = len(body) if following < 0 else following + 1
        found[figure] = body[start + 1 : end].rstrip("\n") + "\n"
    return found


# -- the tables -------------------------------------------------------------------------


def _throughput(args: Args, raw: Raw) -> str:
    header = [
        "Where",
        "QoS",
        "Mode",
        "Delivered msg/s",
        "vs one node",
        "Accepted msg/s",
        "Delivered %",
        "Lost (QoS 1), per run",
        "CPU: nodes",
        "Redis",
        "Generator",
    ]
    rows = []
    for qos in (0, 1):
        for mode in ("bounded", "flood"):
            base = median(cell(raw, f"throughput/plain/qos{qos}/{mode}"), "delivered")
            for layout, title in LAYOUT_TITLES.items():
                results = cell(raw, f"throughput/{layout}/qos{qos}/{mode}")
                if not results:
                    continue
                delivered = median(results, "delivered")
                accepted = median(results, "accepted")
                fanout = median(results, "fanout") or 1
                share = (
                    delivered / (accepted * fanout) if delivered is not None and accepted else None
                )
                lost = [f"{r['lost']:,}" for r in results if r.get("lost") is not None]
                cpu = median_cpu(results)
                rows.append(
                    [
                        title,
                        str(qos),
                        mode,
                        _rate(delivered),
                        _ratio(delivered, base),
                        _rate(accepted),
                        f"{share:.1%}" if share is not None else "n/a",
                        ", ".join(lost) if qos else "",
                        _nodes_cpu(cpu),
                        _cores(cpu.get("redis")),
                        _cores(cpu.get("generator")),
                    ]
                )
    return _table(header, rows) + _losses(raw)


def _losses(raw: Raw) -> str:
    runs = lost = 0
    where = []
    for key, results in raw.items():
        if not key.startswith("throughput/"):
            continue
        for result in results:
            if result.get("lost") is None:
                continue
            runs += 1
            if result["lost"]:
                lost += result["lost"]
                where.append(f"{key.partition('/')[2]}: {result['lost']:,}")
    if not runs:
        return ""
    if lost:
        return (
            f"\n**{lost:,} QoS 1 messages acknowledged and never delivered** "
            f"({'; '.join(where)}).\n"
        )
    return f"\nQoS 1: no message acknowledged and never delivered, in {runs} runs.\n"


def _latency(args: Args, raw: Raw) -> str:
    header = ["Where", "Delivered msg/s", "p50 ms", "p99 ms", "max ms", "CPU: nodes", "Generator"]
    rows = []
    for layout in ("plain", "local", "hop"):
        results = cell(raw, f"latency/{layout}")
        if not results:
            continue
        cpu = median_cpu(results)
        rows.append(
            [
                LAYOUT_TITLES[layout],
                _rate(median(results, "delivered")),
                _ms(median(results, "p50_ms")),
                _ms(median(results, "p99_ms")),
                _ms(median(results, "max_ms")),
                _nodes_cpu(cpu),
                _cores(cpu.get("generator")),
            ]
        )
    return _table(header, rows)


def _propagation(args: Args, raw: Raw) -> str:
    header = [
        "Case",
        "Samples",
        "Missed",
        "p50 ms",
        "p99 ms",
        "max ms",
        "min ms",
        "Load delivered msg/s",
        "CPU: nodes",
        "Redis",
        "Generator",
    ]
    cases = {
        "idle": "idle",
        "bounded": "under bounded QoS 0 load A -> B",
        "flood": "under a QoS 0 flood A -> B",
    }
    rows = []
    for case, title in cases.items():
        results = cell(raw, f"propagation/{case}")
        if not results:
            continue
        result = results[-1]
        cpu = median_cpu(results)
        rows.append(
            [
                title,
                str(result.get("samples", "n/a")),
                str(result.get("missed", "n/a")),
                _ms(result.get("p50_ms")),
                _ms(result.get("p99_ms")),
                _ms(result.get("max_ms")),
                _ms(result.get("min_ms")),
                _rate(result.get("load_delivered")) if case != "idle" else "",
                _nodes_cpu(cpu),
                _cores(cpu.get("redis")),
                _cores(cpu.get("generator")),
            ]
        )
    return _table(header, rows)


def _connect(args: Args, raw: Raw) -> str:
    header = [
        "Node",
        "Connects/s",
        "vs plain",
        "CONNACK p50 ms",
        "CONNACK p99 ms",
        "CPU: node",
        "Redis",
        "Generator",
    ]
    base = median(cell(raw, "connect/plain"), "rate")
    rows = []
    for case, title in (("plain", "plain node"), ("cluster", "node A of a 2-node cluster")):
        results = cell(raw, f"connect/{case}")
        if not results:
            continue
        cpu = median_cpu(results)
        node = cpu.get("A", cpu.get("plain"))
        rows.append(
            [
                title,
                _rate(median(results, "rate")),
                _ratio(median(results, "rate"), base),
                _ms(median(results, "p50_ms")),
                _ms(median(results, "p99_ms")),
                _cores(node),
                _cores(cpu.get("redis")),
                _cores(cpu.get("generator")),
            ]
        )
    return _table(header, rows)


def _migration(args: Args, raw: Raw) -> str:
    header = [
        "Queued",
        "Runs",
        "CONNECT -> CONNACK ms",
        "-> first message ms",
        "-> last message s",
        "msg/s",
        "Exactly once",
        "Missing",
        "Duplicates",
        "Out of order",
        "Queue filled on B at msg/s",
        "CPU: nodes",
    ]
    rows = []
    sizes = sorted({int(k.split("/")[1]) for k in raw if k.startswith("migration/")})
    for size in sizes:
        results = cell(raw, f"migration/{size}")
        once = [
            r.get("missing") == 0 and r.get("duplicates") == 0 and r.get("strays") == 0
            for r in results
        ]
        rows.append(
            [
                f"{size:,}",
                str(len(results)),
                _ms(median(results, "connack_ms")),
                _ms(median(results, "first_ms")),
                _seconds(median(results, "last_s")),
                _rate(median(results, "rate")),
                f"{sum(once)} of {len(once)} runs",
                ", ".join(f"{r.get('missing', 'n/a'):,}" for r in results),
                ", ".join(f"{r.get('duplicates', 'n/a'):,}" for r in results),
                ", ".join(f"{r.get('out_of_order', 'n/a'):,}" for r in results),
                _rate(median(results, "fill_rate")),
                _nodes_cpu(median_cpu(results)),
            ]
        )
    return _table(header, rows)


TABLES = {
    "throughput": _throughput,
    "latency": _latency,
    "propagation": _propagation,
    "connect": _connect,
    "migration": _migration,
}


def _notes(raw: Raw, figure: str) -> str:
    """Errors, and the nodes' WARNING/ERROR log lines (timestamps and ports taken out,
    so that the same line from several runs is one, with its count)."""
    lines: Counter[str] = Counter()
    for key, results in raw.items():
        if not key.startswith(f"{figure}/"):
            continue
        where = key.partition("/")[2]
        for result in results:
            for what in ("error", "cut_short"):
                if result.get(what):
                    lines[f"{where}: {_line(str(result[what]))}"] += 1
            for warning in result.get("node_warnings", []):
                warning = _TIMESTAMP.sub("", _PORT.sub("127.0.0.1:PORT", warning))
                lines[f"{where}, node log: {_line(warning)}"] += 1
    if not lines:
        return ""
    text = [f"- {line}" + (f" (x{n})" if n > 1 else "") for line, n in sorted(lines.items())]
    return "Errors and notes:\n\n" + "\n".join(text) + "\n"


def _line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return line[:300]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _nodes_cpu(cpu: Mapping[str, float]) -> str:
    nodes = [f"{k} {v:.2f}" for k, v in cpu.items() if k not in ("redis", "generator")]
    return ", ".join(nodes) if nodes else "n/a"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _cores(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
