"""The admin API, /api/v1/<command>, against a real broker with real MQTT clients: keys
(basic-auth username or x-api-key; 401 otherwise), sessions, one client, disconnects,
retained messages, metrics and plugins, and the 400 / 404 answers."""

from __future__ import annotations

import base64

import pytest

from tests.broker.helpers import (
    DISCONNECT,
    PINGREQ_BYTES,
    PINGRESP,
    PUBLISH,
    SESSION_EXPIRY_INTERVAL,
    V5,
    V311,
    RawClient,
    unique_id,
)

from .conftest import api, basic, error, get, table

COMMANDS = [
    "session/show",
    "sessions",
    "session/client",
    "session/disconnect",
    "retain/show",
    "retain/delete",
    "metrics/show",
    "metrics/reset",
    "plugin/show",
    "plugins",
    "plugin/enable",
    "plugin/disable",
    "trace/client",
    "trace/stop-all",
]
ADMINISTRATIVE_ACTION = 0x98
REFUSED_V3 = 0x80


def done(client_id: str, **what: bool) -> dict:
    """A session/disconnect row (one node, the default mountpoint)."""
    return {"node": "nautilus", "mountpoint": "", "client_id": client_id, **what}


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_needs_a_key(keyed_broker, command):
    server, _ = keyed_broker()
    for headers in (
        {},
        basic("not-the-key-not-the-key"),
        {"x-api-key": "not-the-key-not-the-key"},
    ):
        for method in ("GET", "POST"):
            reply = get(server, f"/api/v1/{command}", method=method, headers=headers)
            assert error(reply, 401)
            assert reply.headers["WWW-Authenticate"] == 'Basic realm="nautilus"'


def test_a_valid_key_in_basic_auth_or_x_api_key_is_let_in(keyed_broker):
    server, key = keyed_broker()
    for headers in (basic(key), {"x-api-key": key}):
        for method in ("GET", "POST"):
            reply = get(server, "/api/v1/metrics/show", method=method, headers=headers)
            assert table(reply)[0]["socket_open"] == 0


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_the_key_either_way(keyed_broker, command):
    server, key = keyed_broker()
    for headers in (basic(key), {"x-api-key": key}):
        reply = get(server, f"/api/v1/{command}", method="POST", headers=headers)
        # Past the key: a table, or 400 for the commands that need an argument.
        assert reply.status in (200, 400), (command, reply.status, reply.body)
        assert reply.json["type"] == ("table" if reply.status == 200 else "error")


def test_the_key_must_be_the_username_and_well_formed(keyed_broker):
    server, key = keyed_broker()

    def encoded(credentials: str) -> str:
        return "Basic " + base64.b64encode(credentials.encode()).decode()

    for authorization in (
        encoded(f"admin:{key}"),  # the key as the password
        encoded(key),  # no colon: not user:password at all
        encoded(f"{key}:secret"),  # a password beside the key: only an empty one is
        encoded(f":{key}"),
        f"Bearer {key}",
        "Basic !!not base64!!",
        encoded(f"{key}:")[:-1],  # base64 cut short
        f"Basic  {encoded(f'{key}:')[6:]}",  # two spaces
    ):
        reply = get(server, "/api/v1/plugins", headers={"Authorization": authorization})
        assert "user name with an empty password" in error(reply, 401), authorization
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="nautilus"'
    for authorization in (encoded(f"{key}:"), "basic " + encoded(f"{key}:")[6:]):
        reply = get(server, "/api/v1/plugins", headers={"Authorization": authorization})
        assert reply.status == 200, authorization  # KEY: exactly (the scheme in any case)


def test_without_a_keys_file_no_key_works(start_broker, tmp_path):
    server = start_broker(
        http={"address": "127.0.0.1:0", "api_keys_file": str(tmp_path / "missing")}
    )
    assert error(get(server, "/api/v1/plugins", headers=basic("")), 401)
    assert error(get(server, "/api/v1/plugins", headers={"x-api-key": "anything"}), 401)


