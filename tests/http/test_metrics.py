"""/metrics, read with prometheus_client's parser, after traffic whose every packet the
test knows: the broker's counters and gauges exactly, the node label on every sample,
the namespace prefix, and each plugin's own figures (acl, auth_jwt, webhooks, the event
relay) counted from what real clients and a real webhook endpoint saw."""

from __future__ import annotations

from typing import Any

import jwt
import pytest

from broker.metrics import Metrics
from tests.broker.helpers import (
    PUBACK,
    PUBLISH,
    V5,
    ack_packet,
    connect_packet,
    publish_packet,
    subscribe_packet,
    unique_id,
)
from tests.plugins.webhooks.conftest import Answer, hook_server

from .conftest import api, get, scrape

__all__ = ["hook_server"]  # a fixture, used by name

NODE = "edge-1"
QUIET_SYS = {"systree_enabled": False}  # no $SYS round may add to the counters
COUNT = 5
QUOTA_EXCEEDED = 0x97
SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret"
COUNTERS = list(Metrics.__dataclass_fields__)


def known_traffic(server: Any, raw_client: Any) -> dict[str, int]:
    """A subscriber on m/# (QoS 1) and a publisher sending COUNT QoS 1 messages to m/x,
    every one acknowledged both ways: returns the bytes each way, computed from the
    packets themselves (MQTT 3.1.1, so no properties)."""
    sub = raw_client(server)
    sub.connect("sub")
    assert sub.subscribe(("m/#", 1)) == [1]
    pub = raw_client(server)
    pub.connect("pub")
    for i in range(COUNT):
        pub.publish("m/x", b"p%d" % i, qos=1)
    for i in range(COUNT):
        message = sub.expect(PUBLISH)
        assert (message.topic, message.payload, message.qos) == ("m/x", b"p%d" % i, 1)
        sub.ack(message)
    metrics = server.broker.metrics
    server.wait_for(lambda: metrics.mqtt_puback_received == COUNT)
    publish = len(publish_packet("m/x", b"p0", qos=1, packet_id=1))
    puback = len(ack_packet(PUBACK, 1))
    received = (
        len(connect_packet("sub"))
        + len(subscribe_packet(1, [("m/#", 1)]))
        + len(connect_packet("pub"))
        + COUNT * (publish + puback)
    )
    connack, suback = 4, 5
    sent = 2 * connack + suback + COUNT * (publish + puback)
    return {"received": received, "sent": sent}


def test_broker_counters_and_gauges_are_exact_after_known_traffic(start_broker, raw_client):
    server = start_broker(broker={"node_name": NODE, **QUIET_SYS})
    size = known_traffic(server, raw_client)
    m = scrape(server)
    expected_counters = {
        "mqtt_publish_received": COUNT,
        "mqtt_publish_sent": COUNT,
        "mqtt_puback_received": COUNT,
        "mqtt_puback_sent": COUNT,
        "socket_open": 2,
        "socket_close": 0,
        "mqtt_connect_received": 2,
        "mqtt_connack_sent": 2,
        "mqtt_connack_accepted_sent": 2,
        "mqtt_subscribe_received": 1,
        "mqtt_suback_sent": 1,
        "bytes_received": size["received"],
        "bytes_sent": size["sent"],
        "mqtt_disconnect_received": 0,
        "queue_message_drop": 0,
    }
    for name, expected in expected_counters.items():
        assert m(name, node=NODE) == expected, name
        assert m.types[name] == "counter", name
    expected_gauges = {
        "active_mqtt_connections": 2,
        "active_mqttws_connections": 0,
        "total_active_connections": 2,
        "queue_processes": 2,
        "sessions_offline": 0,
        "router_subscriptions": 1,
        "retain_messages": 0,
    }
    for name, expected in expected_gauges.items():
        assert m(name, node=NODE) == expected, name
        assert m.types[name] == "gauge", name
    assert m.types["uptime_seconds"] == "gauge"
    assert 0 <= m("uptime_seconds", node=NODE) < 60
    assert set(COUNTERS) <= set(m.values)  # every broker counter is served
    # Every sample carries the node label, and only it (no plugin is loaded).
    for name, samples in m.values.items():
        assert list(samples) == [frozenset({("node", NODE)})], name


