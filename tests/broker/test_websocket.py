"""MQTT over WebSockets (`ws` and `wss` listeners) with real clients: paho-mqtt's
websocket transport (v3.1.1 and v5), and the `websockets` library's client carrying the
raw MQTT bytes of tests/broker/helpers.py, for what paho cannot do (refused handshakes,
text frames, an open-loop flood against a subscriber that reads nothing)."""

from __future__ import annotations

import re
import ssl
import threading
import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
import trustme
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus
from websockets.frames import CloseCode
from websockets.sync.client import ClientConnection, connect

from broker.config import ConfigError, config_from_dict

from .helpers import PUBACK, PUBLISH, TIMEOUT, RawClient, publish_packet, unique_id

WS = {"type": "ws", "address": "127.0.0.1:0"}


class WsRawClient(RawClient):
    """RawClient's MQTT steps over a real WebSocket client (binary frames)."""

    def __init__(self, url: str, max_queue: int = 16, **kwargs) -> None:
        # Entered as a context manager: websockets 17 deprecates a bare connect().
        self.ws: ClientConnection = connect(
            url, subprotocols=["mqtt"], max_queue=max_queue, open_timeout=TIMEOUT, **kwargs
        ).__enter__()
        self.version = 4
        self._buf = bytearray()
        self._eof = False
        self._ids = iter(range(1, 1_000_000))
        self.stash = []

    def send(self, data: bytes) -> None:
        self.ws.send(data)

    def _fill(self, deadline: float) -> bool:
        if self._eof:
            return False
        try:
            frame = self.ws.recv(timeout=max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise TimeoutError("no packet from the broker in time") from None
        except ConnectionClosed:
            self._eof = True
            return False
        assert isinstance(frame, bytes), f"a text frame from the broker: {frame!r}"
        self._buf += frame
        return True

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def ws_broker(start_broker):
    return start_broker(listeners=[WS])


def url(server, path: str = "/mqtt", scheme: str = "ws") -> str:
    return f"{scheme}://{server.host}:{server.port}{path}"


def paho(server, version: int, **tls) -> Iterator[mqtt.Client]:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=unique_id("paho-ws"),
        transport="websockets",
        protocol=version,
    )
    client.ws_set_options(path="/mqtt")
    if tls:
        client.tls_set(**tls)
    return client


@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["v311", "v5"])
def test_paho_over_websockets_round_trip(ws_broker, version):
    client = paho(ws_broker, version)
    connected, got = threading.Event(), []
    arrived = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.on_message = lambda _c, _u, message: (got.append(message), arrived.set())
    client.connect(ws_broker.host, ws_broker.port)
    client.loop_start()
    try:
        assert connected.wait(TIMEOUT)
        subscribed = threading.Event()
        client.on_subscribe = lambda *args: subscribed.set()
        client.subscribe("ws/#", qos=1)
        assert subscribed.wait(TIMEOUT)
        payload = bytes(range(256)) * 300  # 76 KB: many frames' worth on the way
        client.publish("ws/big", payload, qos=1).wait_for_publish(TIMEOUT)
        assert arrived.wait(TIMEOUT)
        assert (got[0].topic, got[0].payload, got[0].qos) == ("ws/big", payload, 1)
    finally:
        client.disconnect()
        client.loop_stop()


def test_wss_with_a_client_certificate(start_broker, tmp_path):
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1")
    files = {name: str(tmp_path / name) for name in ("server.crt", "server.key", "ca.crt")}
    server_cert.cert_chain_pems[0].write_to_path(files["server.crt"])
    server_cert.private_key_pem.write_to_path(files["server.key"])
    ca.cert_pem.write_to_path(files["ca.crt"])
    server = start_broker(
        listeners=[
            {
                "type": "wss",
                "address": "127.0.0.1:0",
                "certfile": files["server.crt"],
                "keyfile": files["server.key"],
                "cafile": files["ca.crt"],
                "require_certificate": True,
            }
        ]
    )
    context = ssl.create_default_context(cafile=files["ca.crt"])
    ca.issue_cert("browser-1").configure_cert(context)
    client = WsRawClient(url(server, scheme="wss"), ssl=context)
    try:
        client.connect("over-wss")
        assert client.is_open()
    finally:
        client.close()
    # Without a certificate the TLS handshake is refused: no WebSocket, no MQTT. In TLS 1.3
    # the refusal comes after the client's side of the handshake, so the client may see
    # only the connection ending (EOFError) while it reads the HTTP answer.
    with pytest.raises((ssl.SSLError, ConnectionError, ConnectionClosed, InvalidMessage, EOFError)):
        bare = WsRawClient(
            url(server, scheme="wss"), ssl=ssl.create_default_context(cafile=files["ca.crt"])
        )
        bare.connect("no-cert")


def test_the_handshake_is_refused_off_the_path_and_without_the_subprotocol(ws_broker):
    with pytest.raises(InvalidStatus) as wrong_path:
        connect(url(ws_broker, "/ws"), subprotocols=["mqtt"], open_timeout=TIMEOUT)
    assert wrong_path.value.response.status_code == 404
    with pytest.raises(InvalidStatus) as no_subprotocol:
        connect(url(ws_broker), open_timeout=TIMEOUT)
    assert no_subprotocol.value.response.status_code == 400
    # A query string is not part of the path; and old 3.1 clients' subprotocol is accepted.
    with connect(
        url(ws_broker, "/mqtt?x=1"), subprotocols=["mqttv3.1"], open_timeout=TIMEOUT
    ) as old:
        assert old.subprotocol == "mqttv3.1"