def test_methods_other_than_get_and_post_are_refused(keyed_broker):
    server, key = keyed_broker()
    for method in ("PUT", "DELETE", "PATCH"):
        assert get(server, "/api/v1/plugins", method=method, headers=basic(key)).status == 405


# --------------------------------------------------------------------------- sessions


def test_sessions_online_and_offline_with_filters(keyed_broker, raw_client, paho_client):
    server, key = keyed_broker()
    gone = raw_client(server)
    gone.connect("fleet-offline", clean=False)  # persistent: stays as an offline session
    gone.subscribe(("f/#", 1))
    gone.disconnect()
    paho_client(server, client_id="fleet-online", username="ann")
    paho_client(server, client_id="other")

    rows = table(api(server, "session/show", key))
    assert [r["client_id"] for r in rows] == ["fleet-offline", "fleet-online", "other"]
    offline, online, _ = rows
    assert offline == {
        "client_id": "fleet-offline",
        "is_online": False,
        "is_offline": True,
        "node": "nautilus",
        "peer_host": None,
        "peer_port": None,
        "user": None,
        "mountpoint": "",
        "protocol": None,
        "clean_session": False,
        "session_expiry": offline["session_expiry"],
        "session_started_at": None,
        "queue_size": 0,
        "online_messages": 0,
        "offline_messages": 0,
        "waiting_acks": 0,
        "num_sessions": 0,
        "num_subscriptions": 1,
    }
    assert online["is_online"] is True
    assert online["peer_host"] == "127.0.0.1"
    assert isinstance(online["peer_port"], int) and online["peer_port"] > 0
    assert (online["user"], online["protocol"], online["clean_session"]) == ("ann", 4, True)
    assert online["num_subscriptions"] == 0

    assert table(api(server, "sessions", key)) == rows  # VerneMQ's alias
    # client_id=TEXT is VerneMQ's equality; ~TEXT searches (what client_id=TEXT did once).
    names = [r["client_id"] for r in table(api(server, "session/show", key, client_id="~leet"))]
    assert names == ["fleet-offline", "fleet-online"]
    names = [r["client_id"] for r in table(api(server, "session/show", key, client_id="other"))]
    assert names == ["other"]
    names = [r["client_id"] for r in table(api(server, "sessions", key, online="true"))]
    assert names == ["fleet-online", "other"]
    names = [r["client_id"] for r in table(api(server, "sessions", key, online="false"))]
    assert names == ["fleet-offline"]
    both = api(server, "sessions", key, **{"client-id": "~fleet", "online": "false"})
    assert [r["client_id"] for r in table(both)] == ["fleet-offline"]
    assert table(api(server, "sessions", key, client_id="nobody")) == []
    assert "online" in error(api(server, "sessions", key, online="maybe"), 400)


def test_client_shows_subscriptions_with_options_and_the_offline_queue(keyed_broker, raw_client):
    server, key = keyed_broker()
    client_id = unique_id("queued")
    sub = raw_client(server, V5)
    sub.connect(client_id, clean=False, properties={SESSION_EXPIRY_INTERVAL: 300})
    # QoS 1, no local, retain as published, retain handling 2; and a plain QoS 0 one.
    assert sub.subscribe(("q/#", 1 | 4 | 8 | 2 << 4), ("z/+", 0)) == [1, 0]
    sub.disconnect()
    pub = raw_client(server)
    pub.connect(unique_id("pub"))
    for i in range(3):
        pub.publish("q/x", b"%d" % i, qos=1)

    (row,) = table(api(server, "session/client", key, client_id=client_id))
    assert row["client_id"] == client_id
    assert row["is_online"] is False
    assert row["session_expiry"] == 300
    assert row["clean_session"] is False
    assert row["queue_size"] == 3
    assert row["num_subscriptions"] == 2
    assert row["subscriptions"] == [
        {
            "topic": "q/#",
            "qos": 1,
            "no_local": True,
            "retain_as_published": True,
            "retain_handling": 2,
        },
        {
            "topic": "z/+",
            "qos": 0,
            "no_local": False,
            "retain_as_published": False,
            "retain_handling": 0,
        },
    ]
    assert row["queue"] == {"online_messages": 3, "offline_messages_on_disk": 0, "in_flight": 0}
    # `client-id` is taken as well as `client_id`.
    assert table(api(server, "session/client", key, **{"client-id": client_id})) == [row]

    back = raw_client(server, V5)  # the queue is really there: it arrives on resume
    assert back.connect(client_id, clean=False).session_present
    assert [back.expect(PUBLISH).payload for _ in range(3)] == [b"0", b"1", b"2"]


