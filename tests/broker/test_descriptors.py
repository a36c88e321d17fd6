"""Resources the listeners run out of, said once per episode (broker/episodes.py, and its
rules: tests/unit/test_episodes.py): an MQTT listener's max_connections (its ConnectionCap), and the
process's file descriptors (RLIMIT_NOFILE, broker/descriptors.py) when accept() fails
with EMFILE. ([http]'s own cap: tests/http/test_limits.py.)

The descriptor test lowers this process's own soft RLIMIT_NOFILE to a few above what is
open (the broker serves on a thread of it) and opens connections until none is left; the
limit is put back whatever happens. The broker's loop here is asyncio's, whose accept()
reports each failure to the loop's exception handler (a traceback each, by default).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import socket

import pytest

from tests.broker.helpers import V311, unique_id


def records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_a_listener_at_max_connections_says_so_once_and_again_when_it_accepts(
    start_broker, raw_client, caplog
):
    caplog.set_level(logging.INFO, logger="nautilus")
    server = start_broker(listeners=[{"address": "127.0.0.1:0", "max_connections": 2}])
    first = raw_client(server, V311)
    first.connect(unique_id())
    raw_client(server, V311).connect(unique_id())
    for _ in range(3):
        assert raw_client(server, V311).expect_closed() == []
    name = "listeners[0] (tcp on 127.0.0.1:0)"  # as configured
    assert [(r.levelno, r.getMessage()) for r in records(caplog, "listeners[0]")] == [
        (logging.WARNING, f"{name}: 2 connections open, max_connections 2: refusing new ones")
    ]
    first.close()  # 1 open: 90% of 2
    server.wait_for(lambda: server.broker.listener_connections[0] < 2)
    (again,) = records(caplog, "accepting again")
    assert again.levelno == logging.INFO
    assert re.fullmatch(
        rf"{re.escape(name)}: accepting again, 1 open \(3 connections refused in \d+ s\)",
        again.getMessage(),
    ), again.getMessage()
    raw_client(server, V311).connect(unique_id())


def test_running_out_of_file_descriptors_is_one_line_and_so_is_the_recovery(
    start_broker, raw_client, caplog
):
    caplog.set_level(logging.INFO)  # asyncio's own lines too
    server = start_broker()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients: list[socket.socket] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
        with contextlib.suppress(OSError):  # EMFILE, here or in the broker: either way full
            for _ in range(100):
                clients.append(socket.create_connection((server.host, server.port), 2))
        assert len(clients) < 100
        server.wait_for(lambda: server.broker.descriptors.out.active)  # an accept or the probe
        for _ in range(3):  # accept() is tried again every second, the probe runs each second
            server.advance(1)
        out = records(caplog, "listeners cannot accept connections")
        assert len(out) == 1, [r.getMessage() for r in out]
        assert out[0].levelno == logging.WARNING
        assert re.fullmatch(
            r"listeners cannot accept connections: Too many open files \(RLIMIT_NOFILE \d+; "
            r"connections open: \d+ MQTT, 0 HTTP\): new connections are refused until some close",
            out[0].getMessage(),
        ), out[0].getMessage()

        for client in clients:
            client.close()
        clients.clear()
        server.wait_for(lambda: sum(server.broker.listener_connections) == 0)
        server.advance(1)  # accept() again: the connections waiting are taken (and closed)
        server.advance(3)  # the probe opens a descriptor, and no accept failed meanwhile
        server.wait_for(lambda: not server.broker.descriptors.out.active)
    finally:
        for client in clients:
            client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    (back,) = records(caplog, "listeners accept again")
    assert back.levelno == logging.INFO
    assert re.fullmatch(
        r"listeners accept again: file descriptors are free, connections open: \d+ MQTT, 0 HTTP "
        r"\(\d+ failed accepts and probes in \d+ s\)",
        back.getMessage(),
    ), back.getMessage()
    assert not records(caplog, "socket.accept() out of system resource")  # asyncio's
    assert not [r for r in caplog.records if r.exc_info]
    raw_client(server, V311).connect(unique_id())
