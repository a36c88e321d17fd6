"""A store that cannot write (a full disk, made real with a small tmpfs): nothing is
acknowledged that is not written, new QoS 1/2 messages are refused with a reason code,
and once there is room again the broker goes on and every acknowledged message arrives.
Needs root to mount the tmpfs; skipped otherwise."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import PUBACK, PUBLISH, V5, publish_packet, unique_id

PAYLOAD = b"x" * 4096


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def publish_until_refused(raw_client, server, limit: int = 2000) -> tuple[list[bytes], int]:
    """Publish QoS 1 messages until one is not acknowledged: (acknowledged payloads, the
    reason code or -1 when the connection was closed instead)."""
    pub = raw_client(server, V5)
    pub.connect(unique_id("pub"))
    acked = []
    for i in range(1, limit):
        payload = b"%d:" % i + PAYLOAD
        pub.send(publish_packet("disk/t", payload, qos=1, packet_id=i, version=V5))
        pkt = pub.read_packet()
        if pkt is None:
            return acked, -1
        assert pkt.type == PUBACK and pkt.packet_id == i
        if pkt.reason_code:
            return acked, pkt.reason_code
        acked.append(payload)
    raise AssertionError("the disk never filled up")


def test_a_full_disk_refuses_instead_of_acknowledging_and_loses_nothing(
    start_broker, raw_client, small_disk
):
    server = start_broker(store={"backend": "leveldb", "path": str(small_disk), "sync": False})
    client_id = unique_id("sub")
    sub = raw_client(server, V5)
    sub.connect(client_id, clean=False, properties={0x11: 300})
    sub.subscribe(("disk/t", 1))
    sub.disconnect()

    acked, outcome = publish_until_refused(raw_client, server)
    assert acked  # some fitted
    assert outcome == -1  # the turn whose commit failed: closed, not acknowledged
    refusing = raw_client(server, V5)
    refusing.connect(unique_id("pub"))
    refusing.send(publish_packet("disk/t", b"refused", qos=1, packet_id=1, version=V5))
    refusal = refusing.expect(PUBACK)
    assert refusal.reason_code == 0x80
    assert counters(server)["store_publish_refused"] == 1

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    refusing.send(publish_packet("disk/t", b"after", qos=1, packet_id=2, version=V5))
    assert refusing.expect(PUBACK).reason_code == 0  # the kept batch went in first
    back = raw_client(server, V5)
    back.connect(client_id, clean=False, properties={0x11: 300})
    got = []
    while not got or got[-1] != b"after":
        pkt = back.expect(PUBLISH)
        back.ack(pkt)
        got.append(pkt.payload)
    assert set(acked) <= set(got)  # every acknowledged message; the unacknowledged one
    assert b"refused" not in got  # may be there too (QoS 1 lets the publisher resend it)


def counters(server) -> dict[str, int]:
    return server.call(server.broker.metrics.snapshot)
