"""What a node's crash loses, counted on a survivor (broker/cluster/losses.py), with real
node processes a, b and c. On c a clean-session subscriber gets HELD QoS 1 messages and
acknowledges none (more than its in-flight window: some in flight, the others queued),
all of it in c's memory only. c counts them (`cluster_messages_at_risk`) and a and b hear
the figure in c's PONGs (`nautilus cluster status`). Then c is killed with -9:

- metadata = "redis": once c is declared dead, a, the live node with the lowest name,
  adds HELD to `cluster_messages_lost_with_node`; b adds nothing;
- metadata = "swc" (a killed member stays one): once c is back, with a new boot id and
  without having said it stopped, a adds HELD, b nothing. Stopped with SIGTERM and started
  again before that, c is counted by nobody. Removed instead (`nautilus cluster leave c`,
  run on b), c is declared dead `dead_after` later and counted by a.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.cluster.nodes import ClusterNode
from tests.cluster.test_failures import (
    DETECT,
    HOST,
    Cluster,
    Subscriber,
    clusters,  # noqa: F401  (the fixture)
    eventually,
    link_up,
    mark,
    publish_all,
    wait_log,
    wait_routed,
)
from tests.cluster.test_swc_cluster import cluster_command

HELD = 50  # QoS 1 messages c holds for its subscriber (max_inflight is 20 by default)
LOST = "cluster_messages_lost_with_node"
COUNTED = rf"cluster: node c {{how}} without stopping: about {HELD} messages"


def hold_messages(cluster: Cluster, a: ClusterNode, c: ClusterNode) -> Subscriber:
    """HELD messages published on a for a clean subscriber on c that acknowledges none;
    returns once c's census and a's and b's last PONG from c all say HELD."""
    subscriber = cluster.subscriber(c, "held-in-memory")  # clean: nothing stored
    subscriber.subscribe("held/#", 1)
    publisher = cluster.publisher(a)
    wait_routed(publisher, [subscriber], "held/probe")
    subscriber.acking = False
    publish_all(publisher, "held/t", range(HELD))
    eventually(lambda: c.metrics()["cluster_messages_at_risk"] == HELD, "c counts what it holds")
    for survivor in ("a", "b"):
        node = cluster.nodes[survivor]
        eventually(lambda node=node: at_risk_of("c", node) == HELD, f"{survivor} hears c's figure")
    return subscriber


def at_risk_of(name: str, seen_from: ClusterNode) -> int | None:
    """What node `name` holds only in memory, as `seen_from` last heard it."""
    rows = seen_from.cluster_status()["nodes"]
    return next(row["messages_at_risk"] for row in rows if row["node"] == name)


def test_a_node_declared_dead_is_counted_by_the_lowest_survivor(
    clusters: Callable[[str], Cluster],  # noqa: F811
    redis_url: str,
) -> None:
    cluster = clusters(redis_url)
    a, b, c = cluster.start("a", "b", "c")
    hold_messages(cluster, a, c)
    since = {node: mark(node) for node in (a, b)}
    c.kill()
    wait_log(a, COUNTED.format(how="died"), since[a], DETECT)
    wait_log(b, r"cluster: node c silent for .*: dead", since[b], DETECT)
    assert a.metrics()[LOST] == HELD
    assert b.metrics()[LOST] == 0


def swc_trio(cluster: Cluster) -> tuple[ClusterNode, ClusterNode, ClusterNode]:
    """a, then b and c joining through a; every link up."""
    [a] = cluster.start("a", metadata="swc")
    b, c = cluster.start("b", "c", metadata="swc", seeds=[(HOST, a.cluster_port)])
    return a, b, c


def test_a_killed_member_is_counted_once_back_and_a_stopped_one_never(
    clusters: Callable[[str], Cluster],  # noqa: F811
) -> None:
    cluster = clusters("")
    a, b, c = swc_trio(cluster)
    subscriber = hold_messages(cluster, a, c)
    since = {node: mark(node) for node in (a, b)}
    c.stop()  # SIGTERM: it says so (LEAVING); its client is sent away
    c.start()
    for node in (a, b):
        wait_log(node, link_up("c"), since[node])
    assert (a.metrics()[LOST], b.metrics()[LOST]) == (0, 0)

    subscriber.close()  # (c sent it away) and the same again, on c started anew:
    hold_messages(cluster, a, c)
    since = {node: mark(node) for node in (a, b)}
    c.kill()
    c.start()
    wait_log(a, COUNTED.format(how="restarted"), since[a])
    wait_log(b, link_up("c"), since[b])
    assert a.metrics()[LOST] == HELD
    assert b.metrics()[LOST] == 0


def test_a_killed_member_removed_is_counted_by_the_lowest_survivor(
    clusters: Callable[[str], Cluster],  # noqa: F811
) -> None:
    cluster = clusters("")
    a, b, c = swc_trio(cluster)
    hold_messages(cluster, a, c)
    since = {node: mark(node) for node in (a, b)}
    c.kill()
    result = cluster_command(b, "leave", "c")  # on b: the count is still a's
    assert result.returncode == 0, result.stderr
    wait_log(a, COUNTED.format(how="died"), since[a], DETECT)
    wait_log(b, r"cluster: node c .*: dead", since[b], DETECT)
    assert a.metrics()[LOST] == HELD
    assert b.metrics()[LOST] == 0
