"""`python -m bench.relay_choices`: the measurements behind two choices of the event relay.

1. The encoding of an event: msgpack (as an array, and as a map with field names), JSON
   (a map, the payload in base64) and protobuf (Courier's OnPublish, the generated class):
   encode and decode cost per event and bytes per event, for an on_publish with a 64-byte
   payload, in this process, on this machine.
2. The spool: one batch per loop turn of 100 events of 110 bytes, written to LevelDB
   (plyvel write batch) or appended to a segment file, each with and without fsync.

Prints Markdown tables (docs/event-relay.md and docs/performance.md quote them).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import msgpack
import plyvel

from event_relay.schema import COMMON, TYPES

PAYLOAD = bytes(range(64))
VALUES: list[Any] = [
    123_456_789,
    1_795_428_252_802_875_502,
    3,
    "sensor-0042",
    "",
    "fleet",
    "799eef0c-4550-4083-9dde-44f7a609afa0",
    "fleet/sensor-0042/temperature",
    1,
    False,
    len(PAYLOAD),
    PAYLOAD,
    "telemetry",
    "fleet/+/temperature",
]
FIELDS = COMMON + TYPES[3][1]


def _per_call(function: Callable[[], Any], number: int = 100_000) -> float:
    """Seconds per call, best of five rounds."""
    return min(timeit.repeat(function, number=number, repeat=5)) / number


def encodings() -> list[tuple[str, float, float, int]]:
    """(encoding, encode s/event, decode s/event, bytes/event)."""
    packer = msgpack.Packer()
    as_map = dict(zip(FIELDS, VALUES, strict=True))
    rows = []
    array = packer.pack(VALUES)
    rows.append(
        (
            "msgpack array (chosen)",
            _per_call(lambda: packer.pack(VALUES)),
            _per_call(lambda: msgpack.unpackb(array)),
            len(array),
        )
    )
    mapped = packer.pack(as_map)
    rows.append(
        (
            "msgpack map",
            _per_call(lambda: packer.pack(as_map)),
            _per_call(lambda: msgpack.unpackb(mapped)),
            len(mapped),
        )
    )

    def to_json() -> bytes:
        return json.dumps(
            {**as_map, "payload": base64.b64encode(as_map["payload"]).decode()}
        ).encode()

    text = to_json()
    rows.append(("JSON map", _per_call(to_json), _per_call(lambda: json.loads(text)), len(text)))
    protobuf = _protobuf()
    if protobuf is not None:
        encode, decode, size = protobuf
        rows.append(("protobuf (OnPublish)", _per_call(encode), _per_call(decode), size))
    return rows


def _protobuf() -> tuple[Callable[[], bytes], Callable[[], Any], int] | None:
    try:
        from event_relay.sidecar_pb import on_publish_pb2
    except ImportError:
        return None
    message_class = on_publish_pb2.OnPublish

    def encode() -> bytes:
        message = message_class(
            username=VALUES[5],
            client_id=VALUES[3],
            mountpoint=VALUES[4],
            qos=VALUES[8],
            topic=VALUES[7],
            payload=VALUES[11],
            retain=VALUES[9],
            session_id=VALUES[6],
        )
        message.timestamp.seconds, message.timestamp.nanos = divmod(VALUES[1], 10**9)
        message.matched_acl.name = VALUES[12]
        message.matched_acl.pattern = VALUES[13]
        data: bytes = message.SerializeToString()
        return data

    data = encode()
    return encode, lambda: message_class.FromString(data), len(data)


def spools(turns: int = 2000, per_turn: int = 100) -> list[tuple[str, float]]:
    """(spool, events/s) writing `turns` batches of `per_turn` events."""
    event = bytes(110)
    rows = []
    for sync in (False, True):
        with tempfile.TemporaryDirectory() as directory:
            db = plyvel.DB(directory, create_if_missing=True)
            seq = 0
            started = time.perf_counter()
            for _ in range(turns):
                batch = db.write_batch(sync=sync)
                for _ in range(per_turn):
                    seq += 1
                    batch.put(b"e" + seq.to_bytes(8, "big"), event)
                batch.write()
            rows.append((f"LevelDB, sync={sync}", seq / (time.perf_counter() - started)))
            db.close()
        with tempfile.TemporaryDirectory() as directory:
            count = 0
            started = time.perf_counter()
            with open(os.path.join(directory, "segment"), "ab") as segment:
                for _ in range(turns):
                    chunk = []
                    for _ in range(per_turn):
                        count += 1
                        chunk.append(len(event).to_bytes(4, "big") + event)
                    segment.write(b"".join(chunk))
                    segment.flush()
                    if sync:
                        os.fsync(segment.fileno())
            rows.append((f"segment file, fsync={sync}", count / (time.perf_counter() - started)))
    return rows


def main() -> int:
    print("| Encoding | Encode (µs/event) | Decode (µs/event) | Bytes/event |")
    print("|---|---|---|---|")
    for name, encode, decode, size in encodings():
        print(f"| {name} | {encode * 1e6:.2f} | {decode * 1e6:.2f} | {size} |")
    print()
    print("| Spool (100 events per batch) | Events/s |")
    print("|---|---|")
    for name, rate in spools():
        print(f"| {name} | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
