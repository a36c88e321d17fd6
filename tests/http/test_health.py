"""/health and /health/ping: 200 when the broker is ready, 503 with the reason while its
store cannot write. The failing store is a real full disk (a 1 MB tmpfs under a LevelDB
store, as tests/broker/test_store_full_disk.py makes it), which needs root to mount."""

from __future__ import annotations

import subprocess

from tests.broker.helpers import PUBACK, V5, publish_packet, unique_id
from tests.broker.test_store_full_disk import small_disk

from .conftest import get, scrape

__all__ = ["small_disk"]  # a fixture: a 1 MB tmpfs

STORE_FAILED = "the store cannot write (QoS 1/2 publishes are refused)"


def test_ready_broker_answers_ok(start_broker):
    server = start_broker()
    reply = get(server, "/health")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.json == {"status": "ok"}
    assert get(server, "/status.json").json[0]["nautilus"]["ready"] is True


def test_ping_answers_pong(start_broker):
    reply = get(start_broker(), "/health/ping")
    assert (reply.status, reply.text) == (200, "pong")


def test_unknown_path_is_404_and_health_takes_no_post(start_broker):
    server = start_broker()
    assert get(server, "/nothing-here").status == 404
    assert get(server, "/health", method="POST").status == 405


def test_not_ready_while_the_store_cannot_write_and_ready_again_after(
    start_broker, raw_client, small_disk
):
    server = start_broker(store={"backend": "leveldb", "path": str(small_disk), "sync": False})
    assert get(server, "/health").status == 200
    # An offline persistent session, so every QoS 1 message is written to the store.
    client_id = unique_id("sub")
    sub = raw_client(server, V5)
    sub.connect(client_id, clean=False, properties={0x11: 300})
    sub.subscribe(("disk/t", 1))
    sub.disconnect()
    pub = raw_client(server, V5)
    pub.connect(unique_id("pub"))
    for i in range(1, 2000):  # until the commit fails: the connection is closed
        pub.send(publish_packet("disk/t", b"x" * 4096, qos=1, packet_id=i, version=V5))
        ack = pub.read_packet()
        if ack is None:
            break
        assert (ack.type, ack.reason_code) == (PUBACK, 0)
    else:
        raise AssertionError("the disk never filled up")

    reply = get(server, "/health")
    assert reply.status == 503
    assert reply.json == {"status": "not ready", "reasons": [STORE_FAILED]}
    assert get(server, "/status.json").json[0]["nautilus"]["ready"] is False
    assert get(server, "/health/ping").text == "pong"  # alive, if not ready
    failing = scrape(server)  # the store's own figures say so too
    assert failing("store_failed") == 1
    assert failing("store_write_failures") >= 1

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = raw_client(server, V5)
    again.connect(unique_id("pub"))
    again.send(publish_packet("disk/t", b"after", qos=1, packet_id=1, version=V5))
    assert again.expect(PUBACK).reason_code == 0  # the kept batch went in, and this one
    reply = get(server, "/health")
    assert (reply.status, reply.json) == (200, {"status": "ok"})
    working = scrape(server)
    assert working("store_failed") == 0
    assert working("store_commits") > 0
    assert working("store_write_failures") == failing("store_write_failures")
