"""Flow control: a flood slows to its reader's pace; a stuck reader stalls nobody else.

The subscriber sockets here have a tiny receive buffer and are not read for a while, so the
broker's transport to them really fills up and reports back-pressure.
"""

from __future__ import annotations

import socket
import threading

from broker.protocol import Connect, Decoder, PubAck, Publish, Subscribe, Subscription, encode
from broker.read_gate import HELD, WRITING

from .helpers import TIMEOUT

PAYLOAD = b"x" * 1000
FLOOD = 20_000  # 20 MB: more than the kernel buffers, the queue limit and the socket hold


def open_client(server, client_id: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(TIMEOUT)
    sock.connect((server.host, server.port))
    sock.sendall(encode(Connect(client_id, keepalive=0), 4))
    assert sock.recv(4) == b"\x20\x02\x00\x00"
    return sock


def subscribe(sock: socket.socket, topic_filter: str) -> None:
    sock.sendall(encode(Subscribe(1, [Subscription(topic_filter, 0)]), 4))
    assert sock.recv(5) == b"\x90\x03\x00\x01\x00"


def count_publishes(sock: socket.socket, expected: int, quiet: float = 1.0) -> int:
    """Read PUBLISH packets until `expected` arrived or nothing came for `quiet` seconds."""
    decoder = Decoder("client", 4)
    sock.settimeout(quiet)
    received = 0
    while received < expected:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            break
        if not data:
            break
        decoder.receive_data(data)
        while (packet := decoder.next_packet()) is not None:
            received += isinstance(packet, Publish)
    return received


def publisher_paused(broker) -> bool:
    return any(
        c.engine.gate.holds(HELD) for c in broker.connections if c.client.client_id == "flooder"
    )


def flood(sock: socket.socket, topic: str, count: int) -> threading.Thread:
    """Send `count` QoS 0 PUBLISHes from a thread: sendall blocks while the broker waits."""
    data = encode(Publish(topic, PAYLOAD), 4) * count
    sock.settimeout(60)
    thread = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


def test_flood_waits_for_a_slow_subscriber_instead_of_dropping(start_broker):
    server = start_broker(broker={"max_online_messages": 100})
    subscriber = open_client(server, "slow-reader", rcvbuf=4096)
    subscribe(subscriber, "flood/t")
    publisher = open_client(server, "flooder")
    sending = flood(publisher, "flood/t", FLOOD)
    # The subscriber reads nothing yet: its transport fills and the publisher is paused.
    server.wait_for(lambda: publisher_paused(server.broker))
    assert count_publishes(subscriber, FLOOD) == FLOOD
    sending.join(TIMEOUT)
    metrics = server.call(server.broker.metrics.snapshot)
    assert metrics["queue_message_drop"] == 0


def test_a_stuck_subscriber_does_not_stall_the_others(start_broker):
    server = start_broker(broker={"max_online_messages": 100})
    stuck = open_client(server, "stuck", rcvbuf=4096)
    subscribe(stuck, "both/t")
    healthy = open_client(server, "healthy")
    subscribe(healthy, "both/t")
    publisher = open_client(server, "publisher")
    # The stuck client never reads: once its queue is full its messages are dropped,
    # and the publisher and the healthy subscriber go on.
    sending = flood(publisher, "both/t", FLOOD)
    assert count_publishes(healthy, FLOOD, quiet=3.0) == FLOOD
    sending.join(TIMEOUT)
    metrics = server.call(server.broker.metrics.snapshot)
    assert metrics["queue_message_drop"] > 0
    stuck.close()


def test_a_publisher_that_does_not_read_its_pubacks_is_not_read_either(start_broker):
    """Its PUBACKs wait in a transport past its high-water mark: the broker stops reading
    it (the read gate's WRITING) instead of acknowledging without bound, and reads on,
    acknowledging every message, once it takes its PUBACKs."""
    server = start_broker()
    flooder = open_client(server, "deaf", rcvbuf=4096)

    def small_send_buffer() -> None:  # the kernel's share, small: the transport's fills
        (connection,) = [c for c in server.broker.connections if c.client.client_id == "deaf"]
        sock = connection.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    server.call(small_send_buffer)
    count = 100_000  # 4 bytes of PUBACK each: far more than the socket buffers hold
    data = b"".join(
        encode(Publish("deaf/t", b"", qos=1, packet_id=1 + i % 65535), 4) for i in range(count)
    )
    flooder.settimeout(60)
    sending = threading.Thread(target=flooder.sendall, args=(data,), daemon=True)
    sending.start()

    def deaf_not_read() -> bool:
        return any(
            c.engine.gate.holds(WRITING)
            for c in server.broker.connections
            if c.client.client_id == "deaf"
        )

    server.wait_for(deaf_not_read)
    received = server.call(lambda: server.broker.metrics.mqtt_publish_received)
    assert received < count  # the rest waits unread, in the sockets
    acked = 0
    decoder = Decoder("client", 4)
    flooder.settimeout(TIMEOUT)
    while acked < count:
        decoder.receive_data(flooder.recv(1 << 16))
        while (packet := decoder.next_packet()) is not None:
            acked += isinstance(packet, PubAck)
    sending.join(TIMEOUT)
    assert acked == count
