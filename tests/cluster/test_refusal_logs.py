"""CONNECTs refused while Redis is away are logged as an episode, not one by one: the
first refusal in full, then one line per 10 s counting the others ("N connects refused
in the last 10 s: metadata unavailable"), then one line when a registration works again
(broker/client/connect.py over broker/episodes.py's Episode).

A hostile probe counted two lines per refused CONNECT, about 12,000 lines per node in
15 s of outage. Here one node runs in-process (tests/conftest.py's start_broker) on a
redis-server of the test's own, which the test stops and starts again; real MQTT 3.1.1
clients (raw sockets) connect and are refused with CONNACK 3 (server unavailable); the
broker's clock is moved forward to end the 10 s interval (no sleep).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from testing.redis_server import RedisServer
from tests.broker.helpers import RawClient, unique_id
from tests.cluster.nodes import cluster_of, start_in_process_node

SERVER_UNAVAILABLE = 3  # MQTT 3.1.1 CONNACK code
CONNECTION_LOGGER = "nautilus.connection"


def connect(server: Any, code: int) -> None:
    client = RawClient(server.host, server.port)
    try:
        client.connect(unique_id(), expect_code=code)
        if code:
            client.expect_closed()
    finally:
        client.close()


def test_connects_refused_in_an_outage_are_counted_not_logged_one_by_one(
    start_broker: Any, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = start_in_process_node(start_broker, own_redis.url)
    sync = cluster_of(server).sync
    connect(server, 0)

    own_redis.stop()
    server.wait_for(lambda: not sync.available)
    before = len(caplog.records)
    for _ in range(300):
        connect(server, SERVER_UNAVAILABLE)
    during = caplog.records[before:]
    refusals = [r for r in during if r.name == CONNECTION_LOGGER]
    assert len(refusals) == 1, [r.getMessage() for r in during]
    (first,) = refusals
    assert first.levelno == logging.WARNING
    message = first.getMessage()
    assert "connection refused (reason 0x88): cannot register in the cluster:" in message
    assert "refused CONNECTs are counted: one line per 10 s" in message
    assert len(during) <= 3, [r.getMessage() for r in during]  # and nothing else per client

    server.advance(10.0)  # the interval ends: the others, counted
    counted = [r for r in caplog.records[before:] if r.name == CONNECTION_LOGGER][1:]
    assert [(r.levelno, r.getMessage()) for r in counted] == [
        (logging.WARNING, "299 connects refused in the last 10 s: metadata unavailable")
    ]

    for _ in range(50):
        connect(server, SERVER_UNAVAILABLE)
    own_redis.start()  # empty: the node writes its sessions back
    server.wait_for(lambda: sync.available)
    connect(server, 0)
    lines = [r.getMessage() for r in caplog.records[before:] if r.name == CONNECTION_LOGGER]
    assert len(lines) == 4, lines
    assert lines[2].startswith("50 connects refused in the last ")
    assert lines[2].endswith(" s: metadata unavailable")
    assert lines[3].startswith(
        "cluster registrations work again: connects accepted (350 connects refused in "
    )
    connect(server, 0)  # no episode: nothing more
    assert len([r for r in caplog.records[before:] if r.name == CONNECTION_LOGGER]) == 4
    metrics = server.call(server.broker.metrics.snapshot)
    assert metrics["cluster_registrations_refused"] == 350