def test_a_text_frame_closes_the_connection_with_1003(ws_broker):
    client = WsRawClient(url(ws_broker))
    other = WsRawClient(url(ws_broker))
    try:
        client.connect("texter")
        other.connect("bystander")
        client.ws.send("not MQTT")  # a text frame
        with pytest.raises(ConnectionClosed):
            client.ws.recv(timeout=TIMEOUT)
        assert client.ws.close_code == CloseCode.UNSUPPORTED_DATA
        assert other.is_open()
    finally:
        client.close()
        other.close()


def test_malformed_mqtt_over_websockets_closes_only_that_connection(ws_broker):
    client = WsRawClient(url(ws_broker))
    other = WsRawClient(url(ws_broker))
    try:
        other.connect("bystander")
        client.send(b"\x10\xff\xff\xff\xff\x01")  # a remaining length of more than 4 bytes
        assert client.expect_closed() == []
        assert other.is_open()
    finally:
        client.close()
        other.close()


def test_pings_are_answered_while_mqtt_goes_on(ws_broker):
    client = WsRawClient(url(ws_broker))
    try:
        client.connect("pinged")
        assert client.ws.ping().wait(TIMEOUT)  # the pong came back
        assert client.is_open()
    finally:
        client.close()


def test_a_flood_over_websockets_loses_nothing_it_acknowledged(ws_broker):
    """An open-loop QoS 1 flood from a WebSocket publisher at a WebSocket subscriber that
    reads nothing for now: flow control holds the publisher (the broker acknowledges no
    more than the subscriber's queue holds), then every message arrives, in order."""
    subscriber = WsRawClient(url(ws_broker), max_queue=1)
    subscriber.connect(unique_id("sub"))
    subscriber.subscribe(("flood/ws", 1))
    publisher = WsRawClient(url(ws_broker))
    publisher.connect(unique_id("pub"))
    count = 5000
    flood = [
        publish_packet("flood/ws", b"%d" % i, qos=1, packet_id=i % 65535 + 1) for i in range(count)
    ]
    sending = threading.Thread(target=lambda: [publisher.send(p) for p in flood], daemon=True)
    sending.start()

    acknowledged = 0
    while True:
        try:
            pkt = publisher.read_packet(timeout=0.5)
        except TimeoutError:
            break
        assert pkt is not None and pkt.type == PUBACK
        acknowledged += 1
    assert acknowledged < count  # held: the subscriber reads nothing yet

    payloads = []
    for _ in range(count):
        pkt = subscriber.expect(PUBLISH)
        subscriber.ack(pkt)
        payloads.append(pkt.payload)
    assert payloads == [b"%d" % i for i in range(count)]
    sending.join(TIMEOUT)
    while acknowledged < count:
        assert publisher.expect(PUBACK)
        acknowledged += 1
    assert ws_broker.call(ws_broker.broker.metrics.snapshot)["queue_message_drop"] == 0
    subscriber.close()
    publisher.close()


@pytest.mark.parametrize(
    ("listener", "key"),
    [
        ({"type": "wss"}, "listeners[0].certfile"),
        ({"type": "ws", "path": "mqtt"}, "listeners[0].path"),
    ],
)
def test_websocket_listener_config_errors_name_the_key(listener, key):
    with pytest.raises(ConfigError, match="^" + re.escape(key) + ": "):
        config_from_dict({"listeners": [{"address": "127.0.0.1:0", **listener}]})


def test_a_closing_handshake_ends_the_mqtt_connection(ws_broker):
    client = WsRawClient(url(ws_broker))
    client.connect("closer")
    ws_broker.wait_for(lambda: len(ws_broker.broker.connections) == 1)
    client.ws.close()  # our close frame; the broker answers it and closes the socket
    assert client.ws.close_code == CloseCode.NORMAL_CLOSURE  # the broker's answer
    ws_broker.wait_for(lambda: not ws_broker.broker.connections)


def test_a_frame_of_thousands_of_packets_is_routed_as_a_tcp_read_would_be(start_broker):
    """One frame carrying 20,000 publishes (360 KB) is handed to MQTT 64 KB per loop turn:
    each turn's deliveries stay under the subscriber's unflushed high-water mark, so they
    go out directly, none through its queue, and in order."""
    server = start_broker(listeners=[{"type": "tcp", "address": "127.0.0.1:0"}, WS])
    subscriber = RawClient(server.host, server.port)
    subscriber.connect(unique_id("sub"))
    subscriber.subscribe(("big/frame", 0))
    count = 20_000
    packets = [publish_packet("big/frame", b"%05d" % i) for i in range(count)]
    received = bytearray()
    size = sum(len(packet) for packet in packets)  # QoS 0: forwarded in the same form
    reading = threading.Thread(target=_read, args=(subscriber, received, size), daemon=True)
    reading.start()  # the subscriber's socket never fills: only the frame's size matters
    publisher = WsRawClient(f"ws://{server.host}:{server.broker.listening[1][1]}/mqtt")
    publisher.connect(unique_id("pub"))
    before = server.call(server.broker.metrics.snapshot)["queue_message_in"]
    publisher.send(b"".join(packets))  # one frame
    reading.join(TIMEOUT)
    subscriber._buf = received  # parse what was read
    payloads = [subscriber.read_packet().payload for _ in range(count)]
    assert payloads == [b"%05d" % i for i in range(count)]
    assert server.call(server.broker.metrics.snapshot)["queue_message_in"] == before
    publisher.close()
    subscriber.close()


def _read(client: RawClient, into: bytearray, size: int) -> None:
    client.sock.settimeout(TIMEOUT)
    while len(into) < size:
        chunk = client.sock.recv(1 << 20)
        if not chunk:
            return
        into += chunk