def test_client_unknown_is_404_and_missing_argument_400(keyed_broker):
    server, key = keyed_broker()
    assert "nobody" in error(api(server, "session/client", key, client_id="nobody"), 404)
    assert "client_id" in error(api(server, "session/client", key), 400)
    assert "client_id" in error(api(server, "session/client", key, client_id=""), 400)


def test_disconnect_v5_gets_0x98_and_keeps_the_session_then_cleanup_deletes_it(
    keyed_broker, raw_client
):
    server, key = keyed_broker()
    client_id = unique_id("v5")
    client = raw_client(server, V5)
    client.connect(client_id, clean=False, properties={SESSION_EXPIRY_INTERVAL: 300})
    client.subscribe(("kept/#", 1))

    reply = api(server, "session/disconnect", key, method="POST", client_id=client_id)
    assert table(reply) == [done(client_id, disconnected=True, deleted=False)]
    (packet,) = client.expect_closed()
    assert (packet.type, packet.reason_code) == (DISCONNECT, ADMINISTRATIVE_ACTION)
    (row,) = table(api(server, "session/client", key, client_id=client_id))
    assert row["is_online"] is False
    assert [s["topic"] for s in row["subscriptions"]] == ["kept/#"]

    # Not connected any more: only a cleanup has something to do.
    assert error(api(server, "session/disconnect", key, client_id=client_id), 404)
    reply = api(server, "session/disconnect", key, client_id=client_id, cleanup="true")
    assert table(reply) == [done(client_id, disconnected=False, deleted=True)]
    assert error(api(server, "session/client", key, client_id=client_id), 404)
    again = raw_client(server, V5)
    connack = again.connect(client_id, clean=False, properties={SESSION_EXPIRY_INTERVAL: 300})
    assert not connack.session_present


def test_disconnect_with_the_cleanup_flag_of_an_online_client(keyed_broker, raw_client):
    server, key = keyed_broker()
    client_id = unique_id("v3")
    client = raw_client(server, V311)
    client.connect(client_id, clean=False)
    client.subscribe(("gone/#", 1))
    # VerneMQ's flag form, `--cleanup` with no value.
    reply = get(
        server, f"/api/v1/session/disconnect?client_id={client_id}&--cleanup", headers=basic(key)
    )
    assert table(reply) == [done(client_id, disconnected=True, deleted=True)]
    assert client.expect_closed() == []  # MQTT 3.1.1 has no DISCONNECT from the server
    assert error(api(server, "session/client", key, client_id=client_id), 404)
    assert table(api(server, "sessions", key)) == []


def test_disconnect_unknown_is_404_and_missing_argument_400(keyed_broker):
    server, key = keyed_broker()
    assert error(api(server, "session/disconnect", key, client_id="ghost"), 404)
    assert error(api(server, "session/disconnect", key, client_id="ghost", cleanup="true"), 404)
    assert error(api(server, "session/disconnect", key), 400)
    bad_flag = api(server, "session/disconnect", key, client_id="ghost", cleanup="perhaps")
    assert "cleanup" in error(bad_flag, 400)


# --------------------------------------------------------------------------- retained


