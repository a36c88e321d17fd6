"""Flow control end to end (broker/flow.py): open-loop publishers that know nothing of
their subscribers are read only as fast as those subscribers take the messages, and
nothing acknowledged to a publisher is dropped for an online subscriber.

The publishers here write everything at once from a thread (as a device writes as fast as
TCP accepts); the subscribers are raw sockets that read and acknowledge only when the test
says so, with the broker's default limits (20 in flight, 1000 queued) unless a test sets
its own.
"""

from __future__ import annotations

import collections
import socket
import threading

import pytest

from .helpers import (
    PUBACK,
    PUBLISH,
    TIMEOUT,
    RawClient,
    publish_packet,
    unique_id,
)

WINDOW = 20  # max_inflight_messages default
HIGH_WATER = 1024  # broker.flow.FLOW_HIGH_WATER: the most a queue holds before it holds


def open_publisher(server) -> RawClient:
    client = RawClient(server.host, server.port)
    client.connect(unique_id("pub"))
    return client


def send_in_background(client: RawClient, data: bytes) -> threading.Thread:
    """Write `data` from a thread: sendall blocks while the broker does not read."""
    client.sock.settimeout(60)
    thread = threading.Thread(target=client.sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


def qos1_flood(topic: str, count: int, tag: bytes = b"") -> bytes:
    return b"".join(
        publish_packet(topic, tag + b"%d" % i, qos=1, packet_id=i % 65535 + 1) for i in range(count)
    )


def until_silence(client: RawClient, ptype: int) -> list:
    """Packets of `ptype` that arrive until none comes for a moment (PUBLISHes are
    acknowledged)."""
    packets = []
    while True:
        try:
            pkt = client.read_packet(timeout=0.5)
        except TimeoutError:
            return packets
        assert pkt is not None and pkt.type == ptype, pkt
        if ptype == PUBLISH:
            client.ack(pkt)
        packets.append(pkt)


def pubacks_until_silence(client: RawClient) -> int:
    """PUBACKs that arrive until none comes for a moment: what the broker acknowledged."""
    return len(until_silence(client, PUBACK))


def receive(subscriber: RawClient, count: int) -> list[bytes]:
    """Read and acknowledge `count` PUBLISHes; their payloads in arrival order."""
    payloads = []
    for _ in range(count):
        pkt = subscriber.expect(PUBLISH)
        subscriber.ack(pkt)
        payloads.append(pkt.payload)
    return payloads


def receive_until_silence(subscriber: RawClient) -> list[bytes]:
    """Read and acknowledge PUBLISHes until none comes for a moment; their payloads."""
    return [pkt.payload for pkt in until_silence(subscriber, PUBLISH)]


def subscriber(server, topic: str, qos: int = 1) -> RawClient:
    client = RawClient(server.host, server.port)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(unique_id("sub"))
    client.subscribe((topic, qos))
    return client


def metrics(server) -> dict[str, int]:
    return server.call(server.broker.metrics.snapshot)


@pytest.mark.parametrize("max_online", [1000, 10])
def test_qos1_flood_loses_nothing_it_acknowledged(start_broker, max_online):
    # A device floods 5,000 QoS 1 messages, in one write, at a subscriber that reads
    # nothing for now. The broker stops parsing once the subscriber's queue is at its
    # high-water mark, however much one read brought (the rest stays unparsed), so it
    # acknowledges only what the queue can hold; then the subscriber reads, and every
    # message arrives, in order, with no drop. (A subscriber whose socket is full is
    # tested in test_backpressure.py.)
    server = start_broker(broker={"max_online_messages": max_online})
    sub = subscriber(server, "flood/q1")
    pub = open_publisher(server)
    count = 5000
    sending = send_in_background(pub, qos1_flood("flood/q1", count))

    acknowledged = pubacks_until_silence(pub)
    high_water = min(max_online // 2, HIGH_WATER)
    assert acknowledged <= WINDOW + high_water + 1 < count
    assert metrics(server)["flow_publisher_held"] >= 1

    assert receive(sub, count) == [b"%d" % i for i in range(count)]
    sending.join(TIMEOUT)
    assert acknowledged + pubacks_until_silence(pub) == count
    assert metrics(server)["queue_message_drop"] == 0


def test_a_slow_subscriber_holds_back_only_its_own_publishers(start_broker):
    # Publisher A feeds a subscriber that reads nothing; publisher B feeds one that reads.
    # A is held, B is not: B's 3,000 messages all arrive while A waits.
    server = start_broker(broker={"slow_subscriber_timeout": 60})
    slow = subscriber(server, "iso/slow")
    fast = subscriber(server, "iso/fast")
    pub_a, pub_b = open_publisher(server), open_publisher(server)
    send_in_background(pub_a, qos1_flood("iso/slow", 3000))
    assert pubacks_until_silence(pub_a) < 3000  # A is held
    send_in_background(pub_b, qos1_flood("iso/fast", 3000))
    assert receive(fast, 3000) == [b"%d" % i for i in range(3000)]
    assert pubacks_until_silence(pub_b) == 3000
    assert pubacks_until_silence(pub_a) == 0  # still held: its subscriber still reads nothing
    slow.close()


def test_a_stuck_subscriber_stops_holding_publishers(start_broker):
    # A subscriber that delivers nothing for slow_subscriber_timeout is stuck: the publisher
    # goes on, the healthy subscriber gets everything, and the stuck one's queue limit and
    # drop policy apply (counted).
    server = start_broker(
        broker={"slow_subscriber_timeout": 0.3, "max_online_messages": 100},
    )
    stuck = subscriber(server, "stuck/t")
    healthy = subscriber(server, "stuck/t")
    pub = open_publisher(server)
    count = 2000
    send_in_background(pub, qos1_flood("stuck/t", count))
    assert receive(healthy, count) == [b"%d" % i for i in range(count)]
    counters = metrics(server)
    assert counters["flow_slow_subscribers"] == 1
    # The stuck subscriber got its window and its queue; the rest was dropped, counted.
    assert counters["queue_message_drop"] == count - WINDOW - 100
    stuck.close()


def test_fan_in_shares_a_slow_subscriber_between_its_publishers(start_broker):
    # Three publishers flood one subscriber that takes messages only as fast as it
    # acknowledges them (20 in flight): each publisher gets a fair share of what it reads.
    server = start_broker(broker={"slow_subscriber_timeout": 60})
    sub = subscriber(server, "fanin/t")
    publishers = [open_publisher(server) for _ in range(3)]
    for tag, pub in zip(b"abc", publishers, strict=True):
        send_in_background(pub, qos1_flood("fanin/t", 5000, bytes([tag])))
    got = receive(sub, 9000)
    shares = collections.Counter(payload[:1] for payload in got[3000:])  # past the start-up
    assert set(shares) == {b"a", b"b", b"c"}
    assert min(shares.values()) >= 6000 / 3 / 2, shares  # at least half a fair share each


def test_many_publishers_released_at_once_never_overflow_a_queue(start_broker):
    # Forty devices flood one subscriber whose queue holds 20 (high-water mark 10): each
    # released publisher routes at least one message before it is held again, so a
    # release lets go of no more of them than the queue has room for. Nothing is lost.
    server = start_broker(broker={"max_online_messages": 20, "slow_subscriber_timeout": 60})
    sub = subscriber(server, "many/t")
    publishers = [open_publisher(server) for _ in range(40)]
    for n, pub in enumerate(publishers):
        send_in_background(pub, qos1_flood("many/t", 50, b"%02d-" % n))
    got = receive(sub, 2000)
    assert len(set(got)) == 2000
    assert metrics(server)["queue_message_drop"] == 0


def flood_past_a_slow_subscriber(
    server, topic: str, healthy: RawClient, slow: RawClient, count: int = 3000
) -> tuple[list[bytes], list[bytes]]:
    """Flood `count` QoS 1 messages while `slow` reads nothing: the healthy one reads
    until silence, every message must be acknowledged (the publisher was not held for
    good), then the slow one reads what it got. (payloads of healthy, of slow)"""
    pub = open_publisher(server)
    send_in_background(pub, qos1_flood(topic, count))
    got_healthy = receive_until_silence(healthy)
    assert pubacks_until_silence(pub) == count
    return got_healthy, receive_until_silence(slow)


def test_a_slow_member_of_a_shared_group_does_not_hold_its_publishers(start_broker):
    # One member of the group reads nothing: once its queue is at the high-water mark
    # the other member gets every message, and the publisher is never held.
    server = start_broker(broker={"slow_subscriber_timeout": 60})
    slow = subscriber(server, "$share/g/shared/t")
    healthy = subscriber(server, "$share/g/shared/t")
    got_healthy, got_slow = flood_past_a_slow_subscriber(server, "shared/t", healthy, slow)
    assert len(got_slow) <= WINDOW + 500  # its window and its queue up to the mark
    assert sorted(got_healthy + got_slow) == sorted(b"%d" % i for i in range(3000))
    assert metrics(server)["queue_message_drop"] == 0


def test_publishers_wait_for_a_shared_group_whose_members_are_all_full(start_broker):
    # Twenty devices flood a group of two members with 20-message queues: publishers are
    # held, and checked before routing while held, so no member's queue overflows.
    server = start_broker(broker={"max_online_messages": 20, "slow_subscriber_timeout": 60})
    members = [subscriber(server, "$share/g/many/s") for _ in range(2)]
    publishers = [open_publisher(server) for _ in range(20)]
    for n, pub in enumerate(publishers):
        send_in_background(pub, qos1_flood("many/s", 50, b"%02d-" % n))
    results: list[list[bytes]] = [[], []]
    readers = [
        threading.Thread(target=lambda i=i: results[i].extend(receive_until_silence(members[i])))
        for i in range(2)
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(TIMEOUT)
    assert len(set(results[0] + results[1])) == 1000
    assert metrics(server)["queue_message_drop"] == 0
    assert metrics(server)["flow_publisher_held"] >= 1


def test_a_slow_connection_of_a_balanced_client_id_does_not_hold_its_publishers(start_broker):
    # allow_multiple_sessions in balance mode: two connections share one client id, one
    # reads nothing. Messages go to the connection with room; the publisher is never held
    # for long, and what the slow one got is still delivered once it reads.
    server = start_broker(
        broker={
            "allow_multiple_sessions": True,
            "queue_deliver_mode": "balance",
            "slow_subscriber_timeout": 60,
        }
    )
    client_id = unique_id("balanced")
    slow, healthy = RawClient(server.host, server.port), RawClient(server.host, server.port)
    for connection in (slow, healthy):
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection.connect(client_id)
    healthy.subscribe(("balanced/t", 1))
    got_healthy, got_slow = flood_past_a_slow_subscriber(server, "balanced/t", healthy, slow)
    assert sorted(got_healthy + got_slow) == sorted(b"%d" % i for i in range(3000))
    assert metrics(server)["queue_message_drop"] == 0
