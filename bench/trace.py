# `python -m bench.trace`: what `nautilus admin trace` costs. QoS 0 and QoS 1 throughput
# (mqttgen, `--pairs` publisher/subscriber pairs, flood) with no trace ("none"), with a
# trace on an idle client that has nothing to do with the load ("idle"), on a client
# beside the load publishing `--paced-rate` messages a second ("paced": the trace a
# misbehaving device gets), and on one of the load's publishers itself ("publisher",
# picked up at its CONNECT, with a rate limit it never reaches: a trace at full speed).
# With `--before DIR` (a checkout of the commit before tracing, its C extension built),
# a fifth case, "before": no trace, the broker's code from DIR (what tracing off costs).
# "mountpoint" (asked for with --modes): no trace, the load's clients on a mountpoint's
# tree (docs/operations.md, Mountpoints): what a tree costs its clients.
#
# Strategy: a fresh Nautilus process per measurement, its admin API on (the same in every
# mode), the runs of the three modes interleaved (none, idle, traced, none, ...) so that
# the machine's drift spreads over all of them; the median of `--repeats` runs per mode.
# The trace is read as `nautilus admin trace client` reads it, over the API's stream, by a
# thread that counts its lines: a trace that ended during the run (its reader too slow:
# the broker keeps 10,000 lines at most) makes the run fail, not count as untraced.
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path

from broker.http.api_keys import ApiKeys
from broker.protocol import ConnAck, Connect, Decoder, Publish, encode

from . import cgen
from .brokers import HOST, BrokerSpec, RunningBroker, free_port, raise_fd_limit
from .jwt_connect import _run
from .report import cpu_busy

MODES = ("none", "idle", "paced", "publisher")  # and "before", "mountpoint": see above
PREFIX = "bench-trace"
IDLE_CLIENT = "bench-idle"
PACED_CLIENT = "bench-paced"
TOML = """\
[[listeners]]
address = "{host}:{port}"
{tree}[store]
backend = "memory"
[http]
address = "{host}:{http_port}"
api_keys_file = "{keys}"
[log]
level = "warning"
"""


class TraceStream:
    """The admin API's trace stream of one client, read by a thread that counts lines."""

    def __init__(self, http_port: int, key: str, client_id: str) -> None:
        query = urllib.parse.urlencode(
            {"client_id": client_id, "rate_max": 10**9, "rate_interval": 1000}
        )
        self.sock = socket.create_connection((HOST, http_port))
        request = f"GET /api/v1/trace/client?{query} HTTP/1.0\r\nx-api-key: {key}\r\n\r\n"
        self.sock.sendall(request.encode())
        self.lines = 0
        self.ended = ""  # the last line, if the trace ended
        self.started = threading.Event()  # its first line (the trace is on) arrived
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self.started.wait(10):
            raise RuntimeError(f"no trace of {client_id} started")

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # (closed at the end of the run)
            self._count()

    def _count(self) -> None:
        tail = b""
        while chunk := self.sock.recv(1 << 16):
            data = tail + chunk
            self.lines += data.count(b"\ndata: ")
            if b"event: end" in data:
                self.ended = data[data.index(b"event: end") :].decode(errors="replace")
            tail = data[-16:]
            self.started.set()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)


def connected(port: int, client_id: str) -> socket.socket:
    """A connected MQTT 3.1.1 client."""
    sock = socket.create_connection((HOST, port))
    sock.sendall(encode(Connect(client_id, 4, keepalive=0), 4))
    decoder = Decoder("client", 4)
    while (packet := decoder.next_packet()) is None:
        decoder.receive_data(sock.recv(64))
    assert isinstance(packet, ConnAck) and packet.reason_code == 0, packet
    return sock