def test_retained_show_with_a_filter_and_a_limit(keyed_broker, raw_client):
    server, key = keyed_broker()
    pub = raw_client(server)
    pub.connect(unique_id("pub"))
    pub.publish("shelf/b", b"second", qos=1, retain=True)
    pub.publish("shelf/a", b"first", qos=0, retain=True)
    pub.publish("shelf/deep/x", b"\xff\x00", qos=1, retain=True)
    pub.publish("other/c", b"elsewhere", qos=1, retain=True)
    server.wait_for(lambda: len(server.broker.retained) == 4)

    rows = table(api(server, "retain/show", key, topic="shelf/+"))
    assert rows == [
        {
            "topic": "shelf/a",
            "qos": 0,
            "payload": "first",
            "payload_encoding": "utf-8",
            "payload_size": 5,
        },
        {
            "topic": "shelf/b",
            "qos": 1,
            "payload": "second",
            "payload_encoding": "utf-8",
            "payload_size": 6,
        },
    ]
    deep = table(api(server, "retain/show", key, topic="shelf/deep/#"))
    assert deep[0]["payload"] == base64.b64encode(b"\xff\x00").decode()
    assert deep[0]["payload_encoding"] == "base64"
    every = table(api(server, "retain/show", key))  # default "#"
    assert [r["topic"] for r in every] == ["other/c", "shelf/a", "shelf/b", "shelf/deep/x"]
    limited = table(api(server, "retain/show", key, topic="#", limit="2"))
    assert [r["topic"] for r in limited] == ["other/c", "shelf/a"]
    assert "limit" in error(api(server, "retain/show", key, limit="many"), 400)


def test_retained_delete_then_a_new_subscriber_gets_nothing(keyed_broker, raw_client):
    server, key = keyed_broker()
    pub = raw_client(server)
    pub.connect(unique_id("pub"))
    pub.publish("lamp/state", b"on", qos=1, retain=True)
    pub.publish("lamp/other", b"kept", qos=1, retain=True)

    reply = api(server, "retain/delete", key, method="POST", topic="lamp/state")
    assert table(reply) == [{"deleted": "lamp/state"}]
    assert [r["topic"] for r in table(api(server, "retain/show", key))] == ["lamp/other"]
    assert retained_for(raw_client(server), "lamp/#") == [("lamp/other", b"kept")]

    assert error(api(server, "retain/delete", key, topic="lamp/state"), 404)  # gone now
    assert error(api(server, "retain/delete", key, topic="never/was"), 404)
    assert "wildcards" in error(api(server, "retain/delete", key, topic="lamp/#"), 400)
    assert error(api(server, "retain/delete", key, topic="lamp/+"), 400)
    assert "topic" in error(api(server, "retain/delete", key), 400)


def retained_for(client: RawClient, topic_filter: str) -> list[tuple[str, bytes]]:
    """The retained messages a new subscription gets: those sent before the answer to a
    PINGREQ that follows the SUBSCRIBE (the broker answers packets in order)."""
    client.connect(unique_id("sub"))
    client.subscribe((topic_filter, 1))
    client.send(PINGREQ_BYTES)
    got = [(p.topic, p.payload) for p in client.stash]
    while (packet := client.read_packet()) is not None and packet.type != PINGRESP:
        assert packet.type == PUBLISH and packet.retain, packet
        got.append((packet.topic, packet.payload))
    assert packet is not None, "closed before the PINGRESP"
    return sorted(got)


def test_retained_delete_lasts_through_a_restart(keyed_broker, raw_client, tmp_path):
    store = {"backend": "leveldb", "path": str(tmp_path / "db")}
    server, key = keyed_broker(store=store)
    pub = raw_client(server)
    pub.connect(unique_id("pub"))
    pub.publish("lamp/state", b"on", qos=1, retain=True)
    pub.publish("lamp/other", b"kept", qos=1, retain=True)
    assert table(api(server, "retain/delete", key, topic="lamp/state"))
    server.stop()

    again, _ = keyed_broker(store=store)
    assert retained_for(raw_client(again), "lamp/#") == [("lamp/other", b"kept")]
    assert [r["topic"] for r in table(api(again, "retain/show", key))] == ["lamp/other"]


