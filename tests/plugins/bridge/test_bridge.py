"""Bridges between a real Nautilus and a real Mosquitto (and a second Nautilus), with
real clients on both sides (paho-mqtt)."""

from __future__ import annotations

import os
import signal
import subprocess
import zlib
from typing import Any

import pytest
import trustme
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.http.api_keys import ApiKeys
from testing.lifecycle import free_port
from tests.broker.helpers import V5, V311, PahoClient
from tests.http.conftest import api, error, table
from tests.http.test_commands import admin

pytestmark = pytest.mark.timeout(60)


def bridge_of(server):
    return dict(server.broker.plugins)["bridges"].by_name["b1"]


def ready(server) -> None:
    """Until the bridge is connected on both sides with its subscriptions made."""
    bridge = bridge_of(server)
    server.wait_for(lambda: bridge.state == "connected" and bridge.local_ready)


def client(port: int, version: int = V311, **connect) -> PahoClient:
    made = PahoClient("127.0.0.1", port, version)
    made.connect(**connect)
    return made


def test_out_with_prefixes_of_several_levels_and_qos(bridged, mosquitto):
    rule = {
        "pattern": "sensors/#",
        "direction": "out",
        "qos": 1,
        "local_prefix": "edge/site/",
        "remote_prefix": "cloud/a/b/",
    }
    server = bridged(mosquitto.port, [rule])
    ready(server)
    far = client(mosquitto.port)
    assert far.subscribe("cloud/#", 2) == [2]
    near = client(server.port)
    near.publish("edge/site/sensors/t1", b"one", qos=2)
    near.publish("edge/site/sensors/t2", b"two", qos=0)
    near.publish("edge/other/sensors/t3", b"not bridged", qos=1)
    near.publish("edge/site/sensors/t4", b"last", qos=1)
    got = [far.expect_message() for _ in range(3)]
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("cloud/a/b/sensors/t1", b"one", 1),  # the lower of the message's 2 and the rule's 1
        ("cloud/a/b/sensors/t2", b"two", 0),
        ("cloud/a/b/sensors/t4", b"last", 1),
    ]
    far.close()
    near.close()


def test_in_with_a_plus_pattern(bridged, mosquitto):
    rule = {
        "pattern": "cmd/+",
        "direction": "in",
        "qos": 1,
        "remote_prefix": "r/",
        "local_prefix": "l/x/",
    }
    server = bridged(mosquitto.port, [rule])
    ready(server)
    near = client(server.port)
    assert near.subscribe("l/#", 1) == [1]
    far = client(mosquitto.port)
    far.publish("r/cmd/reboot", b"now", qos=1)
    far.publish("r/cmd/a/b", b"two levels: not the pattern", qos=1)
    far.publish("r/cmd/stop", b"then", qos=1)
    got = [near.expect_message() for _ in range(2)]
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("l/x/cmd/reboot", b"now", 1),
        ("l/x/cmd/stop", b"then", 1),
    ]
    far.close()
    near.close()


def test_the_retain_flag_crosses_and_a_late_subscriber_gets_it(bridged, mosquitto):
    rules = [
        {"pattern": "state/#", "qos": 1, "retain": True},
        {"pattern": "plain/#", "qos": 1},  # retain not kept
    ]
    server = bridged(mosquitto.port, rules)
    ready(server)
    near = client(server.port)
    near.publish("state/door", b"open", qos=1, retain=True)
    near.publish("plain/door", b"closed", qos=1, retain=True)
    marker = client(mosquitto.port)  # both have crossed once a later message has
    assert marker.subscribe("state/marker", 1) == [1]
    near.publish("state/marker", b"m", qos=1)
    assert marker.expect_message().topic == "state/marker"
    late = client(mosquitto.port)
    assert late.subscribe([("state/door", 1), ("plain/door", 1), ("plain/marker", 1)]) == [1, 1, 1]
    message = late.expect_message()
    assert (message.topic, message.payload, message.retain) == ("state/door", b"open", True)
    marker.publish("plain/marker", b"m", qos=1)  # plain/door, had it kept its flag,
    assert late.expect_message().topic != "plain/door"  # would have come before this
    for c in (near, marker, late):
        c.close()


