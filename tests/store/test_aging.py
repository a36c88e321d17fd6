"""CONNECT stays as fast on a LevelDB store that has seen tens of thousands of messages,
and been restarted, as on a new one.

Every message that went through a persistent session leaves deleted keys (tombstones) in
LevelDB until a compaction reaches them, and an iterator steps over each of them between
its seek target and the next live key. A clean session has nothing stored, so its CONNECT
and disconnect must not seek at all: before, each one scanned the key ranges next to its
client id, and spent there time that grew with every message the store had ever held
(0.6 ms on a new store, over 10 ms after 60,000 messages and a restart).

Two brokers run side by side, one on an aged store and one on a new store, and their
connects are timed in turns, so that a busy machine slows both alike.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from tests.broker.helpers import (
    CONNACK,
    PUBACK,
    PUBLISH,
    RawClient,
    ack_packet,
    connect_packet,
    disconnect_packet,
    publish_packet,
    unique_id,
)
from tests.test_cli import BrokerProcess, write_config

HOST = "127.0.0.1"
MESSAGES = 60_000  # through one persistent session
WINDOW = 200  # PUBLISHes the publisher keeps unacknowledged
CONNECTS = 60  # timed per broker and phase


def leveldb_config(tmp_path: Path, name: str) -> Path:
    """A broker on port 0 with the LevelDB store at tmp_path/name, no HTTP server."""
    store = f'backend = "leveldb"\npath = "{tmp_path / name}"'
    config = write_config(tmp_path / f"{name}.toml", store=store)
    with config.open("a", encoding="utf-8") as file:
        file.write("\n[http]\nenabled = false\n")
    return config


def age(port: int, subscriber: str, count: int) -> None:
    """`count` QoS 1 messages through a persistent session, all acknowledged."""
    sub = RawClient(HOST, port)
    sub.connect(subscriber, clean=False)
    assert sub.subscribe(("aging/#", 1)) == [1]
    received = threading.Event()

    def acknowledge() -> None:
        got = 0
        while got < count:
            pkt = sub.read_packet(10.0)
            assert pkt is not None, f"connection closed after {got} messages"
            if pkt.type == PUBLISH:
                sub.send(ack_packet(PUBACK, pkt.packet_id))
                got += 1
        received.set()

    reader = threading.Thread(target=acknowledge, daemon=True)
    reader.start()
    pub = RawClient(HOST, port)
    pub.connect(unique_id("pub"))
    payload = b"x" * 64
    for start in range(0, count, WINDOW):
        ids = [(start + i) % 65535 + 1 for i in range(min(WINDOW, count - start))]
        pub.send(b"".join(publish_packet("aging/t", payload, qos=1, packet_id=i) for i in ids))
        for _ in ids:
            pub.expect(PUBACK)
    assert received.wait(30.0), "the subscriber did not get every message"
    pub.disconnect()
    sub.disconnect()


def connect_ms(port: int, client_id: str, clean: bool = True) -> float:
    """Milliseconds from CONNECT to CONNACK; then DISCONNECT and wait for the close."""
    raw = RawClient(HOST, port)
    started = time.perf_counter()
    raw.send(connect_packet(client_id, clean=clean))
    raw.expect(CONNACK)
    elapsed = (time.perf_counter() - started) * 1000
    raw.send(disconnect_packet())
    raw.expect_closed()
    raw.close()
    return elapsed


def medians(aged: BrokerProcess, fresh: BrokerProcess) -> tuple[float, float]:
    """Median CONNACK time of clean connects with new client ids, on each broker in turn.
    The ids ("c-...") sort before the aged session's ("sub-..."), next to its keys."""
    timings: dict[int, list[float]] = {aged.port: [], fresh.port: []}
    for _ in range(CONNECTS):
        for port, found in timings.items():
            found.append(connect_ms(port, unique_id("c")))
    return statistics.median(timings[aged.port]), statistics.median(timings[fresh.port])


def within_bound(aged: float, fresh: float) -> bool:
    return aged <= 3 * fresh + 2.0


def test_connects_do_not_slow_down_as_the_store_ages(tmp_path, start_process):
    aged_config = leveldb_config(tmp_path, "aged")
    aged = start_process(aged_config)
    fresh = start_process(leveldb_config(tmp_path, "fresh"))
    subscriber = unique_id("sub")
    age(aged.port, subscriber, MESSAGES)

    assert aged.stop() == 0
    aged = start_process(aged_config)  # the deleted keys are read back from the log
    aged_ms, fresh_ms = medians(aged, fresh)
    assert within_bound(aged_ms, fresh_ms), (
        f"clean CONNECT after {MESSAGES} messages and a restart: median {aged_ms:.2f} ms, "
        f"on a new store {fresh_ms:.2f} ms"
    )

    # The aged session ends (clean start): every key it had becomes a tombstone too.
    connect_ms(aged.port, subscriber, clean=True)
    aged_ms, fresh_ms = medians(aged, fresh)
    assert within_bound(aged_ms, fresh_ms), (
        f"clean CONNECT once the aged session ended: median {aged_ms:.2f} ms, "
        f"on a new store {fresh_ms:.2f} ms"
    )
