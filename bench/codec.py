"""`python -m bench.codec`: our MQTT codec against amqtt's, on QoS 1 PUBLISH packets.

    python -m bench.codec [--packets 100000] [--runs 5] [--chunk 65536]
    PYTHONPATH=. .venv-amqtt/bin/python -m bench.codec     # where amqtt is installed

Each of `--packets` QoS 1 PUBLISHes (MQTT 3.1.1, a 20-byte topic, a 64-byte payload, packet
ids 1, 2, ...) is decoded and encoded, in this process, by:

- ours (`broker/protocol/`), the way `broker/connection.py` uses it: the bytes arrive in
  chunks of `--chunk` bytes (what a socket read hands over under load), `receive_data`
  takes each, and `next_packet` returns every complete packet buffered. Encoding two
  ways: `encode(Publish(...))` per packet, and the broker's fan-out path, a
  `PublishTemplate` encoded once and `with_packet_id` per packet;
- amqtt's (`amqtt.mqtt.publish.PublishPacket`): `PublishPacket.from_stream` per packet,
  reading through amqtt's `StreamReaderAdapter` (as its broker does) from an asyncio
  `StreamReader` that already holds all the bytes (so no read ever waits: amqtt's best
  case); encoding as its broker sends a message, `PublishPacket.build(...).to_bytes()`.

Ours also decodes and encodes the same PUBLISH in MQTT 5, without and with two properties
(amqtt speaks 3.1.1 only). Both sides are checked to agree on the bytes and the decoded
fields before timing. Each figure is the median of `--runs` runs, the runs of every
measurement interleaved (so that other work on a shared machine weighs on both alike),
the garbage collector off while timing (as timeit does). Prints a Markdown table
(docs/architecture.md and docs/performance.md quote it). Without amqtt importable it says
so in one line and measures ours.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from broker.protocol import Decoder, Property, Publish, PublishTemplate, encode

MQTT_311 = 4
MQTT_5 = 5
TOPIC = "fleet/sensor-42/temp"  # 20 bytes
PAYLOAD = bytes(range(64))
# Two properties a real MQTT 5 publisher often sets, for the MQTT 5 rows (ours only).
PROPERTIES: dict[int, Any] = {
    Property.MESSAGE_EXPIRY_INTERVAL: 3600,
    Property.CONTENT_TYPE: "application/octet-stream",
}


def packet_id(n: int) -> int:
    return n % 0xFFFF + 1


def wire(count: int, level: int = MQTT_311, properties: dict[int, Any] | None = None) -> bytes:
    """`count` QoS 1 PUBLISHes back to back, as a publisher's socket carries them."""
    props = properties or {}
    return b"".join(
        encode(Publish(TOPIC, PAYLOAD, 1, packet_id=packet_id(n), properties=dict(props)), level)
        for n in range(count)
    )


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def timed(run: Callable[[], int], expected: int) -> float:
    """Seconds for one run; `run` returns how many packets it handled."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        handled = run()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    if handled != expected:
        raise AssertionError(f"handled {handled} packets, expected {expected}")
    return elapsed


# --------------------------------------------------------------------------- ours


def our_decode(pieces: list[bytes], level: int) -> int:
    decoder = Decoder("server", protocol_level=level)
    handled = 0
    for piece in pieces:
        decoder.receive_data(piece)
        while decoder.next_packet() is not None:
            handled += 1
    return handled


def our_encode(count: int, level: int, properties: dict[int, Any] | None = None) -> int:
    props = properties or {}
    for n in range(count):
        encode(Publish(TOPIC, PAYLOAD, 1, packet_id=packet_id(n), properties=dict(props)), level)
    return count


def our_template(count: int, level: int) -> int:
    template = PublishTemplate.encode(Publish(TOPIC, PAYLOAD, 1), level)
    with_packet_id = template.with_packet_id
    for n in range(count):
        with_packet_id(packet_id(n))
    return count


def check_ours(data: bytes, count: int, level: int) -> None:
    decoder = Decoder("server", protocol_level=level)
    decoder.receive_data(data)
    first = decoder.next_packet()
    if not (
        isinstance(first, Publish)
        and (first.topic, first.payload, first.packet_id) == (TOPIC, PAYLOAD, 1)
    ):
        raise AssertionError(f"decoded {first!r}")
    template = PublishTemplate.encode(Publish(TOPIC, PAYLOAD, 1), level)
    if template.with_packet_id(packet_id(count - 1)) != data[-len(template.data) :]:
        raise AssertionError("the template's bytes differ from encode()'s")


# --------------------------------------------------------------------------- amqtt


def load_amqtt() -> tuple[Any, Any, str] | None:
    """(PublishPacket, StreamReaderAdapter, version), or None when amqtt is missing."""
    try:
        from importlib.metadata import version

        from amqtt.adapters import StreamReaderAdapter
        from amqtt.mqtt.publish import PublishPacket
    except ImportError as exc:
        print(
            f"amqtt is not importable here ({exc}); measuring ours only "
            "(run with the interpreter of .venv-amqtt and PYTHONPATH=. for both)"
        )
        return None
    return PublishPacket, StreamReaderAdapter, version("amqtt")


def amqtt_decode(publish_packet: Any, adapter: Any, pieces: list[bytes], count: int) -> float:
    """Seconds to decode `count` packets, the bytes fed to the reader beforehand (with every
    byte buffered no read suspends, so the event loop itself costs nothing here)."""

    async def run() -> float:
        reader = asyncio.StreamReader()
        for piece in pieces:
            reader.feed_data(piece)
        reader.feed_eof()
        stream = adapter(reader)
        from_stream = publish_packet.from_stream
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for _ in range(count):
                await from_stream(stream)
            return time.perf_counter() - start
        finally:
            gc.enable()

    return asyncio.run(run())


def amqtt_encode(publish_packet: Any, count: int) -> int:
    build = publish_packet.build
    for n in range(count):
        build(TOPIC, PAYLOAD, packet_id(n), False, 1, False).to_bytes()
    return count


def check_amqtt(publish_packet: Any, adapter: Any, data: bytes) -> None:
    if publish_packet.build(TOPIC, PAYLOAD, 1, False, 1, False).to_bytes() != wire(1):
        raise AssertionError("amqtt encodes the PUBLISH differently")

    async def first() -> Any:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await publish_packet.from_stream(adapter(reader))

    packet = asyncio.run(first())
    if (packet.topic_name, packet.data, packet.packet_id) != (TOPIC, PAYLOAD, 1):
        raise AssertionError(f"amqtt decoded {packet!r}")


# --------------------------------------------------------------------------- report


def median_rate(seconds: list[float], count: int) -> float:
    return count / statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=65_536, help="bytes per receive_data")
    args = parser.parse_args(argv)
    count: int = args.packets
    runs: int = args.runs

    data = wire(count)
    pieces = chunks(data, args.chunk)
    pieces5bare = chunks(wire(count, MQTT_5), args.chunk)
    pieces5 = chunks(wire(count, MQTT_5, PROPERTIES), args.chunk)
    check_ours(data, count, MQTT_311)
    amqtt = load_amqtt()
    if amqtt is not None:
        check_amqtt(amqtt[0], amqtt[1], data)

    # The runs interleave every measurement (run 1 of each, then run 2 of each, ...), so
    # that other work on a shared machine weighs on both codecs alike.
    jobs: dict[str, Callable[[], float]] = {
        "decode": lambda: timed(lambda: our_decode(pieces, MQTT_311), count),
        "encode": lambda: timed(lambda: our_encode(count, MQTT_311), count),
        "template": lambda: timed(lambda: our_template(count, MQTT_311), count),
        "decode5bare": lambda: timed(lambda: our_decode(pieces5bare, MQTT_5), count),
        "encode5bare": lambda: timed(lambda: our_encode(count, MQTT_5), count),
        "decode5": lambda: timed(lambda: our_decode(pieces5, MQTT_5), count),
        "encode5": lambda: timed(lambda: our_encode(count, MQTT_5, PROPERTIES), count),
    }
    if amqtt is not None:
        publish_packet, adapter, _ = amqtt
        jobs["amqtt decode"] = lambda: amqtt_decode(publish_packet, adapter, pieces, count)
        jobs["amqtt encode"] = lambda: timed(lambda: amqtt_encode(publish_packet, count), count)
    load_before = os.getloadavg()[0]
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(runs):
        for name, job in jobs.items():
            seconds[name].append(job())
    load_after = os.getloadavg()[0]
    rate = {name: median_rate(values, count) for name, values in seconds.items()}
    ours = {"decode": rate["decode"], "encode": rate["encode"]}
    template = rate["template"]
    theirs = {what: rate[f"amqtt {what}"] for what in ("decode", "encode") if amqtt is not None}

    print(
        f"{count:,} QoS 1 PUBLISHes ({len(TOPIC)}-byte topic, {len(PAYLOAD)}-byte payload, "
        f"{len(data) // count} bytes each), median of {runs} runs; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load_before:.1f} before and {load_after:.1f} after"
        + (f", amqtt {amqtt[2]}" if amqtt is not None else "")
    )
    print()
    print("| | ours (packets/s) | amqtt (packets/s) | ours / amqtt |")
    print("|---|---:|---:|---:|")
    for what in ("decode", "encode"):
        other = theirs.get(what)
        print(
            f"| {what}, MQTT 3.1.1 | {ours[what]:,.0f} | "
            + (f"{other:,.0f} | {ours[what] / other:.1f}x |" if other else "n/a | |")
        )
    other = theirs.get("encode")
    print(
        f"| encode once, then `with_packet_id` per packet | {template:,.0f} | "
        + (f"n/a | {template / other:.1f}x vs its encode |" if other else "n/a | |")
    )
    for key, label in (
        ("decode5bare", "decode, MQTT 5, no properties"),
        ("encode5bare", "encode, MQTT 5, no properties"),
        ("decode5", "decode, MQTT 5, two properties"),
        ("encode5", "encode, MQTT 5, two properties"),
    ):
        print(f"| {label} | {rate[key]:,.0f} | no MQTT 5 | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
