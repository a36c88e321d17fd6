"""At least once between nodes (broker/cluster/streams.py). On the wire: a receiving node
queues each number once and answers once per turn. With real node processes: kill -9
of the subscriber's node, and of the publisher's node, under a QoS 1 and a QoS 2 stream,
loses no message the publisher had acknowledged, for a persistent subscriber that
reconnects once its node is back; the messages sent again are counted, and the
duplicates the subscriber gets are counted by it (MQTT allows them at QoS 1; at QoS 2 the
broker's store and the receiving node's Inbox keep them out).

Two nodes on the leaderless metadata (a member killed stays a member, and what is sent to
it waits for its return), with `allow_publish_during_netsplit` on so that the publisher's
node goes on acknowledging while the other is away. The helpers are test_failures.py's.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from broker.cluster import frames
from broker.cluster.frames import PING, PONG, PUBLISH, QUEUED, STREAM, WELCOME
from broker.message import Message
from tests.broker.helpers import PahoClient
from tests.cluster.nodes import (
    ClusterNode,
    cluster_of,
    handshake,
    read_frames,
    start_in_process_node,
)
from tests.cluster.test_failures import (
    DETECT,
    HOST,
    TIMEOUT,
    Cluster,
    Stream,
    Subscriber,
    clusters,  # noqa: F401  (the fixture)
    link_down,
    mark,
    pid,
    wait_log,
    wait_routed,
)

SWITCH = "allow_publish_during_netsplit = true\n"


def test_the_receiver_queues_each_number_once_and_answers_once_per_turn(
    start_broker: Any, redis_url: str
) -> None:
    """On the wire, as another node would send them: a STREAM, QoS 1 PUBLISHes numbered
    1, 2, then 1 again (a resend) and a QoS 0 one, unnumbered, read in one turn. The
    subscriber gets each message once, the duplicate is counted, and one QUEUED answers
    the turn with the highest number queued; nothing answers the QoS 0 message."""
    server = start_in_process_node(start_broker, redis_url)
    address = cluster_of(server).address
    assert address is not None
    subscriber = PahoClient(server.host, server.port, client_id="wire-sub")
    assert subscriber.connect(clean=False).session_present is False
    assert subscriber.subscribe("wire/#", 1) == [1]
    now = time.monotonic()

    def publish(payload: bytes, qos: int, *seq: int) -> bytes:
        message = Message("wire/t", payload, qos, sender="elsewhere")
        return frames.encode(PUBLISH, frames.pack_message(message, now), *seq)

    data = (
        frames.encode(STREAM, "b-epoch", 0)
        + publish(b"one", 1, 1)
        + publish(b"two", 1, 2)
        + publish(b"one", 1, 1)
        + publish(b"zero", 0)
        + frames.encode(PING, 1)
    )
    try:
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            welcomed, closed = handshake(sock, "b", "a")
            assert not closed and welcomed[0][0] == WELCOME, welcomed
            sock.sendall(data)
            got, closed = read_frames(sock, TIMEOUT, lambda got: [QUEUED, "b-epoch", 2] in got)
            assert not closed, got
            assert [PONG, 1] in got
            assert [frame for frame in got if frame[0] == QUEUED] == [[QUEUED, "b-epoch", 2]]
        payloads = sorted(subscriber.expect_message().payload for _ in range(3))
        assert payloads == [b"one", b"two", b"zero"]
        subscriber.expect_no_message()
        assert server.broker.metrics.cluster_messages_duplicate == 1
    finally:
        subscriber.close()


def two_nodes(cluster: Cluster) -> tuple[ClusterNode, ClusterNode]:
    [a] = cluster.start("a", metadata="swc", extra=SWITCH)
    [b] = cluster.start("b", metadata="swc", extra=SWITCH, seeds=[(HOST, a.cluster_port)])
    return a, b


def streaming(
    cluster: Cluster, qos: int, client_id: str
) -> tuple[ClusterNode, ClusterNode, Subscriber, Stream]:
    """a and b (two_nodes), a persistent subscriber on b at `qos`, routed from a, and a
    stream at `qos` from a publisher on a, flowing: (a, b, subscriber, stream)."""
    a, b = two_nodes(cluster)
    sub = cluster.subscriber(b, client_id, clean=False)
    sub.subscribe("load/#", qos)
    pub = cluster.publisher(a)
    wait_routed(pub, [sub], "load/probe")
    return a, b, sub, Stream(pub, "load/s", qos).start()


def reconnect(subscriber: Subscriber, node: ClusterNode) -> None:
    """The same paho client (its QoS 2 state kept) connects again, to `node` restarted."""
    assert subscriber.disconnected.wait(TIMEOUT), "the subscriber saw its node go"
    subscriber.client.loop_stop()
    subscriber.disconnected.clear()
    subscriber.client.connect(HOST, node.port, 60)
    subscriber.client.loop_start()
    code, present = subscriber._connacks.get(timeout=TIMEOUT)
    assert (code, present) == (0, True), "the persistent session is back"


def duplicates(subscriber: Subscriber) -> int:
    return sum(n - 1 for n in Counter(subscriber.seqs).values())


@pytest.mark.parametrize("qos", [1, 2])
def test_kill_9_of_the_subscribers_node_loses_nothing_acknowledged(
    clusters: Callable[[str], Cluster],  # noqa: F811
    qos: int,
) -> None:
    """b, the subscriber's node, is killed under the stream: what a acknowledged and b
    had not said it queued (in the sockets at the kill, and all that a acknowledges while
    b is away) is kept by a and sent again once b is back; b queued in its store what it
    had answered for. Nothing acknowledged is lost."""
    cluster = clusters("")
    a, b, sub, stream = streaming(cluster, qos, f"kill-b-{qos}")
    try:
        stream.wait_acked(300)
        since_a = mark(a)
        b.kill()
        wait_log(a, link_down("b"), since_a, DETECT)
        stream.wait_acked(len(stream.acked) + 200)  # acknowledged while b is away
    finally:
        stream.stop()
    acked = stream.acked
    assert not stream.unacked, "a acknowledged every publish"
    b.start()  # on its store, under its name
    cluster.wait_linked([a, b])
    reconnect(sub, b)
    sub.wait_seqs(acked)
    metrics = a.metrics()
    print(
        f"QoS {qos}: acknowledged {len(acked)}, all received; {duplicates(sub)} duplicates "
        f"at the subscriber; a sent again {metrics['cluster_messages_resent']:.0f}, b "
        f"dropped {b.metrics()['cluster_messages_duplicate']:.0f} it had queued already"
    )
    assert metrics["cluster_messages_resent"] > 0  # b's absence was bridged by a's outbox
    assert metrics["cluster_messages_dropped"] == 0


@pytest.mark.parametrize("qos", [1, 2])
def test_kill_9_of_the_publishers_node_loses_nothing_acknowledged(
    clusters: Callable[[str], Cluster],  # noqa: F811
    qos: int,
) -> None:
    """b is paused (SIGSTOP) until a gives its link up, so that what a acknowledges next
    can only wait on a; then a, the publisher's node, is killed under the stream. a kept
    each of those messages in its store before the PUBACK: started again, it sends b
    every message b had not acknowledged, and b drops the ones it had queued already.
    Nothing acknowledged is lost (at most once, those waiting on a were lost)."""
    cluster = clusters("")
    a, b, sub, stream = streaming(cluster, qos, f"kill-a-{qos}")
    try:
        stream.wait_acked(200)
        since_a = mark(a)
        os.kill(pid(b), signal.SIGSTOP)  # b reads nothing more
        try:
            wait_log(a, link_down("b"), since_a, DETECT)
            down_from = stream.sent_after_now()  # from here a has no link to b
            stream.wait_acked(len(stream.acked) + 200)
            a.kill()
        finally:
            os.kill(pid(b), signal.SIGCONT)
    finally:
        stream.stop()
    acked = stream.acked
    only_on_a = [seq for seq in acked if seq >= down_from]
    assert len(only_on_a) >= 150
    a.start()  # on its store: what b did not acknowledge goes out again
    kept = wait_log(a, r"cluster: (\d+) forwarded messages kept from the last run")
    assert int(kept[1]) >= len(only_on_a)
    sub.wait_seqs(acked)
    print(
        f"QoS {qos}: acknowledged {len(acked)}, {len(only_on_a)} of them while a had no link "
        f"to b; {kept[1]} kept in a's store at its kill, all received; {duplicates(sub)} "
        f"duplicates at the subscriber, b dropped "
        f"{b.metrics()['cluster_messages_duplicate']:.0f} it had queued already"
    )
