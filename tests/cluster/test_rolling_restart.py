"""Stops and restarts with the leaderless metadata (`metadata = "swc"`) and the netsplit
switches at their defaults (everything refused during a netsplit), three real node
processes: a graceful stop is not a netsplit, and a restart is not a takeover.

- A node stopped with SIGTERM says so (LEAVING) before its links close: while it is down,
  even well past dead_after, the others accept CONNECT, SUBSCRIBE and QoS 1 PUBLISH. A
  node that goes silent without a word (SIGSTOP) still makes a netsplit, dead_after after
  its last answer (docs/clustering.md, Netsplits).
- A rolling restart of all three under a QoS 1 stream to a persistent MQTT 5 subscriber,
  each node down for longer than a silent one takes to make a netsplit: the subscriber,
  sent away (0x8B) by each node it is on as that node stops, resumes its session on
  another one; no CONNECT is refused, no client is disconnected by a node that stayed up
  (a restarted node used to take back the sessions that had moved while it was away:
  0x8E, "Session taken over"), and every acknowledged message arrives (it found one lost
  now and then: published on the node the subscriber was registering on, after the
  registration's record reached the node's view but before its answer, it matched
  nothing; the stand-in is there from the record now).

Helpers (the Cluster harness, Subscriber, Stream, log waits) are test_failures.py's.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable

import pytest

from tests.broker.helpers import PUBLISH, V5, unique_id
from tests.cluster.nodes import DEAD_AFTER, LIVENESS_INTERVAL, ClusterNode
from tests.cluster.test_failures import (
    DETECT,
    HOST,
    SERVER_UNAVAILABLE,
    Cluster,
    Stream,
    Subscriber,
    clusters,
    count_log,
    eventually,
    link_up,
    log_time,
    mark,
    pid,
    spans,
    wait_log,
    wait_routed,
)
from tests.cluster.test_swc_cluster import cluster_command

__all__ = ["clusters"]  # a fixture, used by name

SERVER_SHUTTING_DOWN = 0x8B
# How paho reports the end of a connection that a stopping node closed: its DISCONNECT
# (0x8B), or, when that node closed its socket with the client's PUBACKs still unread (a
# QoS 1 stream flowing) and the kernel answered with a reset that took the DISCONNECT
# with it, a connection lost (0x80, unspecified error).
SENT_AWAY = {SERVER_SHUTTING_DOWN, 0x80}
# How long a stopped node stays down, from the end of its stop: past the moment a node
# gone silent is a netsplit (dead_after after its last answer, noticed at a heartbeat: the
# bound the SIGSTOP case asserts), so that a stop taken for silence would show.
DOWN_FOR = DEAD_AFTER + 4 * LIVENESS_INTERVAL
GROUP_EXCHANGES = re.compile(r'^swc_group_exchanges\{[^}]*group="(\d+)"\} (\S+)$', re.M)


class Roaming(Subscriber):
    """A Subscriber (MQTT 5, persistent unless told) that records the reason code of every
    disconnection it did not ask for."""

    def __init__(self, node: ClusterNode, client_id: str, clean: bool = False) -> None:
        super().__init__(node, client_id, clean=clean, version=V5)
        self.node = node
        self.reasons: list[int] = []
        self.client.on_disconnect = self._on_disconnect

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.reasons.append(reason_code.value)
        self.disconnected.set()


@pytest.fixture
def cluster(clusters: Callable[[str], Cluster]) -> Cluster:
    """The nodes of one test, no Redis."""
    return clusters("")


def swc_trio(cluster: Cluster) -> list[ClusterNode]:
    """a alone, then b and c joining through it; every link up; default switches."""
    [a] = cluster.start("a", metadata="swc")
    b, c = cluster.start("b", "c", metadata="swc", seeds=[(HOST, a.cluster_port)])
    return [a, b, c]


def serves(cluster: Cluster, node: ClusterNode) -> None:
    """`node` takes a CONNECT, a SUBSCRIBE and a QoS 1 PUBLISH (PUBACK), and routes it."""
    client = cluster.raw(node, V5)
    assert client.connect(unique_id("serves")).reason_code == 0
    assert client.subscribe(("serves/t", 1)) == [1]
    client.publish("serves/t", b"x", qos=1)  # asserts the PUBACK
    assert client.expect(PUBLISH).payload == b"x"
    client.close()


def wait_out(since: float, seconds: float) -> None:
    """The end of a window in which something must not happen (no event marks it)."""
    time.sleep(max(0.0, since + seconds - time.monotonic()))


def exchanged_every_group(node: ClusterNode) -> bool:
    """Whether each metadata group of the node's process has had an exchange that worked
    (a restarted node has then pulled what the cluster decided while it was away)."""
    url = f"http://{HOST}:{node.http_port}/metrics"
    with urllib.request.urlopen(url) as response:
        counts = [float(n) for _, n in GROUP_EXCHANGES.findall(response.read().decode())]
    return bool(counts) and min(counts) >= 1


def restarted(cluster: Cluster, node: ClusterNode, stopped_at: float) -> None:
    """Start `node` again once it has been down for DOWN_FOR; back when every other node
    has linked to it and it has caught up with the metadata."""
    others = [n for n in cluster.nodes.values() if n is not node]
    since = {n.name: mark(n) for n in others}
    wait_out(stopped_at, DOWN_FOR)
    for other in others:  # nobody took it for a netsplit
        assert count_log(other, r"cluster: not ready", since[other.name]) == 0
        serves(cluster, other)
    node.start()
    for other in others:
        wait_log(other, link_up(node.name), since[other.name])
        wait_log(node, link_up(other.name))
    eventually(lambda: exchanged_every_group(node), f"{node.name} exchanged every group")


def test_a_stopped_node_is_not_a_netsplit_but_a_silent_one_is(cluster: Cluster) -> None:
    """c stopped with SIGTERM: a and b log that it stops and go on serving, past the time
    a silent node takes to make a netsplit, reporting it as stopped (not unreachable); so
    does a restarted meanwhile (c's member record says it stopped). b paused with SIGSTOP
    (no goodbye): a netsplit on a within dead_after of b's last answer, CONNECT refused
    (0x88). b resumed: ready again, though c is still down; c started: linked again and
    no longer stopped."""
    a, b, c = swc_trio(cluster)
    since = {n.name: mark(n) for n in (a, b)}
    assert c.stop() == 0
    stopped_at = time.monotonic()
    for node in (a, b):
        wait_log(node, r"cluster: node c is stopping", since[node.name])
    wait_out(stopped_at, DOWN_FOR)
    for node in (a, b):
        assert count_log(node, r"cluster: not ready", since[node.name]) == 0
        swc = node.cluster_status()["swc"]
        assert (swc["ready"], swc["unreachable"], swc["stopped"]) == (True, [], ["c"])
        serves(cluster, node)
    status = cluster_command(a, "status").stdout
    assert "unreachable members: none, stopped members: c" in status, status

    # a restarted meanwhile knows from c's member record, not from c, that c stopped.
    assert a.stop() == 0
    a.start()
    wait_log(a, link_up("b"))
    started_at = time.monotonic()
    wait_out(started_at, DOWN_FOR)
    assert count_log(a, r"cluster: not ready") == 0
    assert a.cluster_status()["swc"]["stopped"] == ["c"]
    serves(cluster, a)

    since_a = mark(a)
    paused_at = time.time()
    os.kill(pid(b), signal.SIGSTOP)
    try:
        split = wait_log(
            a, r"cluster: not ready: b cannot be reached \(netsplit\)", since_a, DETECT
        )
        # dead_after after b's last PONG (at most liveness_interval before the pause),
        # noticed at a heartbeat: not twice dead_after as it was.
        assert log_time(split) - paused_at <= DEAD_AFTER + 4 * LIVENESS_INTERVAL
        refused = cluster.raw(a, V5)
        assert refused.connect(unique_id("split"), expect_code=None).reason_code == (
            SERVER_UNAVAILABLE
        )
    finally:
        os.kill(pid(b), signal.SIGCONT)
    wait_log(a, r"cluster: ready again, every member reached", since_a)
    serves(cluster, a)

    c.start()
    wait_log(a, link_up("c"), since_a)
    eventually(lambda: a.cluster_status()["swc"]["stopped"] == [], "c no longer stopped on a")


def test_rolling_restart_under_qos1_load_loses_nothing_and_moves_nobody(
    cluster: Cluster,
) -> None:
    """a, b, c restarted in turn (SIGTERM, down for DOWN_FOR, started again), a QoS 1 stream
    flowing throughout to a persistent subscriber. The subscriber starts on b and the
    publisher on c: when b stops, the subscriber is sent away (0x8B) and resumes on c;
    before c stops, the stream moves to a, and the subscriber, sent away by c, resumes on
    a. Each restarted node catches up with the metadata (its own copy says it owns the
    subscriber's session still); the subscriber, where it is, must not notice: it is
    disconnected only by the nodes that stop, and the acknowledged messages all arrive
    (those b and c held for it follow it when they are back)."""
    a, b, c = swc_trio(cluster)
    sub = Roaming(b, "roller")
    subs = [sub]  # the subscriber's connections, one per node it was on
    first = Stream(cluster.publisher(c), "roll/s")
    second: Stream | None = None
    try:
        sub.subscribe("roll/#", 1)
        wait_routed(first.publisher, [sub], "roll/probe")
        first.start()
        first.wait_acked(100)

        assert a.stop() == 0  # a: nobody's node
        restarted(cluster, a, time.monotonic())
        first.wait_acked(len(first.acked) + 100)

        moved_by_restart(cluster, b, subs, c)  # b: the subscriber's
        first.wait_acked(len(first.acked) + 100)

        first.stop()  # c: the subscriber's and the publisher's
        second = Stream(cluster.publisher(a), "roll/s", first=1_000_000).start()
        second.wait_acked(50)
        moved_by_restart(cluster, c, subs, a)
        second.wait_acked(len(second.acked) + 100)
        second.stop()
        acked = set(first.acked) | set(second.acked)

        def received() -> set[int]:
            return set().union(*(s.seqs for s in subs))

        try:
            eventually(lambda: acked <= received(), "every acknowledged message received")
        finally:
            print(f"{len(acked)} acknowledged, lost: {spans(acked - received())}")
            print("disconnections:", [(s.node.name, [hex(r) for r in s.reasons]) for s in subs])
        # Sent away by the nodes that stopped, once each; by nobody else.
        assert [len(s.reasons) for s in subs] == [1, 1, 0]
        assert not first.unacked and not second.unacked  # no PUBLISH left unacknowledged
    finally:
        first.stop()
        if second is not None:
            second.stop()
        for connection in subs:
            connection.close()


def moved_by_restart(
    cluster: Cluster, node: ClusterNode, subs: list[Roaming], to: ClusterNode
) -> None:
    """`node`, the one the subscriber (the last of `subs`) is on, stopped: the subscriber,
    sent away, resumes on `to` (added to `subs`); `node` restarted, it stays there."""
    assert node.stop() == 0
    stopped_at = time.monotonic()
    subs[-1].disconnected.wait(DETECT)
    subs.append(resumed(subs[-1], to))
    restarted(cluster, node, stopped_at)
    undisturbed(cluster, node, subs[-1])


def undisturbed(cluster: Cluster, back: ClusterNode, sub: Roaming) -> None:
    """The node `back` came back to routes to `sub` where it is now, and `sub` is still
    connected there (a restarted node that took its session back would have sent it
    away with 0x8E)."""
    try:
        wait_routed(cluster.publisher(back), [sub], "roll/probe")
    finally:
        assert sub.reasons == [], f"disconnected by {sub.node.name}: {sub.reasons}"


def resumed(gone: Roaming, node: ClusterNode) -> Roaming:
    """The subscriber sent away by its node, connected again to `node`: its session
    there (CONNACK 0, session present) with its subscription."""
    assert len(gone.reasons) == 1 and gone.reasons[0] in SENT_AWAY, gone.reasons
    gone.close()
    again = Roaming(node, gone.client_id)
    assert again.session_present
    return again