class PacedClient:
    """A client publishing `rate` messages a second (to a topic nobody reads) from a
    thread, until closed; what the broker sends it (PUBACKs) is read and dropped."""

    def __init__(self, port: int, rate: float, qos: int) -> None:
        self.sock = connected(port, PACED_CLIENT)
        self.interval = 1 / rate
        self.qos = qos
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        self.sock.setblocking(False)
        n = 0
        while not self.stopped.wait(self.interval):
            n = n % 65535 + 1
            packet = Publish(
                "bench-paced/x", b"%064d" % n, self.qos, packet_id=n if self.qos else None
            )
            with contextlib.suppress(BlockingIOError):
                self.sock.sendall(encode(packet, 4))
            with contextlib.suppress(BlockingIOError):
                self.sock.recv(1 << 16)

    def close(self) -> None:
        self.stopped.set()
        self._thread.join(5)
        self.sock.close()


def measure(mode: str, qos: int, keys: Path, key: str, args: argparse.Namespace) -> float:
    """Messages delivered per second in one run of `mode`."""
    http_port = free_port()

    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        tree = 'mountpoint = "bench-tree"\n' if mode == "mountpoint" else ""  # (not before's)
        values = {"host": HOST, "port": port, "http_port": http_port, "keys": keys}
        config.write_text(TOML.format(tree=tree, **values))
        if mode == "before":  # -P: the code on PYTHONPATH, not the working directory's
            python = ["env", f"PYTHONPATH={args.before}", sys.executable, "-P"]
            return [*python, "-m", "broker", "--config", str(config)]
        return [sys.executable, "-m", "broker", "--config", str(config)]

    load = cgen.Load(
        publishers=args.pairs,
        subscribers=args.pairs,
        qos=qos,
        payload=64,
        duration=args.duration,
        settle=0.0,
        id_prefix=PREFIX,
    )
    with RunningBroker(BrokerSpec("nautilus", mode, command, lambda: "")) as broker:
        port = broker.target.port
        beside: socket.socket | PacedClient | None = None
        if mode == "idle":
            beside = connected(port, IDLE_CLIENT)
        traced = {"idle": IDLE_CLIENT, "paced": PACED_CLIENT, "publisher": f"{PREFIX}-pub0"}
        stream = TraceStream(http_port, key, traced[mode]) if mode in traced else None
        if mode == "paced":
            beside = PacedClient(port, args.paced_rate, qos)
        try:
            result = _run(cgen.run(HOST, port, load))
        finally:
            if stream is not None:
                stream.close()
            if beside is not None:
                beside.close()
        if stream is not None and stream.ended:
            raise RuntimeError(f"the trace ended during the run: {stream.ended}")
        if stream is not None:
            print(f"    ({mode}: {stream.lines:,} lines streamed)", file=sys.stderr)
    return float(result["delivered_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__)
    parser.add_argument("--pairs", type=int, default=4, help="publisher/subscriber pairs")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--repeats", type=int, default=5, help="runs per mode (median)")
    parser.add_argument("--qos", default="0,1", help="QoS levels measured")
    parser.add_argument("--modes", default=",".join(MODES), help=", ".join(MODES))
    parser.add_argument("--paced-rate", type=float, default=100.0, help="paced: msg/s")
    parser.add_argument("--before", help="a checkout without tracing: mode 'before'")
    args = parser.parse_args(argv)
    raise_fd_limit()
    os.environ["NAUTILUS_HTTP__ENABLED"] = "true"  # (bench brokers run without it)
    print(f"CPU busy before the run: {cpu_busy():.0%}")
    print(
        f"mqttgen flood, {args.pairs} pairs, 64-byte payloads, {args.duration:g} s per run, "
        f"median of {args.repeats} runs per mode (interleaved)"
    )
    print(f"| QoS | Trace | Delivered msg/s (median) | Runs | vs {args.modes.split(',')[0]} |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        keys = Path(tmp) / "api-keys"
        key = ApiKeys(str(keys)).add()
        for qos in (int(q) for q in args.qos.split(",")):
            modes = args.modes.split(",")
            runs: dict[str, list[float]] = {mode: [] for mode in modes}
            for _ in range(args.repeats):
                for mode in modes:
                    runs[mode].append(measure(mode, qos, keys, key, args))
            base = statistics.median(runs[modes[0]])
            for mode in modes:
                median = statistics.median(runs[mode])
                shown = ", ".join(f"{r:,.0f}" for r in runs[mode])
                print(f"| {qos} | {mode} | {median:,.0f} | {shown} | {median / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