def test_a_client_leaving_moves_the_counters_and_gauges(start_broker, raw_client):
    server = start_broker(broker=QUIET_SYS)
    known_traffic(server, raw_client)
    leaving = raw_client(server)
    leaving.connect("leaving")
    leaving.disconnect()  # returns once the broker closed the connection
    m = scrape(server)
    assert m("socket_open") == 3
    assert m("socket_close") == 1
    assert m("mqtt_disconnect_received") == 1
    assert m("active_mqtt_connections") == 2
    assert m("queue_processes") == 2  # its clean session ended with it


def test_namespace_prefixes_every_name_plugins_included(start_broker, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic read a/#\n")
    server = start_broker(
        http={"address": "127.0.0.1:0", "prometheus_namespace": "nautilus_"},
        plugins={"acl": {"enabled": True, "acl_file": str(acl)}},
    )
    m = scrape(server)
    assert all(name.startswith("nautilus_") for name in m.values), sorted(m.values)
    for line in m.text.splitlines():
        sample = line if not line.startswith("#") else line.split(" ", 3)[2]
        assert sample.startswith("nautilus_"), line
    assert m("nautilus_mqtt_publish_received") == 0
    assert m("nautilus_acl_rules") == 1
    assert m("nautilus_acl_rate_limited") == 0
    assert "mqtt_publish_received" not in m.values


def test_node_label_is_escaped(start_broker):
    node = 'odd "node" \\ name'
    server = start_broker(broker={"node_name": node})
    m = scrape(server)  # the official parser reads the escaped value back
    assert m("socket_open", node=node) == 0


def test_acl_rate_limited_counts_the_refused_publishes(start_broker, raw_client, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic write metered/# label metered\ntopic write free/#\n")
    server = start_broker(
        plugins={
            "acl": {
                "enabled": True,
                "acl_file": str(acl),
                "publish_rate_limits": {"metered": 2},
            }
        }
    )
    pub = raw_client(server, V5)
    pub.connect(unique_id("meter"))
    # One write: the limit's one-second window opens with the first and holds them all.
    pub.send(
        b"".join(
            publish_packet("metered/x", b"m", qos=1, packet_id=i, version=V5)
            for i in range(1, COUNT + 1)
        )
        + b"".join(
            publish_packet("free/x", b"f", qos=1, packet_id=i, version=V5)
            for i in range(COUNT + 1, 2 * COUNT + 1)
        )
    )
    codes = [pub.expect(PUBACK).reason_code for _ in range(2 * COUNT)]
    assert codes == [0, 0] + [QUOTA_EXCEEDED] * (COUNT - 2) + [0] * COUNT
    m = scrape(server)
    assert m("acl_rate_limited") == COUNT - 2
    assert m.types["acl_rate_limited"] == "counter"
    assert m("acl_rules") == 2
    assert m.types["acl_rules"] == "gauge"


def test_auth_jwt_failures_by_reason_and_accepted(start_broker, paho_client):
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"auth_jwt": {"enabled": True, "secret": SECRET}},
    )
    tokens = {
        "garbage": "not-a-jwt",
        "other key": jwt.encode({"rid": "alice"}, "another-secret-another-secret-00", "HS256"),
        "no rid": jwt.encode({"sub": "alice"}, SECRET, "HS256"),
        "wrong rid": jwt.encode({"rid": "bob"}, SECRET, "HS256"),
    }
    for token in tokens.values():
        refused = paho_client(server, connect=False)
        assert refused.connect(username="alice", password=token, expect_code=None).reason_code
    accepted = paho_client(server, connect=False)
    token = jwt.encode({"rid": "alice"}, SECRET, "HS256")
    accepted.connect(username="alice", password=token)
    m = scrape(server)
    assert m("auth_jwt_failures", reason="invalid_signature") == 2
    assert m("auth_jwt_failures", reason="missing_rid") == 1
    assert m("auth_jwt_failures", reason="username_rid_mismatch") == 1
    assert m("auth_jwt_accepted") == 1
    assert "auth_jwt_jwks_fetches" not in m.values  # a shared secret: no key set to fetch
    assert m("mqtt_connack_bad_credentials_sent") == 2  # invalid_signature
    assert m("mqtt_connack_not_authorized_sent") == 2


