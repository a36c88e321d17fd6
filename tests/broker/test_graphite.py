"""[graphite]: every /metrics figure in Graphite's plaintext protocol, to a real TCP
receiver on 127.0.0.1, and sent again after the receiver went away and came back; and
to a real carbon-cache (testing/carbon.py), which writes them to whisper files."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from broker.graphite import lines
from hooks import Metric
from testing.carbon import CarbonCache

TIMEOUT = 10.0


class Receiver:
    """A Graphite stand-in: accepts connections on one port, keeps what it reads."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.data = bytearray()
        self.connections: list[socket.socket] = []
        self.lock = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.sock.accept()
                self.connections.append(conn)
                threading.Thread(target=self._read, args=(conn,), daemon=True).start()
        except OSError:  # closed
            pass

    def _read(self, conn: socket.socket) -> None:
        try:
            while chunk := conn.recv(65536):
                with self.lock:
                    self.data += chunk
                    self.lock.notify_all()
        except OSError:  # closed by close()
            pass

    def wait_for(self, text: bytes) -> list[bytes]:
        """The lines received, once one contains `text`."""
        with self.lock:
            assert self.lock.wait_for(lambda: text in self.data, TIMEOUT), bytes(self.data[-500:])
            return bytes(self.data).splitlines()

    def close(self) -> None:
        """Gone: the port closed (shut down first: that wakes the accepting thread, whose
        accept() would otherwise keep the port bound), and every connection with it."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.connections:
            conn.close()


def test_lines_have_the_path_value_and_time():
    metrics = [
        Metric("mqtt_publish_received", 1532),
        Metric("vmq_bridge_connected", True, "gauge", (("name", "cloud.eu"),)),
        Metric("auth_db_query_seconds", 0.25),
    ]
    assert lines(metrics, "key.mqtt.node1", 1795760000).decode().splitlines() == [
        "key.mqtt.node1.mqtt_publish_received 1532 1795760000",
        "key.mqtt.node1.vmq_bridge_connected.cloud_eu 1 1795760000",  # a dot: not a level
        "key.mqtt.node1.auth_db_query_seconds 0.25 1795760000",
    ]


def test_the_figures_go_to_graphite_and_again_after_it_was_away(start_broker):
    receiver = Receiver()
    graphite = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": receiver.port,
        "interval": 0.2,
        "prefix": "mqtt",
        "api_key": "k",
    }
    server = start_broker(graphite=graphite)
    got = receiver.wait_for(b"k.mqtt.nautilus.mqtt_publish_received ")
    line = next(x for x in got if x.startswith(b"k.mqtt.nautilus.mqtt_publish_received "))
    _, value, stamp = line.split()
    assert int(value) >= 0 and abs(int(stamp) - time.time()) < 60
    assert any(x.startswith(b"k.mqtt.nautilus.uptime_seconds ") for x in got)
    reporter = server.broker.graphite
    port = receiver.port
    receiver.close()
    rounds = server.call(lambda: reporter.sent_rounds)
    server.wait_for(lambda: reporter._failing)  # the connection broke: said once
    again = Receiver(port)  # back on the same port: the next round reconnects
    again.wait_for(b"k.mqtt.nautilus.mqtt_publish_received ")
    assert server.call(lambda: reporter.sent_rounds) > rounds
    again.close()


@pytest.fixture
def carbon(tmp_path) -> Iterator[CarbonCache]:
    cache = CarbonCache(tmp_path)
    try:
        yield cache.start()
    finally:
        cache.close()
        assert not cache.running  # the process is gone, not left running


def test_a_real_carbon_cache_receives_the_figures(carbon, start_broker, raw_client):
    graphite = {"enabled": True, "host": "127.0.0.1", "port": carbon.port, "interval": 0.2}
    server = start_broker(graphite={**graphite, "prefix": "mqtt", "api_key": "k"})
    client = raw_client(server)
    client.connect("to-graphite")
    for _ in range(3):
        client.publish("t", b"m", qos=1)
    server.wait_for(lambda: server.broker.metrics.mqtt_publish_received == 3)

    points = carbon.written("k.mqtt.nautilus.mqtt_publish_received", 3)
    assert abs(points[-1][0] - time.time()) < 60
    assert carbon.values("k.mqtt.nautilus.total_active_connections")[-1][1] == 1
    assert carbon.whisper_file("k.mqtt.nautilus.uptime_seconds").exists()