def test_both_directions_without_an_echo_loop(bridged, mosquitto):
    server = bridged(mosquitto.port, [{"pattern": "chat/#", "direction": "both", "qos": 1}])
    ready(server)
    near, far = client(server.port), client(mosquitto.port)
    assert near.subscribe("chat/#", 1) == [1]
    assert far.subscribe("chat/#", 1) == [1]
    near.publish("chat/1", b"from near", qos=1)
    far.publish("chat/2", b"from far", qos=1)
    near.publish("chat/end", b"end", qos=1)
    far.publish("chat/end", b"end", qos=1)
    seen_near = [near.expect_message().payload for _ in range(4)]
    seen_far = [far.expect_message().payload for _ in range(4)]
    # Each side: its own message once, the other side's once, the two ends; nothing twice.
    assert sorted(seen_near) == sorted([b"from near", b"from far", b"end", b"end"])
    assert sorted(seen_far) == sorted([b"from near", b"from far", b"end", b"end"])
    bridge = bridge_of(server)  # chat/1 and near's chat/end, as their PUBACKs come
    server.wait_for(lambda: bridge.counts["publish_out_1"] == 2)
    near.close()
    far.close()


def test_a_remote_away_for_a_while_loses_nothing_within_the_buffer(bridged, mosquitto):
    server = bridged(
        mosquitto.port,
        [{"pattern": "q/#", "qos": 1}],
        max_outgoing_buffered_messages=40,
        restart_timeout=2,
    )
    ready(server)
    bridge = bridge_of(server)
    mosquitto.stop()
    server.wait_for(lambda: bridge.state != "connected")
    near = client(server.port)
    for i in range(50):
        near.publish(f"q/{i}", str(i).encode(), qos=1)
    server.wait_for(lambda: bridge.counts["dropped"] == 10)  # 40 kept, the newest 10 not
    mosquitto.start()  # the same port; the bridge comes back within 1.6-2.4 s
    far = client(mosquitto.port)
    assert far.subscribe("q/#", 1) == [1]
    got = [far.expect_message().payload for _ in range(40)]
    assert sorted(int(p) for p in got) == list(range(40))
    server.wait_for(lambda: bridge.counts["publish_out_1"] == 40)  # as PUBACKs come
    near.close()
    far.close()


def test_a_wrong_password_is_retried_until_it_is_right(bridged, start_mosquitto, tmp_path):
    remote = start_mosquitto(users={"edge": "right"})
    server = bridged(remote.port, [{"pattern": "x/#"}], username="edge", password="wrong")
    bridge = bridge_of(server)
    server.wait_for(lambda: bridge.state == "retrying" and "refused" in bridge.reason)
    passwords = remote.directory / "passwords"
    passwords.write_text("edge:wrong\n")
    subprocess.run(["mosquitto_passwd", "-U", str(passwords)], check=True)
    assert remote.proc is not None
    os.kill(remote.proc.pid, signal.SIGHUP)  # Mosquitto reads its password file again
    ready(server)


def test_mqtt5_user_properties_cross_between_two_nautilus(bridged, start_broker):
    far_broker = start_broker()
    server = bridged(far_broker.port, [{"pattern": "p/#", "qos": 1}], mqtt_version=5)
    ready(server)
    far = client(far_broker.port, V5)
    assert far.subscribe("p/#", 1) == [1]
    near = client(server.port, V5)
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("origin", "edge-1")]
    properties.ContentType = "text/plain"
    near.publish("p/1", b"hello", qos=1, properties=properties)
    message = far.expect_message()
    assert message.payload == b"hello"
    assert message.properties.UserProperty == [("origin", "edge-1")]
    assert message.properties.ContentType == "text/plain"
    near.close()
    far.close()