def test_webhooks_requests_and_errors_against_a_real_endpoint(
    start_broker, paho_client, hook_server
):
    register = hook_server.answer("/register", {"result": "ok"})
    gone = hook_server.answer("/gone", Answer({"error": "down"}, status=500))
    endpoints = [
        {"hook": "auth_on_register", "url": register},
        {"hook": "on_client_gone", "url": gone},
    ]
    server = start_broker(
        broker={"allow_anonymous": False},
        plugins={"webhooks": {"enabled": True, "endpoints": endpoints}},
    )
    paho_client(server, username="u", password="p")  # stays
    leaving = paho_client(server, username="u", password="p")
    leaving.disconnect()
    hook_server.expect("/gone")
    plugin = dict(server.broker.plugins)["webhooks"]
    server.wait_for(lambda: plugin.counters.errors == 1)  # the 500 came back
    m = scrape(server)
    assert hook_server.count("/register") == 2
    assert m("webhooks_requests") == 3  # two registers, one event
    assert m("webhooks_errors") == 1
    assert m("webhooks_timeouts") == 0
    assert m("webhooks_events_dropped") == 0
    assert m.types["webhooks_cache_entries"] == "gauge"


def test_event_relay_counts_its_events(start_broker, raw_client):
    relay_config = {"enabled": True, "address": "127.0.0.1:0", "heartbeat_interval": 0}
    server = start_broker(event_relay=relay_config)
    relay = dict(server.broker.plugins)["event_relay"]
    first = server.call(lambda: relay.log.next_seq)
    client = raw_client(server)
    client.connect(unique_id("relayed"))
    client.publish("nobody/listens", b"x")  # QoS 0: on_publish and on_message_drop
    client.disconnect()
    # register, wakeup, on_publish, on_message_drop, gone
    server.wait_for(lambda: relay.log.next_seq == first + 5)
    m = scrape(server)
    assert m("event_relay_events") == first - 1 + 5
    assert m("event_relay_consumers") == 0
    assert m.types["event_relay_consumers"] == "gauge"
    assert m("event_relay_records_sent") == 0


def test_metrics_reset_brings_the_counters_to_zero_on_metrics(keyed_broker, raw_client):
    server, key = keyed_broker(broker=QUIET_SYS)
    known_traffic(server, raw_client)
    before = scrape(server)
    assert before("mqtt_publish_received") == COUNT
    (row,) = api_table(server, "metrics/reset", key)
    assert row["mqtt_publish_received"] == 0
    assert row["active_mqtt_connections"] == 2  # gauges read the state, not reset
    after = scrape(server)
    for name in COUNTERS:
        assert after(name) == 0, name
    assert after("active_mqtt_connections") == 2
    assert after("router_subscriptions") == 1
    # Counting goes on from 0.
    pub = raw_client(server)
    pub.connect("again")
    pub.publish("m/x", b"one more", qos=1)
    assert scrape(server)("mqtt_publish_received") == 1


def api_table(server: Any, command: str, key: str) -> list[dict[str, Any]]:
    reply = api(server, command, key, method="POST")
    assert reply.status == 200, reply.body
    rows: list[dict[str, Any]] = reply.json["table"]
    return rows


@pytest.mark.parametrize("path", ["/metrics", "/health", "/health/ping", "/status.json"])
def test_open_routes_need_no_key(start_broker, path):
    assert get(start_broker(), path).status == 200
