"""What an idle connection costs: the broker's resident memory per connection, measured as
bench.compare's idle row measures it (VmRSS after minus before, per connection), with the
clients real operators have: MQTT 3.1.1, a clean session, keepalive 60 s (paho's default)
and one subscription to a topic of their own.

The broker is the real `python -m broker` (its own process, uvloop, as deployed); the
clients are raw sockets of this process, which send CONNECT and SUBSCRIBE at once and wait
for CONNACK and SUBACK: then the broker holds everything an idle client costs it.

The budget is issue #42's: 2 KiB a connection is the goal; this test holds what was
reached, with a margin. (uvloop's own share is about 1.1 KiB a connection, its transport
and libuv handle: what is left to the broker's objects is under 1 KiB for 2 KiB;
bench/idle_memory.py reports the breakdown.)
"""

from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path

from tests.test_cli import BrokerProcess, write_config

from .helpers import connect_packet, subscribe_packet

CLIENTS = 2000
WARM_UP = 200  # connections first made and kept, so that what is made once is not counted
# Measured here: 4.2 KiB (4.16-4.20 in three runs), 5.3 KiB before issue #42's cuts, which
# this budget fails. (bench/idle_memory.py says 3.8 KiB at 3,000 clients: the broker's
# tables grow by doubling, so the figure depends a little on the count.)
BUDGET_KIB = 4.5
ANSWERS = 4 + 5  # CONNACK, and a SUBACK granting one filter
TIMEOUT = 60.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def idle_clients(port: int, first: int, count: int) -> list[socket.socket]:
    """`count` clients, each connected with a clean session and subscribed to its own
    topic, once the broker has answered them all."""
    selector = selectors.DefaultSelector()
    clients = []
    for n in range(first, first + count):
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(
            connect_packet(f"idle-{n}", keepalive=60)
            + subscribe_packet(1, [(f"idle/{n}/state", 1)])
        )
        client.setblocking(False)
        selector.register(client, selectors.EVENT_READ, [0])
        clients.append(client)
    waiting = count
    deadline = time.monotonic() + TIMEOUT
    while waiting:
        assert time.monotonic() < deadline, f"{waiting} of {count} clients not answered"
        for key, _ in selector.select(1.0):
            data = key.fileobj.recv(64)  # type: ignore[union-attr]
            assert data, "the broker closed a connection"
            key.data[0] += len(data)
            if key.data[0] >= ANSWERS:
                selector.unregister(key.fileobj)
                waiting -= 1
    selector.close()
    return clients


def test_an_idle_subscribed_client_costs_the_budget(tmp_path):
    broker = BrokerProcess(write_config(tmp_path / "nautilus.toml"), cwd=tmp_path)
    clients: list[socket.socket] = []
    try:
        clients += idle_clients(broker.port, 0, WARM_UP)
        before = rss_kib(broker.proc.pid)
        clients += idle_clients(broker.port, WARM_UP, CLIENTS)
        per_connection = (rss_kib(broker.proc.pid) - before) / CLIENTS
        assert per_connection <= BUDGET_KIB, f"{per_connection:.2f} KiB a connection"
    finally:
        for client in clients:
            client.close()
        broker.kill()