def test_the_admin_commands_show_stop_and_start_a_bridge(start_broker, mosquitto, tmp_path):

    keys = tmp_path / "keys"
    key = ApiKeys(str(keys)).add()
    bridge_table = {
        "name": "b1",
        "address": f"127.0.0.1:{mosquitto.port}",
        "restart_timeout": 1,
        "topics": [{"pattern": "x/#"}],
    }
    server = start_broker(
        listeners=[{"type": "tcp", "address": f"127.0.0.1:{free_port()}"}],
        bridges=[bridge_table],
        http={"address": "127.0.0.1:0", "api_keys_file": str(keys)},
    )
    ready(server)
    shown = admin(server, "bridge", "show", key=key, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    assert header.split()[:3] == ["name", "endpoint", "state"]
    assert row.split()[:3] == ["b1", f"127.0.0.1:{mosquitto.port}", "connected"]

    stopped = table(api(server, "bridge/stop", key, name="b1"))
    assert stopped[0]["state"] == "stopped"
    bridge = bridge_of(server)
    assert server.call(lambda: bridge.state) == "stopped"
    table(api(server, "bridge/start", key, name="b1"))
    ready(server)
    assert "no bridge 'b2' (configured: b1)" in error(
        api(server, "bridge/start", key, name="b2"), 404
    )


def test_the_bridges_figures_are_in_the_sys_tree(bridged, mosquitto):
    server = bridged(mosquitto.port, [{"pattern": "x/#"}])
    ready(server)
    values = server.call(server.broker.systree.plugin_values)
    assert values["$SYS/nautilus/vmq/bridge/connected/b1"] == 1
    assert values["$SYS/nautilus/vmq/bridge/queue/max/b1"] == 1000


def tls_remote(start_mosquitto, tmp_path) -> tuple[Any, str]:
    """A Mosquitto with a TLS listener whose certificate names broker.test, issued by a
    CA of the test's own; and that CA's file."""
    ca = trustme.CA()
    certificate = ca.issue_cert("broker.test")
    chain, key, ca_file = tmp_path / "chain.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.private_key_and_cert_chain_pem.write_to_path(str(chain))
    certificate.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return start_mosquitto(tls=(chain, key)), str(ca_file)


def test_tls_with_the_remotes_certificate_checked_against_a_ca(bridged, start_mosquitto, tmp_path):
    remote, ca_file = tls_remote(start_mosquitto, tmp_path)
    tls = {"transport": "ssl", "cafile": ca_file, "sni": "broker.test"}
    server = bridged(remote.port, [{"pattern": "s/#", "qos": 1}], **tls)
    ready(server)
    near = client(server.port)
    near.publish("s/1", b"over tls", qos=1)
    server.wait_for(lambda: bridge_of(server).counts["publish_out_1"] == 1)  # acknowledged
    near.close()


def test_tls_with_a_name_the_certificate_does_not_have_keeps_retrying(
    bridged, start_mosquitto, tmp_path
):
    remote, ca_file = tls_remote(start_mosquitto, tmp_path)
    tls = {"transport": "ssl", "cafile": ca_file, "sni": "other.test"}
    server = bridged(remote.port, [{"pattern": "s/#"}], **tls)
    bridge = bridge_of(server)
    server.wait_for(lambda: bridge.state == "retrying" and "VERIFY_FAILED" in bridge.reason)


def test_a_persistent_queue_survives_a_restart_of_this_broker(
    start_broker, start_mosquitto, tmp_path
):
    remote = start_mosquitto()
    remote.stop()  # away from the start: everything waits in the queue
    table = {
        "name": "b1",
        "address": f"127.0.0.1:{remote.port}",
        "restart_timeout": 2,  # the far subscriber is in before the bridge is back
        "persistent_queue": True,
        "topics": [{"pattern": "d/#", "qos": 1}],
    }
    store = {"backend": "memory", "path": str(tmp_path / "data")}

    def start():
        listener = {"type": "tcp", "address": f"127.0.0.1:{free_port()}"}
        return start_broker(listeners=[listener], bridges=[table], store=store)

    first = start()
    bridge = bridge_of(first)
    first.wait_for(lambda: bridge.local_ready)
    near = client(first.port)
    for i in range(20):
        near.publish(f"d/{i}", str(i).encode(), qos=1)
    first.wait_for(lambda: len(bridge.buffer) == 20)
    near.close()
    first.stop()
    assert (tmp_path / "data" / "bridges" / "b1").is_dir()  # <store.path>/bridges/<name>

    second = start()  # the same queue, read again
    assert second.call(lambda: len(bridge_of(second).buffer)) == 20
    remote.start()
    far = client(remote.port)
    assert far.subscribe("d/#", 1) == [1]
    got = [far.expect_message().payload for _ in range(20)]
    assert [int(p) for p in got] == list(range(20))  # all, in order
    later = bridge_of(second)
    second.wait_for(lambda: len(later.buffer) == 0)  # acknowledged: gone from the disk
    far.close()


def test_in_a_cluster_a_bridge_runs_on_one_node_and_moves_when_it_leaves(
    start_broker, redis_url, mosquitto
):
    table = {
        "name": "b1",
        "address": f"127.0.0.1:{mosquitto.port}",
        "restart_timeout": 1,
        "topics": [{"pattern": "x/#"}],
    }

    def node(name):
        return start_broker(
            broker={"node_name": name},
            listeners=[{"type": "tcp", "address": f"127.0.0.1:{free_port()}"}],
            cluster={
                "address": "127.0.0.1:0",
                "metadata": "redis",
                "liveness_interval": 0.2,
                "dead_after": 1.0,
            },
            plugins={"redis_subs": {"enabled": True, "url": redis_url}},
            bridges=[table],
        )

    nodes = {"a": node("a"), "b": node("b")}
    for server in nodes.values():
        peers = server.broker.peers
        server.wait_for(lambda peers=peers: peers.alive() == ["a", "b"])
    owner = ["a", "b"][zlib.crc32(b"b1") % 2]  # the alive member the name hashes to
    other = "b" if owner == "a" else "a"
    ready(nodes[owner])
    waiting = bridge_of(nodes[other])
    nodes[other].wait_for(lambda: waiting.state == "stopped")
    nodes[owner].stop()  # it leaves: declared dead after 1 s, the bridge moves
    ready(nodes[other])


def test_qos_2_crosses_both_ways(bridged, mosquitto):
    rules = [
        {"pattern": "o/#", "direction": "out", "qos": 2},
        {"pattern": "i/#", "direction": "in", "qos": 2},
    ]
    server = bridged(mosquitto.port, rules)
    ready(server)
    near, far = client(server.port), client(mosquitto.port)
    assert near.subscribe("i/#", 2) == [2]
    assert far.subscribe("o/#", 2) == [2]
    near.publish("o/1", b"out", qos=2)
    far.publish("i/1", b"in", qos=2)
    assert (far.expect_message().qos, near.expect_message().qos) == (2, 2)
    bridge = bridge_of(server)
    server.wait_for(lambda: bridge.counts["publish_out_2"] == bridge.counts["publish_in_2"] == 1)
    near.close()
    far.close()


def test_an_acl_here_restricts_the_bridge_as_any_client(start_broker, mosquitto, tmp_path, caplog):
    acl = tmp_path / "acl"
    acl.write_text("topic allowed/#\n")  # for every client, the bridge's included
    table = {
        "name": "b1",
        "address": f"127.0.0.1:{mosquitto.port}",
        "topics": [{"pattern": "allowed/#", "qos": 1}, {"pattern": "secret/#", "qos": 1}],
    }
    server = start_broker(
        listeners=[{"type": "tcp", "address": f"127.0.0.1:{free_port()}"}],
        bridges=[table],
        plugins={"acl": {"enabled": True, "acl_file": str(acl)}},
    )
    ready(server)
    assert "refused its subscription to secret/#" in caplog.text  # logged, not a crash
    far = client(mosquitto.port)
    assert far.subscribe("#", 1) == [1]
    near = client(server.port)
    near.publish("allowed/x", b"crosses", qos=1)
    assert far.expect_message().topic == "allowed/x"
    near.close()
    far.close()


def test_a_remote_that_refuses_the_bridge_bit_gets_the_loop_check(bridged, start_broker):
    far_broker = start_broker()  # Nautilus: CONNACK 1 to the bridge bit, then no bit
    server = bridged(far_broker.port, [{"pattern": "chat/#", "direction": "both", "qos": 1}])
    ready(server)
    near, far = client(server.port), client(far_broker.port)
    assert near.subscribe("chat/#", 1) == [1]
    assert far.subscribe("chat/#", 1) == [1]
    near.publish("chat/1", b"from near", qos=1)
    assert far.expect_message().payload == b"from near"
    far.publish("chat/2", b"from far", qos=1)
    # near: its own once, then far's; its own echoed back by far would come between
    assert [near.expect_message().payload for _ in range(2)] == [b"from near", b"from far"]
    near.publish("chat/3", b"end", qos=1)
    assert near.expect_message().payload == b"end"
    assert far.expect_message().payload == b"from far"  # far's own, as its subscriber
    assert far.expect_message().payload == b"end"
    assert not bridge_of(server)._private  # it did fall back
    near.close()
    far.close()


def test_a_bridge_with_a_mountpoint_acts_on_that_tree_only(start_broker, mosquitto):
    bridge = {
        "name": "b1",
        "address": f"127.0.0.1:{mosquitto.port}",
        "restart_timeout": 1,
        "mountpoint": "t-a",
        "topics": [
            {"pattern": "up/#", "direction": "out"},
            {"pattern": "down/#", "direction": "in"},
        ],
    }
    listeners = [
        {"type": "tcp", "address": f"127.0.0.1:{free_port()}"},
        {"type": "tcp", "address": f"127.0.0.1:{free_port()}", "mountpoint": "t-a"},
    ]
    server = start_broker(listeners=listeners, bridges=[bridge])
    ready(server)
    default, tenant = (client(port) for _, port in server.broker.listening)
    far = client(mosquitto.port)
    assert far.subscribe("up/#", 1) == [1]
    for near in (default, tenant):
        assert near.subscribe("down/#", 1) == [1]
    default.publish("up/x", b"default's", 1)  # another tree: not bridged
    tenant.publish("up/x", b"t-a's", 1)
    assert far.expect_message().payload == b"t-a's"
    far.expect_no_message()
    far.publish("down/y", b"in", 1)
    got = tenant.expect_message()
    assert (got.topic, got.payload) == ("down/y", b"in")
    default.expect_no_message()
    for made in (default, tenant, far):
        made.close()
