"""A connect storm against a real broker with the passwd plugin: hundreds of real
clients (raw sockets) send their CONNECT at once, each with a scrypt password that takes
the pool tens of milliseconds, far more than it can check before the clients give up.

- A client that the connect timeout closes while its check waits in the pool's queue is
  never hashed: the broker cancels its hook, and the plugin takes the check out of the
  queue (`dropped`). Only checks a thread had already started are wasted.
- At most `max_queued_checks` wait at once; a CONNECT beyond them is refused at once as
  server busy (MQTT 3.1.1 CONNACK 3), while the queued ones still get in.

The connect timeout is fired with `server.advance` once every CONNECT has reached the
plugin, not waited for.
"""

from __future__ import annotations

import os

import pytest

from plugins.passwd.hashes import make_hash
from plugins.passwd.plugin import PasswdPlugin
from tests.broker.helpers import RawClient, connect_packet, unique_id

PASSWORD = b"storm"
# n=16384 is ~40 ms of one core: a few hundred CONNECTs are seconds of hashing.
SLOW_HASH = make_hash(PASSWORD, n=16384)
THREADS = os.cpu_count() or 1  # the plugin's pool
CONNACK_ACCEPTED, CONNACK_SERVER_UNAVAILABLE = 0, 3


def start(start_broker, tmp_path, **passwd):
    path = tmp_path / "passwd"
    path.write_text(f"storm:{SLOW_HASH}\n", encoding="utf-8")
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={
            "passwd": {
                "enabled": True,
                "password_file": str(path),
                "password_reload_interval": 0,
                **passwd,
            }
        },
    )
    plugin = next(p for _, p in server.broker.plugins if isinstance(p, PasswdPlugin))
    return server, plugin


@pytest.fixture
def storm(request):
    """storm(server, n) -> n clients, each having sent its CONNECT (closed at the end)."""
    made: list[RawClient] = []

    def send(server, n: int) -> list[RawClient]:
        clients = [RawClient(server.host, server.port) for _ in range(n)]
        made.extend(clients)
        for client in clients:
            client.send(connect_packet(unique_id("storm"), username="storm", password=PASSWORD))
        return clients

    yield send
    for client in made:
        client.close()


def answer(client: RawClient) -> int | None:
    """The client's CONNACK return code, or None if the broker closed it without one."""
    packet = client.read_packet()
    return None if packet is None else packet.body[1]


def test_clients_closed_by_the_connect_timeout_are_not_hashed(start_broker, tmp_path, storm):
    server, plugin = start(start_broker, tmp_path)
    clients = storm(server, 300)
    server.wait_for(lambda: plugin.queued + plugin.hashed == 300)  # every CONNECT is in
    server.wait_for(lambda: plugin.hashed > THREADS)  # the first ones are getting in
    server.advance(server.config.broker.connect_timeout)
    server.wait_for(lambda: plugin.queued == 0)

    answers = [answer(client) for client in clients]
    connected = answers.count(CONNACK_ACCEPTED)
    assert connected + answers.count(None) == 300
    assert connected >= 1
    # Hashes for clients already closed: the ones the threads were running when the
    # timeout fired, and the few they start while the loop's one turn closes 300 clients
    # (~40 ms each, a turn of tens of milliseconds: at most a couple per thread).
    assert plugin.hashed - connected <= 3 * THREADS
    assert plugin.dropped == 300 - plugin.hashed
    assert plugin.dropped > 200  # the bulk of the storm cost nothing


def test_beyond_max_queued_checks_a_connect_is_refused_as_busy(start_broker, tmp_path, storm):
    server, plugin = start(start_broker, tmp_path, max_queued_checks=20)
    clients = storm(server, 100)

    answers = [answer(client) for client in clients]
    connected = answers.count(CONNACK_ACCEPTED)
    busy = answers.count(CONNACK_SERVER_UNAVAILABLE)
    assert connected + busy == 100  # each got an answer, none waited in vain
    assert connected >= 20  # every check let into the queue got in
    assert busy == plugin.refused_busy >= 50
    assert plugin.hashed == connected
    assert plugin.dropped == 0