# --------------------------------------------------------------------------- metrics


def test_metrics_show_has_counters_gauges_and_uptime(keyed_broker, raw_client):
    server, key = keyed_broker(broker={"systree_enabled": False})
    client = raw_client(server)
    client.connect(unique_id("m"))
    client.publish("a/b", b"x", qos=1)
    (row,) = table(api(server, "metrics/show", key))
    assert row["mqtt_publish_received"] == 1
    assert row["mqtt_puback_sent"] == 1
    assert row["socket_open"] == 1
    assert row["active_mqtt_connections"] == 1
    assert row["total_active_connections"] == 1
    assert 0 <= row["uptime_seconds"] < 60
    assert row == {**server.call(server.broker.metrics.snapshot), **row}


# --------------------------------------------------------------------------- plugins


def test_plugin_disable_and_enable_change_authorization(keyed_broker, paho_client, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic read public/#\ntopic write public/#\n")
    server, key = keyed_broker(plugins={"acl": {"enabled": True, "acl_file": str(acl)}})
    shown = table(api(server, "plugin/show", key))
    assert shown == [
        {"name": "acl", "enabled": True, "hooks": ["auth_on_publish", "auth_on_subscribe"]}
    ]
    assert table(api(server, "plugins", key)) == shown
    client = paho_client(server)
    assert client.subscribe("secret/#", 1) == [REFUSED_V3]

    rows = table(api(server, "plugin/disable", key, method="POST", name="acl"))
    assert rows == [{**shown[0], "enabled": False}]
    assert client.subscribe("secret/#", 1) == [1]  # no ACL asked: anonymous may
    client.publish("secret/x", b"now allowed", qos=1)
    assert client.expect_message().payload == b"now allowed"

    rows = table(api(server, "plugin/enable", key, name="acl"))
    assert rows == shown
    assert client.subscribe("secret/#", 1) == [REFUSED_V3]


def test_plugin_unknown_is_404_and_missing_name_400(keyed_broker, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic #\n")
    server, key = keyed_broker(plugins={"acl": {"enabled": True, "acl_file": str(acl)}})
    assert "nope" in error(api(server, "plugin/enable", key, name="nope"), 404)
    assert error(api(server, "plugin/disable", key, name="nope"), 404)
    assert "name" in error(api(server, "plugin/enable", key), 400)
    assert "name" in error(api(server, "plugin/disable", key), 400)
    assert table(api(server, "plugins", key))[0]["enabled"] is True  # nothing changed


def test_disconnect_closes_every_connection_of_a_multi_session_client(keyed_broker, raw_client):
    server, key = keyed_broker(broker={"allow_multiple_sessions": True})
    members = [raw_client(server) for _ in range(3)]
    for member in members:
        member.connect("shared-id", clean=False)
    reply = api(server, "session/disconnect", key, client_id="shared-id", cleanup="true")
    assert table(reply) == [done("shared-id", disconnected=True, deleted=True)]
    # The session is gone from the registry, so no connection may stay attached to it.
    assert table(api(server, "sessions", key)) == []
    assert [member.is_open(1.0) for member in members] == [False, False, False]


def test_a_damaged_keys_file_refuses_everything_with_one_clear_error(keyed_broker, keys_file):
    server, key = keyed_broker()
    assert table(api(server, "plugins", key)) == []
    with keys_file.open("a", encoding="utf-8") as out:
        out.write("not a key record\n")
    message = error(api(server, "plugins", key), 503)  # not even the good key: fail closed
    assert message == (
        f"{keys_file}: line 2 is not a key record (as nautilus api-key writes them); "
        "fix or delete the line"
    )
