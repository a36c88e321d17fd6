"""The MQTT sink's publishing (spark_consumers.mqtt_sink.deliver) against a real broker,
without Spark: a connection dropped mid-batch is made again and nothing is lost; a
certificate for another name is refused at once; a broker that never answers fails the
batch after the timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import trustme

from broker.protocol import ReasonCode
from spark_consumers.errors import QueryFailed
from spark_consumers.mqtt_sink import MqttOptions, deliver, mqtt_target
from tests.broker.test_tls import issue

pytestmark = pytest.mark.timeout(60)

NO_ENV: dict[str, str] = {}


def messages(count: int) -> list[tuple[str, bytes]]:
    return [(f"$analytics/t/{n}", f"row {n}".encode()) for n in range(count)]


def test_a_connection_dropped_mid_batch_is_made_again_and_nothing_is_lost(
    start_broker, paho_client
):
    server = start_broker()
    metrics = server.broker.metrics
    target = mqtt_target(f"mqtt://{server.host}:{server.port}", "t", environ=NO_ENV)
    batch = messages(1000)

    def cut_after(received: int):
        """A condition, run on the broker's loop: once the broker has `received`
        PUBLISHes, close the sink's connection (DISCONNECT 0x98, as `session
        disconnect` does), the batch half sent; then hold."""

        def cut() -> bool:
            if metrics.mqtt_publish_received < received:
                return False
            for connection in list(server.broker.connections):
                connection.close(ReasonCode.ADMINISTRATIVE_ACTION)
            return True

        return cut

    publishing = threading.Thread(target=deliver, args=(target, batch))
    publishing.start()
    server.wait_for(cut_after(50))
    publishing.join(30)
    assert not publishing.is_alive()
    assert metrics.mqtt_connect_received == 2  # the sink connected again
    assert metrics.mqtt_publish_received < 2 * len(batch)  # and sent what was left
    reader = paho_client(server, 5)
    reader.subscribe("$analytics/t/#", 1)
    got = {m.topic: m.payload for m in (reader.expect_message() for _ in batch)}
    assert got == {topic: payload for topic, payload in batch}


def test_a_certificate_for_another_name_is_refused_at_once(start_broker, tmp_path):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    only_the_address = issue(ca, tmp_path, "server", "127.0.0.1", cn="nautilus")
    listener = {
        "type": "ssl",
        "address": "127.0.0.1:0",
        "certfile": only_the_address.certfile,
        "keyfile": only_the_address.keyfile,
    }
    server = start_broker(listeners=[listener])
    options = MqttOptions(cafile=str(tmp_path / "ca.pem"), timeout=30)
    by_name = mqtt_target(f"mqtts://spark@localhost:{server.port}", "t", options, environ=NO_ENV)
    started = time.monotonic()
    with pytest.raises(QueryFailed) as caught:
        deliver(by_name, messages(1))
    assert time.monotonic() - started < options.timeout / 3  # not tried again
    assert str(caught.value) == (
        f"MQTT sink mqtts://spark@localhost:{server.port}: TLS: certificate verify failed: "
        "Hostname mismatch, certificate is not valid for 'localhost'."
    )
    # The same certificate, by the address it names: accepted (and the row published).
    by_address = mqtt_target(f"mqtts://127.0.0.1:{server.port}", "t", options, environ=NO_ENV)
    deliver(by_address, messages(1))
    assert server.broker.metrics.mqtt_publish_received == 1


def test_a_broker_that_never_answers_fails_the_batch_after_the_timeout():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, says nothing
        port = silent.getsockname()[1]
        options = MqttOptions(timeout=1)
        target = mqtt_target(f"mqtt://spark@127.0.0.1:{port}", "t", options, environ=NO_ENV)
        started = time.monotonic()
        with pytest.raises(QueryFailed) as caught:
            deliver(target, messages(3))
        assert 1 <= time.monotonic() - started < 5
    assert str(caught.value) == (
        f"MQTT sink mqtt://spark@127.0.0.1:{port}: broker unreachable for 1 s: no CONNACK"
    )
