"""Session queries (VerneMQ's vmq_ql: `session show`, `session disconnect`, `session
unsubscribe`) through the admin API and `nautilus admin`, against a real broker holding
known sessions of real MQTT clients: field selection, `=`, `=~`, one row per
subscription, the limit, JSON, and the errors that name the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.broker.helpers import DISCONNECT, SESSION_EXPIRY_INTERVAL, V5, V311, RawClient

from .conftest import api, error, table
from .test_commands import admin

ADMINISTRATIVE_ACTION = 0x98


@pytest.fixture
def fleet(keyed_broker, raw_client) -> tuple[Any, str, dict[str, RawClient]]:
    """A broker with three known sessions: alpha (MQTT 5, user ann, two subscriptions),
    beta (3.1.1, user bob, one), gone (offline, persistent, one)."""
    server, key = keyed_broker()
    gone = raw_client(server)
    gone.connect("gone", clean=False)
    gone.subscribe(("c/1", 1))
    gone.disconnect()
    alpha = raw_client(server, V5)
    alpha.connect("alpha", username="ann", properties={SESSION_EXPIRY_INTERVAL: 60})
    assert alpha.subscribe(("a/#", 1 | 4), ("b/+", 0)) == [1, 0]  # a/#: no local
    beta = raw_client(server, V311)
    beta.connect("beta", username="bob")
    assert beta.subscribe(("a/x", 2)) == [2]
    return server, key, {"alpha": alpha, "beta": beta}


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["client_id"] for row in rows]


def test_show_selects_fields_and_filters_with_each_operator(fleet):
    server, key, _ = fleet
    every = table(api(server, "session/show", key))
    assert ids(every) == ["alpha", "beta", "gone"]
    assert every[0]["user"] == "ann" and every[0]["protocol"] == 5
    assert (every[0]["num_sessions"], every[0]["num_subscriptions"]) == (1, 2)
    assert every[2]["is_offline"] and every[2]["session_started_at"] is None
    assert isinstance(every[1]["session_started_at"], int)

    # --FIELD: only those, in that order.
    picked = table(api(server, "session/show", key, **{"--user": "", "--client_id": ""}))
    assert picked == [
        {"user": "ann", "client_id": "alpha"},
        {"user": "bob", "client_id": "beta"},
        {"user": None, "client_id": "gone"},
    ]
    # --FIELD=VALUE, typed: text, true/false, numbers.
    assert ids(table(api(server, "session/show", key, user="bob"))) == ["beta"]
    assert ids(table(api(server, "session/show", key, is_online="false"))) == ["gone"]
    assert ids(table(api(server, "session/show", key, protocol="5"))) == ["alpha"]
    assert ids(table(api(server, "session/show", key, clean_session="true"))) == ["beta"]
    # --FIELD=~REGEX searches; several conditions must all hold.
    assert ids(table(api(server, "session/show", key, client_id="~^(alpha|gone)$"))) == [
        "alpha",
        "gone",
    ]
    both = api(server, "session/show", key, client_id="~a", is_online="true")
    assert ids(table(both)) == ["alpha", "beta"]
    assert table(api(server, "session/show", key, user="~^nobody")) == []


def test_show_gives_a_row_per_subscription_when_asked_for_topic_or_qos(fleet):
    server, key, _ = fleet
    terms = {"--client_id": "", "--topic": "", "--qos": "", "--no_local": ""}
    assert table(api(server, "session/show", key, **terms)) == [
        {"client_id": "alpha", "topic": "a/#", "qos": 1, "no_local": True},
        {"client_id": "alpha", "topic": "b/+", "qos": 0, "no_local": False},
        {"client_id": "beta", "topic": "a/x", "qos": 2, "no_local": False},
        {"client_id": "gone", "topic": "c/1", "qos": 1, "no_local": False},
    ]
    by_topic = api(server, "session/show", key, **{"--client_id": "", "topic": "~^a/"})
    assert table(by_topic) == [{"client_id": "alpha"}, {"client_id": "beta"}]
    assert ids(table(api(server, "session/show", key, qos="2"))) == ["beta"]


def test_show_limit_says_when_it_cut(fleet):
    server, key, _ = fleet
    reply = api(server, "session/show", key, limit="2")
    assert ids(table(reply)) == ["alpha", "beta"]
    assert reply.json["truncated"] is True and reply.json["errors"] == []
    assert "truncated" not in api(server, "session/show", key, limit="3").json


def test_show_errors_name_the_field(fleet):
    server, key, _ = fleet
    assert "'colour'" in error(api(server, "session/show", key, colour="red"), 400)
    assert "'colour'" in error(api(server, "session/show", key, **{"--colour": ""}), 400)
    bad = error(api(server, "session/show", key, client_id="~(unclosed"), 400)
    assert bad.startswith("client_id: bad regular expression '(unclosed'")
    assert error(api(server, "session/show", key, qos="high"), 400).startswith("qos: ")
    assert error(api(server, "session/show", key, is_online="maybe"), 400).startswith("is_online")
    assert "limit" in error(api(server, "session/show", key, limit="0"), 400)


def test_unsubscribe_and_disconnect_by_conditions(fleet):
    server, key, clients = fleet
    one = api(server, "session/unsubscribe", key, client_id="alpha", topic="a/#")
    assert table(one) == [
        {"node": "nautilus", "mountpoint": "", "client_id": "alpha", "topic": "a/#"}
    ]
    every = table(api(server, "session/unsubscribe", key, user="~^(ann|bob)$"))  # no topic: all
    assert [(row["client_id"], row["topic"]) for row in every] == [
        ("alpha", "b/+"),
        ("beta", "a/x"),
    ]
    rows = table(api(server, "session/show", key, **{"--client_id": "", "--num_subscriptions": ""}))
    assert [row["num_subscriptions"] for row in rows] == [0, 0, 1]
    assert error(api(server, "session/unsubscribe", key, client_id="alpha"), 404)

    assert "condition" in error(api(server, "session/disconnect", key), 400)
    gone = table(api(server, "session/disconnect", key, user="~.", protocol="5"))
    assert [(row["client_id"], row["disconnected"]) for row in gone] == [("alpha", True)]
    (packet,) = clients["alpha"].expect_closed()
    assert (packet.type, packet.reason_code) == (DISCONNECT, ADMINISTRATIVE_ACTION)
    assert clients["beta"].is_open(0.2)
    # Offline sessions need --cleanup (then they go).
    assert error(api(server, "session/disconnect", key, is_online="false"), 404)
    deleted = api(server, "session/disconnect", key, client_id="gone", cleanup="true")
    assert [(row["client_id"], row["deleted"]) for row in table(deleted)] == [("gone", True)]
    assert ids(table(api(server, "session/show", key))) == ["alpha", "beta"]


def test_the_command_prints_verneMQs_columns_or_the_asked_ones_or_json(fleet, tmp_path):
    server, key, _ = fleet
    shown = admin(server, "session", "show", key=key, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header, *lines = shown.stdout.splitlines()
    assert header.split() == [
        "client_id",
        "is_online",
        "mountpoint",
        "peer_host",
        "peer_port",
        "user",
    ]
    assert [line.split()[:2] for line in lines] == [
        ["alpha", "True"],
        ["beta", "True"],
        ["gone", "False"],
    ]

    asked = admin(
        server, "session", "show", "--client_id", "--topic", "--topic=~^a/", "--limit", "1",
        "--json", key=key, cwd=tmp_path,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert answer["table"] == [{"client_id": "alpha", "topic": "a/#"}]
    assert "more rows matched" in asked.stderr

    bad = admin(server, "session", "show", "--qos=x", key=key, cwd=tmp_path)
    assert bad.returncode == 1 and "qos: expected a number" in bad.stderr
    word = admin(server, "session", "show", "client_id", key=key, cwd=tmp_path)
    assert word.returncode == 2 and "--FIELD" in word.stderr


def test_the_command_disconnects_and_unsubscribes(fleet, tmp_path):
    server, key, _ = fleet
    removed = admin(server, "session", "unsubscribe", "--topic=~^a/", key=key, cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    # node, mountpoint (the default one: blank), client_id, topic
    assert [line.split() for line in removed.stdout.splitlines()[1:]] == [
        ["nautilus", "alpha", "a/#"],
        ["nautilus", "beta", "a/x"],
    ]
    gone = admin(
        server, "session", "disconnect", "--client_id=gone", "--cleanup", key=key, cwd=tmp_path
    )
    assert gone.returncode == 0, gone.stderr

    def listed(*args: str) -> list[str]:
        shown = admin(server, "--json", "sessions", *args, key=key, cwd=tmp_path)
        return ids(json.loads(shown.stdout)["table"])

    assert listed() == ["alpha", "beta"]  # gone is gone
    # `sessions --client-id TEXT` still finds the ids containing TEXT, taken as it is
    # (not as a regular expression).
    assert listed("--client-id", "lph") == ["alpha"]
    assert listed("--client-id", ".") == []
