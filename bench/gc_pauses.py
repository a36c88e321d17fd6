"""`python -m bench.gc_pauses`: a node holding many persistent sessions, and how long it stops.

    python -m bench.gc_pauses                                  # 100,000 sessions, ~3 minutes
    python -m bench.gc_pauses --sessions 1000000 --hold 600    # the issue's figure, ~25 min, ~9 GB

Three node processes with `metadata = "swc"` (bench/swc.py's set-up, no Redis); node A
holds every session (persistent, offline, one subscription each), B and C their records.

- ramp: --sessions subscribers made on A (CONNECT, SUBSCRIBE, DISCONNECT), by
  --generators processes;
- hold: --hold seconds more, while clean clients come and go on A (--churn at once),
  as a node holding its sessions lives.

Through both, a probe client on A sends a PINGREQ every PROBE_INTERVAL and times each
PINGRESP: its longest wait is the longest time A's event loop stood still (a garbage
collection, or anything else; on a busy machine the scheduler's delays too). A link flap
is a `cluster link to X (...) down` line in any node's log. A's own `gc_pause_seconds_max`,
`gc_collections` and `gc_frozen_objects` are read from its `$SYS` tree when it has them
(broker/collector.py; "n/a" for a version without).

Figures are printed as JSON; raw figures go to bench/results/gc-pauses-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import time
from typing import Any

from . import packets
from .brokers import HOST, free_port, raise_fd_limit
from .client import open_client, subscribe
from .raw import save_raw
from .scenarios import rss_kib
from .swc import SwcNode, make_subscribers, until

PROG = "python -m bench.gc_pauses"
PROBE_INTERVAL = 0.01  # seconds between PINGREQs
STALL = 0.1  # seconds: a PINGRESP later than this is a stall (the 100 ms)
FLAP = re.compile(r"cluster link to \S+ \(\S+\) down")
PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"


class Probe(asyncio.Protocol):
    """PINGREQ every PROBE_INTERVAL, one outstanding at a time; the waits, per phase."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.connack = asyncio.get_running_loop().create_future()
        self.sent = 0.0  # when the outstanding PINGREQ went, 0: none
        self.longest = 0.0
        self.stalls = 0
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.connack.done():
            self.connack.set_result(data[:4])
            data = data[4:]
        self._buffer += data
        while self._buffer.startswith(PINGRESP):
            self._buffer = self._buffer[2:]
            self._answered()

    def _answered(self) -> None:
        waited = time.perf_counter() - self.sent
        self.sent = 0.0
        self.longest = max(self.longest, waited)
        self.stalls += waited > STALL

    async def run(self) -> None:
        while True:
            if not self.sent and self.transport is not None:
                self.sent = time.perf_counter()
                self.transport.write(PINGREQ)
            await asyncio.sleep(PROBE_INTERVAL)

    def phase(self) -> dict[str, Any]:
        """The figures since the last call (a PINGREQ still unanswered counts as far as
        it got)."""
        if self.sent:
            self.longest = max(self.longest, time.perf_counter() - self.sent)
        figures = {
            "longest_stall_ms": round(self.longest * 1000, 1),
            "stalls_over_100ms": self.stalls,
        }
        self.longest, self.stalls = 0.0, 0
        return figures


async def probe(node: SwcNode) -> tuple[Probe, asyncio.Task]:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Probe, HOST, node.port)
    assert client.transport is not None
    client.transport.write(packets.connect("gc-probe"))
    await asyncio.wait_for(client.connack, 10)
    return client, asyncio.ensure_future(client.run())


async def gc_watch(node: SwcNode) -> dict[str, float]:
    """A's `$SYS/<node>/gc/...` figures, kept current (empty without them)."""
    figures: dict[str, float] = {}
    client = await open_client(HOST, node.port, "gc-watch")
    prefix = f"$SYS/{node.name}/gc/".encode()

    def on_message(topic: bytes, payload: bytes) -> None:
        if topic.startswith(prefix):
            figures["gc_" + topic[len(prefix) :].decode().replace("/", "_")] = float(payload)

    client.on_message = on_message
    await subscribe(client, f"$SYS/{node.name}/gc/#", 0)
    return figures


def flaps(nodes: list[SwcNode]) -> int:
    count = 0
    for node in nodes:
        with contextlib.suppress(OSError):
            count += len(FLAP.findall(node.log.read_text(errors="replace")))
    return count


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = {name: free_port() for name in "abc"}
    a = SwcNode("a", ports["a"], [])
    b = SwcNode("b", ports["b"], [ports["a"]])
    c = SwcNode("c", ports["c"], [ports["a"]])
    nodes = [a, b, c]
    result: dict[str, Any] = {"sessions": args.sessions, "hold_s": args.hold}
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.ready({x.name for x in nodes} - {node.name})
        gc_figures = await gc_watch(a)
        client, pinging = await probe(a)

        started = time.monotonic()
        await make_subscribers(a.port, args.sessions, args, "held", persistent=True)
        took = time.monotonic() - started
        result["made_per_s"] = round(args.sessions / took)
        result["ramp"] = {**client.phase(), "link_flaps": flaps(nodes)}
        print(json.dumps(result), flush=True)

        churn = asyncio.ensure_future(_churn(a.port, args))
        await asyncio.sleep(args.hold)
        churn.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await churn
        result["hold"] = {
            **client.phase(),
            "link_flaps": flaps(nodes) - result["ramp"]["link_flaps"],
        }
        with contextlib.suppress(TimeoutError):  # ($SYS every second; none before #41)
            await until(lambda: "gc_pause_seconds_max" in gc_figures, 3.0)
        result["a"] = {
            "rss_mb": round((rss_kib(a.pid) or 0) / 1024),
            **{k: gc_figures.get(k, "n/a") for k in GC_FIGURES},
        }
        pinging.cancel()
    finally:
        for node in nodes:
            node.stop()
            node.close()
    return result


GC_FIGURES = ("gc_pause_seconds_max", "gc_collections", "gc_frozen_objects")


async def _churn(port: int, args: argparse.Namespace) -> None:
    """Clean clients coming and going (each its subscription's record written, then
    deleted), --churn at once, until cancelled."""
    round_ = 0
    while True:
        churned = argparse.Namespace(generators=1, concurrency=args.churn)
        await make_subscribers(port, 1000, churned, f"churn{round_}", persistent=False)
        round_ += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--hold", type=float, default=60.0, help="seconds after the ramp")
    parser.add_argument("--churn", type=int, default=5, help="clean clients at once, hold")
    parser.add_argument("--concurrency", type=int, default=100, help="per generator")
    parser.add_argument("--generators", type=int, default=2, help="client-making processes")
    args = parser.parse_args(argv)
    raise_fd_limit()
    result = asyncio.run(run(args))
    result["date"] = time.strftime("%Y-%m-%d %H:%M %Z")
    print(json.dumps(result, indent=2))
    save_raw("gc-pauses", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
