"""RemoteView (broker/cluster/view.py) over a real SubscriptionTrie: other nodes' subscriber records
become RemoteNode entries (one per node and filter) and RemoteMember group members, and
what the router matches follows every record set, moved, deleted or reloaded.

RemoteNode and RemoteMember are stood in for by small fakes made by the same kind of
caching factories as the Cluster's: the view is pure bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from broker.cluster.metadata import Subscriber
from broker.cluster.view import REMOTE, RemoteView
from broker.subscription_trie import SubOptions, SubscriptionTrie

THIS = "a"  # the node the view belongs to


class FakeRemoteNode:
    local = False
    online = True

    def __init__(self, node: str) -> None:
        self.node = node
        self.client_id = f"$cluster/{node}"

    def __repr__(self) -> str:
        return f"<FakeRemoteNode {self.node}>"


class FakeRemoteMember:
    local = False
    online = True

    def __init__(self, node: str, client_id: str) -> None:
        self.node = node
        self.client_id = client_id

    def __repr__(self) -> str:
        return f"<FakeRemoteMember {self.client_id} on {self.node}>"


class Fixture:
    def __init__(self) -> None:
        self.router = SubscriptionTrie()
        self.nodes: dict[str, FakeRemoteNode] = {}
        self.members: dict[tuple[str, str], FakeRemoteMember] = {}
        self.view = RemoteView(
            self.router,
            THIS,
            self.remote_node,  # type: ignore[arg-type]
            self.remote_member,  # type: ignore[arg-type]
            self.forget_member,
        )

    def forget_member(self, node: str, client_id: str) -> None:
        del self.members[(node, client_id)]

    def remote_node(self, node: str) -> FakeRemoteNode:
        return self.nodes.setdefault(node, FakeRemoteNode(node))

    def remote_member(self, node: str, client_id: str) -> FakeRemoteMember:
        return self.members.setdefault((node, client_id), FakeRemoteMember(node, client_id))

    def routed(self, topic: str) -> dict[str, int]:
        """node -> QoS of the RemoteNode routes `topic` reaches."""
        routes = self.router.match(topic)
        out = {}
        for route in routes:
            assert isinstance(route.subscriber, FakeRemoteNode), route
            out[route.subscriber.node] = route.qos
        assert len(out) == len(routes)
        return out

    def shared(self, topic: str) -> dict[tuple[str, str], set[tuple[str, str, int]]]:
        """(group, filter) -> {(node, client id, QoS)} of the groups `topic` reaches."""
        out = {}
        for group in self.router.match_shared(topic):
            members = set()
            for member, options in group.members.items():
                assert isinstance(member, FakeRemoteMember), member
                members.add((member.node, member.client_id, options.qos))
            out[(group.name, group.filter)] = members
        return out


@pytest.fixture
def f() -> Fixture:
    return Fixture()


def record(node: str, *filters: str, qos: int = 1, clean: bool = False) -> Subscriber:
    return Subscriber(node, clean, {flt: SubOptions(qos) for flt in filters})


def test_one_route_per_node_and_filter_held_while_any_subscriber_has_it(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x/y", qos=0))
    f.view.apply("c2", record("b", "x/y", qos=1))
    assert f.routed("x/y") == {"b": REMOTE.qos}  # one entry, at every QoS
    assert f.router.subscription_count == 1
    f.view.apply("c1", None)
    assert f.routed("x/y") == {"b": 2}
    f.view.apply("c2", None)
    assert f.routed("x/y") == {}
    assert f.router.subscription_count == 0
    assert f.view.records == {}


def test_nodes_route_separately(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x"))
    f.view.apply("c2", record("c", "x"))
    assert f.routed("x") == {"b": 2, "c": 2}
    f.view.apply("c1", None)
    assert f.routed("x") == {"c": 2}
    assert f.view.nodes() == {"c"}


def test_a_subscriber_dropping_one_of_its_filters(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x", "y"))
    f.view.apply("c2", record("b", "y"))
    f.view.apply("c1", record("b", "x"))  # c1 unsubscribed from y
    assert f.routed("x") == {"b": 2}
    assert f.routed("y") == {"b": 2}  # c2 still has it
    f.view.apply("c2", record("b"))  # c2 has no subscriptions left
    assert f.routed("y") == {}
    assert f.routed("x") == {"b": 2}


def test_a_qos_change_keeps_the_single_entry(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x", qos=0))
    f.view.apply("c1", record("b", "x", qos=2))
    f.view.apply("c1", record("b", "x", qos=1))
    assert f.routed("x") == {"b": 2}
    f.view.apply("c1", None)  # removed once: the count was not inflated by the changes
    assert f.routed("x") == {}


def test_records_of_this_node_are_ignored(f: Fixture) -> None:
    f.view.apply("mine", record(THIS, "x", "$share/g/x"))
    assert f.routed("x") == {}
    assert f.shared("x") == {}
    assert f.view.records == {}
    assert f.router.subscription_count == 0


def test_a_record_moving_to_this_node_leaves_the_view(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x", "$share/g/x"))
    f.view.apply("c2", record("b", "x"))
    f.view.apply("c1", record(THIS, "x", "$share/g/x"))
    assert "c1" not in f.view.records
    assert f.shared("x") == {}
    assert f.routed("x") == {"b": 2}  # c2 still there
    f.view.apply("c2", record(THIS, "x"))
    assert f.routed("x") == {}
    assert f.view.nodes() == set()


def test_a_record_moving_between_other_nodes_moves_its_entries(f: Fixture) -> None:
    f.view.apply("c1", record("b", "x/+", "$share/g/x/#", qos=1))
    f.view.apply("c1", record("c", "x/+", "$share/g/x/#", qos=1))
    assert f.routed("x/1") == {"c": 2}
    assert f.shared("x/1") == {("g", "x/#"): {("c", "c1", 1)}}
    assert f.view.nodes() == {"c"}
    f.view.apply("c1", None)
    assert f.routed("x/1") == {}
    assert f.shared("x/1") == {}
    assert f.router.subscription_count == 0


def test_shared_subscriptions_make_one_member_per_client(f: Fixture) -> None:
    f.view.apply("c1", record("b", "$share/g/s/+", qos=1))
    f.view.apply("c2", record("b", "$share/g/s/+", qos=0))
    f.view.apply("c3", record("c", "$share/g/s/+", "$share/h/s/+", qos=2))
    assert f.routed("s/1") == {}  # shared subscriptions are not RemoteNode entries
    assert f.shared("s/1") == {
        ("g", "s/+"): {("b", "c1", 1), ("b", "c2", 0), ("c", "c3", 2)},
        ("h", "s/+"): {("c", "c3", 2)},
    }
    f.view.apply("c1", record("b", "$share/g/s/+", qos=2))  # options updated in place
    assert ("b", "c1", 2) in f.shared("s/1")[("g", "s/+")]
    f.view.apply("c3", record("c", "$share/g/s/+", qos=2))  # left group h
    assert set(f.shared("s/1")) == {("g", "s/+")}
    assert ("c", "c3") in f.members  # still in group g: its stand-in is kept
    f.view.apply("c1", None)
    f.view.apply("c2", None)
    assert f.shared("s/1") == {("g", "s/+"): {("c", "c3", 2)}}
    assert set(f.members) == {("c", "c3")}  # stand-ins of members gone are let go
    f.view.apply("c3", None)
    assert f.shared("s/1") == {}
    assert f.router.group_count == 0
    assert f.members == {}


def test_applying_the_same_record_twice_changes_nothing(f: Fixture) -> None:
    rec = record("b", "x", "$share/g/x")
    f.view.apply("c1", rec)
    f.view.apply("c1", record("b", "x", "$share/g/x"))  # an equal record, another object
    f.view.apply("c1", rec)
    assert f.router.subscription_count == 2
    f.view.apply("c1", None)
    assert f.routed("x") == {}  # one removal undoes it: nothing was counted twice
    assert f.shared("x") == {}
    f.view.apply("c1", None)  # deleting an unknown record is harmless too
    assert f.router.subscription_count == 0


def test_load_replaces_the_whole_view(f: Fixture) -> None:
    f.view.apply("stale", record("b", "old", "$share/g/old"))
    f.view.apply("kept", record("b", "x"))
    f.view.apply("moved", record("b", "m"))
    f.view.load(
        {
            "kept": record("b", "x"),
            "moved": record("c", "m"),
            "new": record("c", "x", "$share/g/n"),
            "ours": record(THIS, "o"),
        }
    )
    assert f.routed("old") == {}
    assert f.shared("old") == {}
    assert f.routed("x") == {"b": 2, "c": 2}
    assert f.routed("m") == {"c": 2}
    assert f.routed("o") == {}
    assert f.shared("n") == {("g", "n"): {("c", "new", 1)}}
    assert set(f.view.records) == {"kept", "moved", "new"}
    before = f.router.subscription_count
    f.view.load(dict(f.view.records))  # the same state again: nothing changes
    assert f.router.subscription_count == before
    f.view.load({})
    assert f.router.subscription_count == 0
    assert f.view.records == {}


def test_a_full_load_after_changes_it_already_contains(f: Fixture) -> None:
    # The stream's changes may be applied before and after the load that contains them.
    f.view.apply("c1", record("b", "x"))
    f.view.apply("c2", record("b", "x"))
    f.view.load({"c1": record("b", "x"), "c2": record("b", "x")})
    f.view.apply("c2", record("b", "x"))
    f.view.apply("c1", None)
    assert f.routed("x") == {"b": 2}
    f.view.apply("c2", None)
    assert f.routed("x") == {}


@pytest.mark.parametrize(
    ("topic_filter", "matches", "misses"),
    [
        ("s/+/t", ["s/1/t", "s//t"], ["s/1", "s/1/t/u", "$s/1/t"]),
        ("s/#", ["s", "s/1", "s/1/2"], ["t", "$s/1"]),
        ("#", ["a", "a/b", "/"], ["$SYS/x", "$share"]),
        ("+/x", ["a/x", "/x"], ["$SYS/x", "a/y"]),
        ("$SYS/#", ["$SYS/broker/uptime"], ["SYS/x"]),
    ],
)
def test_wildcard_filters_route(
    f: Fixture, topic_filter: str, matches: list[str], misses: list[str]
) -> None:
    f.view.apply("c1", record("b", topic_filter))
    f.view.apply("c2", record("c", f"$share/g/{topic_filter}"))
    for topic in matches:
        assert f.routed(topic) == {"b": 2}, topic
        assert f.shared(topic) == {("g", topic_filter): {("c", "c2", 1)}}, topic
    for topic in misses:
        assert f.routed(topic) == {}, topic
        assert f.shared(topic) == {}, topic


def test_remote_entries_sit_beside_local_subscribers(f: Fixture) -> None:
    local: Any = object()
    f.router.subscribe(local, "x", SubOptions(1))
    f.view.apply("c1", record("b", "x"))
    f.view.apply("c1", None)
    routes = f.router.match("x")
    assert [route.subscriber for route in routes] == [local]
