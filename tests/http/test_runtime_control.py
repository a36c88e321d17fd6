"""Run-time control of a real broker: `set KEY=VALUE` / `show settings` (what a client
sees after a change; a bad key or value changes nothing) and `listener show | stop |
start` (a stopped listener refuses new connections and keeps the open ones). The
cluster-wide side is in tests/cluster/test_admin_cluster.py."""

from __future__ import annotations

import logging
import socket

import pytest

from tests.broker.helpers import DISCONNECT, PINGREQ_BYTES, PINGRESP, V5

from .conftest import api, error, get, table
from .test_commands import admin

IDENTIFIER_REJECTED = 2  # MQTT 3.1.1 CONNACK
ADMINISTRATIVE_ACTION = 0x98


def setting(server, key: str, name: str) -> dict:
    (row,) = [r for r in table(api(server, "settings/show", key)) if r["setting"] == name]
    return row


def test_set_changes_a_limit_for_the_next_connect(keyed_broker, raw_client):
    server, key = keyed_broker()
    rows = table(api(server, "set", key, method="POST", max_client_id_size="5"))
    assert rows == [
        {"node": "nautilus", "setting": "broker.max_client_id_size", "value": 5, "previous": 100}
    ]
    raw_client(server).connect("sixsix", expect_code=IDENTIFIER_REJECTED)
    raw_client(server).connect("five5")
    shown = setting(server, key, "broker.max_client_id_size")
    assert (shown["value"], shown["takes_effect"]) == (5, "new connections (their CONNECT)")

    # Full names, VerneMQ's on / off, several at once.
    both = {"broker.upgrade_outgoing_qos": "on", "allow_publish_during_netsplit": "true"}
    rows = table(api(server, "set", key, **both))
    assert [(r["setting"], r["value"]) for r in rows] == [
        ("broker.upgrade_outgoing_qos", True),
        ("cluster.allow_publish_during_netsplit", True),
    ]


def test_a_bad_key_or_value_is_named_and_changes_nothing(keyed_broker):
    server, key = keyed_broker()
    unknown = error(api(server, "set", key, max_client_id_size="7", listeners="x"), 400)
    assert unknown.startswith("listeners: not a setting that can change while running")
    negative = error(api(server, "set", key, max_client_id_size="-1"), 400)
    assert negative == "broker.max_client_id_size: must be 0 or more, got -1"
    choice = error(api(server, "set", key, shared_subscription_policy="best"), 400)
    assert choice.startswith("broker.shared_subscription_policy: 'best' is not one of")
    assert error(api(server, "set", key, max_keepalive="ten"), 400).startswith(
        "broker.max_keepalive"
    )
    assert "KEY=VALUE" in error(api(server, "set", key), 400)
    assert setting(server, key, "broker.max_client_id_size")["value"] == 100  # untouched


def test_set_the_log_level(keyed_broker):
    server, key = keyed_broker()
    root = logging.getLogger()
    before = root.level
    try:
        assert table(api(server, "set", key, **{"log.level": "debug"}))[0]["value"] == "debug"
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(before)


def test_set_and_show_settings_from_the_command_line(keyed_broker, raw_client, tmp_path):
    server, key = keyed_broker()
    done = admin(server, "set", "max_client_id_size=4", "queue_type=lifo", key=key, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0].split() == ["node", "setting", "value", "previous"]
    raw_client(server).connect("fives", expect_code=IDENTIFIER_REJECTED)
    shown = admin(server, "show", "settings", key=key, cwd=tmp_path)
    line = next(line for line in shown.stdout.splitlines() if "broker.queue_type" in line)
    assert line.split()[:3] == ["nautilus", "broker.queue_type", "lifo"]
    refused = admin(server, "set", "max_client_id_size", key=key, cwd=tmp_path)
    assert refused.returncode == 2 and "KEY=VALUE" in refused.stderr


def test_a_stopped_listener_refuses_connections_and_keeps_the_open_ones(keyed_broker, raw_client):
    server, key = keyed_broker()
    host, port = server.broker.listening[0]
    kept = raw_client(server)
    kept.connect("kept")
    (row,) = table(api(server, "listener/show", key))
    assert row == {
        "listener": 0,
        "type": "tcp",
        "address": f"{host}:{port}",
        "mountpoint": "",
        "state": "running",
        "connections": 1,
        "max_connections": 10000,
    }

    (stopped,) = table(api(server, "listener/stop", key, address=row["address"]))
    assert stopped["state"] == "stopped"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=1).close()
    kept.send(PINGREQ_BYTES)  # the open connection is served on
    assert kept.expect(PINGRESP)
    health = get(server, "/health")
    assert health.status == 503 and "stopped" in health.json["reasons"][0]
    assert "not running" in error(api(server, "listener/stop", key, address="0"), 400)

    with socket.socket() as squatter:  # another program takes the port meanwhile
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # `kept` is on it
        squatter.bind((host, port))
        squatter.listen()
        taken = error(api(server, "listener/start", key, address="0"), 400)
    assert taken == f"listeners[0] cannot start: {host}:{port}: address already in use"
    (started,) = table(api(server, "listener/start", key, address="0"))  # by index too
    assert (started["state"], started["address"]) == ("running", f"{host}:{port}")
    raw_client(server).connect("back")
    assert get(server, "/health").status == 200
    assert "running" in error(api(server, "listener/start", key, address="0"), 400)
    assert error(api(server, "listener/stop", key, address="10.9.9.9:1"), 404)
    assert "address" in error(api(server, "listener/stop", key), 400)


def test_listener_from_the_command_line(keyed_broker, raw_client, tmp_path):
    server, key = keyed_broker()
    dropped = raw_client(server, V5)
    dropped.connect("dropped")
    stop = admin(server, "listener", "stop", "0", "--kill-sessions", key=key, cwd=tmp_path)
    assert stop.returncode == 0, stop.stderr
    assert "stopped" in stop.stdout
    (packet,) = dropped.expect_closed()  # --kill-sessions: its connections go too
    assert (packet.type, packet.reason_code) == (DISCONNECT, ADMINISTRATIVE_ACTION)
    start = admin(server, "listener", "start", "0", key=key, cwd=tmp_path)
    assert "running" in start.stdout
    which = admin(server, "listener", "stop", key=key, cwd=tmp_path)
    assert which.returncode == 2 and "ADDRESS" in which.stderr


def test_setting_allow_anonymous_with_an_auth_plugin_says_what_it_switches_off(
    keyed_broker, caplog
):
    secret = "a-secret-of-more-than-thirty-two-bytes-for-hs256"
    jwt = {"auth_jwt": {"enabled": True, "secret": secret, "algorithms": ["HS256"]}}
    server, key = keyed_broker(broker={"allow_anonymous": False}, plugins=jwt)
    caplog.set_level(logging.WARNING, logger="nautilus")
    table(api(server, "set", key, allow_anonymous="true"))
    said = [r.getMessage() for r in caplog.records if "switches off" in r.getMessage()]
    assert len(said) == 1 and "plugins.auth_jwt" in said[0]
    caplog.clear()
    table(api(server, "set", key, allow_anonymous="false"))
    assert not [r for r in caplog.records if "switches off" in r.getMessage()]
