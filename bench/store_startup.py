"""Start-up of a broker whose LevelDB store holds many queued messages.

    python -m bench.store_startup --sessions 10000 --messages 10000000 --big 1000000

Fills a store directly through broker.store (the broker's own writer, without network
round trips): `--sessions` persistent sessions sharing `--messages` QoS 1 messages, one of
them (`bench-big`) holding `--big` of them. Then starts `python -m broker` on it and
measures: seconds until connections are accepted, the broker's RSS after start, CONNACK
and first-message times of the client holding the big queue, RSS after it drained
`--drain` messages, and the store's size on disk. Prints one Markdown table row.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import child_env, free_port
from bench.scenarios import rss_kib
from broker.message import Delivery, Message
from broker.store import SessionRecord
from broker.store.leveldb import LevelDBStore
from broker.subscription_trie import SubOptions

BATCH = 20_000  # entries per committed batch while filling


class _FillClock:
    """The store wants a loop for its clock and group commit; filling commits by hand."""

    def time(self) -> float:
        return time.monotonic()

    def call_soon(self, callback: object, *args: object) -> None:
        pass


def fill(path: str, sessions: int, messages: int, big: int, payload: bytes) -> float:
    start = time.perf_counter()
    store = LevelDBStore(path, _FillClock(), sync=False)  # type: ignore[arg-type]
    subscription = {"bench/#": SubOptions(1)}
    counts = [big] + [0] * (sessions - 1)
    rest = messages - big
    for i in range(1, sessions):
        counts[i] = rest // (sessions - 1) + (1 if i <= rest % (sessions - 1) else 0)
    pending = 0
    for index, count in enumerate(counts):
        client_id = "bench-big" if index == 0 else f"bench-{index}"
        store.put_session(SessionRecord(client_id, None, time.time(), dict(subscription)))
        for seq in range(count):
            message = Message("bench/t", payload, 1, now=0.0)
            store.put_entry(client_id, seq, Delivery(message, 1, False))
            pending += 1
            if pending >= BATCH:
                store.commit()
                pending = 0
    store.close()
    return time.perf_counter() - start


def _connect_packet(client_id: str) -> bytes:
    ident = client_id.encode()
    body = b"\x00\x04MQTT\x04\x00\x00\x00" + len(ident).to_bytes(2, "big") + ident  # clean off
    return bytes((0x10, len(body))) + body


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def _read_packet(sock: socket.socket) -> tuple[int, bytes]:
    first = _read_exactly(sock, 1)[0]
    length, shift = 0, 0
    while True:
        byte = _read_exactly(sock, 1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, _read_exactly(sock, length)


def measure(path: str, drain: int) -> dict[str, float]:
    port = free_port()
    config = Path(path) / "nautilus.toml"
    config.write_text(
        '[broker]\nallow_anonymous = true\n[[listeners]]\ntype = "tcp"\n'
        f'address = "127.0.0.1:{port}"\n[store]\nbackend = "leveldb"\npath = "{path}"\n'
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("the broker exited") from None
                time.sleep(0.005)
        accepting = time.perf_counter() - started
        rss_start = rss_kib(proc.pid) or 0
        sent = time.perf_counter()
        sock.sendall(_connect_packet("bench-big"))
        first, _ = _read_packet(sock)
        assert first >> 4 == 2, first  # CONNACK
        connack = time.perf_counter() - sent
        received = 0
        first_message = 0.0
        while received < drain:
            first, body = _read_packet(sock)
            if first >> 4 != 3:
                continue
            if not received:
                first_message = time.perf_counter() - sent
            received += 1
            topic_end = 2 + int.from_bytes(body[:2], "big")
            sock.sendall(b"\x40\x02" + body[topic_end : topic_end + 2])  # PUBACK
        drained = time.perf_counter() - sent
        rss_drained = rss_kib(proc.pid) or 0
        sock.close()
        return {
            "accepting_s": accepting,
            "rss_start_mib": rss_start / 1024,
            "connack_ms": connack * 1000,
            "first_message_ms": first_message * 1000,
            "drain_msgs_per_s": drain / drained,
            "rss_drained_mib": rss_drained / 1024,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def _size_mib(path: str) -> float:
    total = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return total / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--big", type=int, default=1_000_000, help="queued for one client")
    parser.add_argument("--payload", type=int, default=64, help="bytes")
    parser.add_argument("--drain", type=int, default=100_000, help="messages the client reads")
    parser.add_argument("--path", help="store directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nautilus-store-") as tmp:
        path = args.path or os.path.join(tmp, "store")
        seconds = fill(path, args.sessions, args.messages, args.big, b"x" * args.payload)
        print(f"filled {args.messages:,} messages in {seconds:.0f} s; {_size_mib(path):,.0f} MiB")
        result = measure(path, min(args.drain, args.big))
    print(
        "| Queued messages | Sessions | Accepting connections (s) | RSS after start (MiB) "
        "| CONNACK (ms) | First message (ms) | Drain (msg/s) | RSS after drain (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.messages:,} | {args.sessions:,} | {result['accepting_s']:.2f} "
        f"| {result['rss_start_mib']:.0f} | {result['connack_ms']:.1f} "
        f"| {result['first_message_ms']:.1f} | {result['drain_msgs_per_s']:,.0f} "
        f"| {result['rss_drained_mib']:.0f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
