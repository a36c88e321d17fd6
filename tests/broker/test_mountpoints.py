"""Mountpoints: separate topic trees on one broker (broker/mountpoints.py).

Two listeners with their own mountpoints and the default tree, real paho clients: topics,
sessions, retained messages and shared groups stay in their tree; a plugin that returns
only a mountpoint moves its client; `%m` in an ACL; the admin operations by mountpoint;
the store across a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker import admin
from broker.admin_queries import parse
from broker.config import ConfigError, config_from_dict
from broker.mountpoints import inside, outside, split_subscriber_id, subscriber_id
from hooks import Ok, RegisterContext
from tests.broker.helpers import V5, V311, WillSpec, unique_id

TREES = {"default": "", "a": "tenant-a", "b": "tenant-b"}


@dataclass
class Listener:
    """One listener of the broker, as paho_client takes a server (host and port)."""

    host: str
    port: int


def listeners_of(server) -> dict[str, Listener]:
    return {name: Listener(*server.broker.listening[index]) for index, name in enumerate(TREES)}


@pytest.fixture
def trees(start_broker):
    """A broker with three listeners: the default tree, tenant-a's and tenant-b's."""

    def start(**sections):
        listeners = [
            {"address": "127.0.0.1:0", "mountpoint": mountpoint} for mountpoint in TREES.values()
        ]
        server = start_broker(listeners=listeners, **sections)
        return server, listeners_of(server)

    return start


# -- the names ---------------------------------------------------------------------------


def test_names_inside_and_outside():
    assert inside("", "a/b") == "a/b"
    assert inside("m", "a/b") == "\0m/a/b"
    assert inside("m", "$share/g/a/#") == "$share/g/\0m/a/#"
    assert outside("\0m/a/b") == "a/b"
    assert outside("$share/g/\0m/a/#") == "$share/g/a/#"
    assert outside("a/b") == "a/b"
    assert subscriber_id("", "c") == "c"
    assert split_subscriber_id(subscriber_id("m", "c")) == ("m", "c")
    assert split_subscriber_id("c") == ("", "c")


@pytest.mark.parametrize("bad", ["a/b", "a+", "#", "$sys"])
def test_a_listener_mountpoint_that_cannot_name_a_tree_is_refused(bad):
    with pytest.raises(ConfigError, match=r"listeners\[0\]\.mountpoint: a mountpoint cannot"):
        config_from_dict({"listeners": [{"address": "127.0.0.1:0", "mountpoint": bad}]})


# -- isolation ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5])
def test_a_subscriber_to_everything_sees_only_its_own_tree(trees, paho_client, version):
    _, at = trees()
    subs = {name: paho_client(at[name], version) for name in TREES}
    for sub in subs.values():
        assert sub.subscribe("#", 1) == [1]
    for name in TREES:
        paho_client(at[name], version).publish("news", name.encode(), 1)
    for name, sub in subs.items():
        got = sub.expect_message()
        assert (got.topic, got.payload) == ("news", name.encode())  # the topic as sent
        sub.expect_no_message()


def test_the_same_client_id_on_two_mountpoints_is_two_sessions(trees, paho_client):
    server, at = trees()
    a = paho_client(at["a"], client_id="dev-1", clean=False)
    b = paho_client(at["b"], client_id="dev-1", clean=False)  # no takeover of a
    a.subscribe("x", 1)
    b.subscribe("y", 1)
    paho_client(at["a"]).publish("x", b"for a", 1)
    assert a.expect_message().payload == b"for a"  # still connected: b took nothing over
    for mountpoint in ("tenant-a", "tenant-b"):
        row = server.call(admin.client, server.broker, "dev-1", mountpoint)
        assert (row["mountpoint"], row["client_id"], row["is_online"]) == (
            mountpoint,
            "dev-1",
            True,
        )
    client_a = server.call(admin.client, server.broker, "dev-1", "tenant-a")
    assert [s["topic"] for s in client_a["subscriptions"]] == ["x"]
    assert client_a["mountpoint"] == "tenant-a"
    with pytest.raises(admin.NotFound, match="on mountpoint 'tenant-c'"):
        server.call(admin.client, server.broker, "dev-1", "tenant-c")
    query = parse([("client_id", "dev-1"), ("mountpoint", "tenant-b")])
    gone = server.call(admin.session_disconnect, server.broker, query, False).rows
    assert [(row["mountpoint"], row["disconnected"]) for row in gone] == [("tenant-b", True)]
    b.expect_disconnected()
    a.publish("x", b"still here", 1)
    assert a.expect_message().payload == b"still here"


def test_retained_messages_are_kept_per_tree(trees, paho_client):
    server, at = trees()
    paho_client(at["a"]).publish("status", b"a's", 1, retain=True)
    paho_client(at["default"]).publish("status", b"default's", 1, retain=True)
    for name, expected in (("a", b"a's"), ("default", b"default's")):
        sub = paho_client(at[name])
        sub.subscribe("#", 1)
        got = sub.expect_message()
        assert (got.topic, got.payload, got.retain) == ("status", expected, True)
        sub.expect_no_message()
    sub_b = paho_client(at["b"])
    sub_b.subscribe("#", 1)
    sub_b.expect_no_message()
    shown = server.call(admin.retained, server.broker, "#", 10, "tenant-a")
    assert [(row["topic"], row["payload"]) for row in shown] == [("status", "a's")]
    assert [row["topic"] for row in server.call(admin.retained, server.broker)] == ["status"]
    server.call(admin.delete_retained, server.broker, "status", "tenant-a")
    assert server.call(admin.retained, server.broker, "#", 10, "tenant-a") == []
    assert len(server.call(admin.retained, server.broker)) == 1  # the default tree's stays


def test_shared_groups_and_no_local_stay_in_their_tree(trees, paho_client):
    server, at = trees()
    members = {name: paho_client(at[name], V5) for name in ("a", "b")}
    for member in members.values():
        assert member.subscribe("$share/g/jobs/#", 1) == [1]
    paho_client(at["a"]).publish("jobs/1", b"j", 1)
    assert members["a"].expect_message().topic == "jobs/1"
    members["b"].expect_no_message()
    rows = server.call(admin.client, server.broker, members["a"].client_id, "tenant-a")
    assert rows["subscriptions"][0]["topic"] == "$share/g/jobs/#"
    # No Local compares sessions within the tree: a's own message is not sent back to it.
    echo = paho_client(at["a"], V5)
    echo.subscribe("talk", options=SubscribeOptions(qos=1, noLocal=True))
    echo.publish("talk", b"mine", 1)
    echo.expect_no_message()


def test_a_will_goes_to_its_own_tree(trees, paho_client, raw_client):
    _, at = trees()
    watchers = {name: paho_client(at[name]) for name in ("a", "b")}
    for watcher in watchers.values():
        watcher.subscribe("wills/#", 1)
    dying = raw_client(at["a"])
    dying.connect(unique_id(), will=WillSpec("wills/dying", b"gone", qos=1))
    dying.close()  # no DISCONNECT: the will is published
    assert watchers["a"].expect_message().topic == "wills/dying"
    watchers["b"].expect_no_message()


# -- plugins choose the mountpoint --------------------------------------------------------


class TenantOfUser:
    """auth_on_register returning a mountpoint alone: the username's tree (VerneMQ ignored
    a mountpoint returned alone: its issues 332, 476, 559, 1212)."""

    def auth_on_register(self, ctx: RegisterContext):
        if ctx.username == "pair":  # VerneMQ's subscriber_id: both at once
            return Ok({"subscriber_id": {"mountpoint": "tenant-b", "client_id": "renamed"}})
        return Ok({"mountpoint": ctx.username})


class ToTenantB:
    """auth_on_publish moving a message to tenant-b's tree (VerneMQ's `mountpoint`)."""

    def auth_on_publish(self, ctx):
        return Ok({"mountpoint": "tenant-b"}) if ctx.topic.startswith("to-b/") else Ok()


def test_a_mountpoint_returned_alone_by_a_plugin_takes_effect(trees, paho_client):
    plugin = {"enabled": True, "module": "tests.broker.test_mountpoints:TenantOfUser"}
    server, at = trees(plugins={"tenant": plugin}, broker={"allow_anonymous": False})
    sub = paho_client(at["default"], username="tenant-b", password="x")
    sub.subscribe("#", 1)
    paho_client(at["b"], username="tenant-b", password="x").publish("t", b"same tree", 1)
    paho_client(at["default"], username="tenant-a", password="x").publish("t", b"other", 1)
    assert sub.expect_message().payload == b"same tree"
    sub.expect_no_message()
    row = server.call(admin.client, server.broker, sub.client_id, "tenant-b")
    assert (row["mountpoint"], row["client_id"]) == ("tenant-b", sub.client_id)
    paho_client(at["default"], username="pair", password="x")
    assert server.call(admin.client, server.broker, "renamed", "tenant-b")["is_online"]


def test_auth_on_publish_may_move_a_message_to_another_tree(trees, paho_client):
    plugin = {"enabled": True, "module": "tests.broker.test_mountpoints:ToTenantB"}
    _, at = trees(plugins={"mover": plugin})
    subs = {name: paho_client(at[name]) for name in ("a", "b")}
    for sub in subs.values():
        sub.subscribe("#", 1)
    paho_client(at["a"]).publish("to-b/x", b"moved", 1)
    got = subs["b"].expect_message()
    assert (got.topic, got.payload) == ("to-b/x", b"moved")
    subs["a"].expect_no_message()


def test_acl_patterns_substitute_the_mountpoint(trees, paho_client, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("pattern %m/#\n")
    plugin = {"enabled": True, "acl_file": str(acl)}
    _, at = trees(plugins={"acl": plugin})
    client = paho_client(at["a"], V5)
    assert client.subscribe("tenant-a/#", 1) == [1]
    assert client.subscribe("tenant-b/#", 1) == [0x87]  # %m is tenant-a, not b
    client.publish("tenant-a/x", b"own", 1)
    assert client.expect_message().topic == "tenant-a/x"


# -- the store ------------------------------------------------------------------------------


def test_sessions_and_retained_messages_of_a_tree_survive_a_restart(trees, paho_client, tmp_path):
    store = {"backend": "leveldb", "path": str(tmp_path / "db")}
    server, at = trees(store=store)
    # A default-tree client named like the mountpoint: its keys must not mix with
    # tenant-a's sessions in the store (broker/store/leveldb.py).
    for listener, client_id in ((at["a"], "dev"), (at["default"], "tenant-a"), (at["b"], "dev")):
        sub = paho_client(listener, client_id=client_id, clean=False)
        sub.subscribe("q/#", 1)
        sub.disconnect()
    paho_client(at["a"]).publish("q/1", b"queued for a", 1)
    paho_client(at["a"]).publish("r", b"retained in a", 1, retain=True)
    server.stop()

    server, at = trees(store=store)
    back = paho_client(at["a"], client_id="dev", clean=False)
    got = back.expect_message()
    assert (got.topic, got.payload) == ("q/1", b"queued for a")
    back.expect_no_message()
    for listener, client_id in ((at["default"], "tenant-a"), (at["b"], "dev")):
        paho_client(listener, client_id=client_id, clean=False).expect_no_message()
    fresh = paho_client(at["a"])
    fresh.subscribe("#", 1)
    assert fresh.expect_message().payload == b"retained in a"
    other = paho_client(at["default"])
    other.subscribe("#", 1)
    other.expect_no_message()


def test_session_queries_show_and_unsubscribe_a_trees_subscriptions(trees, paho_client):
    server, at = trees()
    client = paho_client(at["a"], client_id="q-1")
    client.subscribe("$share/g/jobs/#", 1)
    client.subscribe("x", 1)
    conditions = [("mountpoint", "tenant-a"), ("client_id", "q-1"), ("topic", "x")]
    shown_fields = [("mountpoint", ""), ("topic", "")]  # a name alone: show that field
    shown = server.call(admin.session_show, server.broker, parse(conditions + shown_fields)).rows
    assert [(row["mountpoint"], row["topic"]) for row in shown] == [("tenant-a", "x")]
    server.call(admin.session_unsubscribe, server.broker, parse(conditions))
    paho_client(at["a"]).publish("x", b"after", 1)
    client.expect_no_message()
    every = parse([("mountpoint", "tenant-a"), ("topic", "")])  # the topic field, of tenant-a's
    topics = [row["topic"] for row in server.call(admin.session_show, server.broker, every).rows]
    assert topics == ["$share/g/jobs/#"]


def test_the_dollar_rule_holds_inside_a_tree(trees, paho_client):
    # [MQTT-4.7.2-1] for the tree's own first level: '#' and '+' skip its '$' topics.
    _, at = trees()
    wild = paho_client(at["a"], V5)
    wild.subscribe([("#", 1), ("+/x", 1)])
    dollar = paho_client(at["a"], V5)
    dollar.subscribe("$app/#", 1)
    publisher = paho_client(at["a"], V5)
    publisher.publish("$app/x", b"dollar", 1)
    assert dollar.expect_message().topic == "$app/x"
    publisher.publish("plain/x", b"sentinel", 1)
    assert [m.topic for m in wild.collect_until(b"sentinel")] == ["plain/x"]


def test_sys_goes_to_the_systree_mountpoint(trees, paho_client):
    server, at = trees(broker={"systree_mountpoint": "tenant-a", "node_name": "n1"})
    watchers = {name: paho_client(at[name]) for name in ("a", "default")}
    for watcher in watchers.values():
        watcher.subscribe("$SYS/n1/mqtt/connect/received", 0)
    server.call(server.broker.systree.publish)
    got = watchers["a"].expect_message()
    assert got.topic == "$SYS/n1/mqtt/connect/received"
    watchers["default"].expect_no_message()
