"""Admin commands across a cluster: two `python -m broker` nodes (a, b) sharing the
session's Redis, each asked through its own admin API. A session query, an unsubscribe
and a disconnect asked of one node act on both nodes' sessions and say which node each
row is from; `set` changes a limit on both (a client then sees it on either), a bad key
changes nothing anywhere; a node that does not answer (stopped with SIGSTOP) is an error
beside the other node's rows, not a hung command, and once declared dead it is not asked
but said (the ADMIN frame, docs/clustering.md).
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from broker.cluster.operations import ADMIN_TIMEOUT
from tests.broker.helpers import V5, V311, RawClient
from tests.cluster.nodes import API_KEY, ClusterNode
from tests.cluster.test_cluster import HOST, TIMEOUT, Trio

ADMINISTRATIVE_ACTION = 0x98
IDENTIFIER_REJECTED = 2  # MQTT 3.1.1 CONNACK


def ask(at: ClusterNode, command: str, **query: str) -> tuple[int, dict[str, Any]]:
    """/api/v1/<command> of node `at`: the status and the whole answer (errors too)."""
    url = f"http://{HOST}:{at.http_port}/api/v1/{command}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, method="POST", headers={"x-api-key": API_KEY})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


def rows(at: ClusterNode, command: str, **query: str) -> list[dict[str, Any]]:
    status, answer = ask(at, command, **query)
    assert (status, answer["errors"]) == (200, []), answer
    return answer["table"]


def test_admin_commands_act_on_every_node(tmp_path: Path, redis_url: str) -> None:
    duo = Trio(tmp_path, redis_url)
    try:
        duo.start(names=("a", "b"))
        a, b = duo["a"], duo["b"]
        on_a = duo.client("a", V5, "dev-a", username="ann")
        on_b = duo.client("b", V311, "dev-b", username="ann")
        duo.client("b", V311, "other")
        for client in (on_a, on_b):
            assert client.subscribe("t/#", 1) == [1]

        fields = {"--node": "", "--client_id": "", "--topic": ""}
        assert rows(a, "session/show", user="ann", **fields) == [
            {"node": "a", "client_id": "dev-a", "topic": "t/#"},
            {"node": "b", "client_id": "dev-b", "topic": "t/#"},
        ]
        assert rows(a, "session/show", node="b", **{"--client_id": ""}) == [
            {"client_id": "dev-b"},
            {"client_id": "other"},
        ]
        gone = rows(b, "session/unsubscribe", user="ann", topic="t/#")
        assert [(row["node"], row["client_id"]) for row in gone] == [("b", "dev-b"), ("a", "dev-a")]
        closed = rows(a, "session/disconnect", user="ann")
        assert [(row["node"], row["disconnected"]) for row in closed] == [("a", True), ("b", True)]
        assert on_a.expect_disconnected() == ADMINISTRATIVE_ACTION
        on_b.expect_disconnected()
        assert [row["client_id"] for row in rows(b, "session/show")] == ["other"]

        changed = rows(b, "set", max_client_id_size="5")
        assert [(row["node"], row["value"]) for row in changed] == [("b", 5), ("a", 5)]
        for node in (a, b):  # a client sees the new limit on either node
            client = RawClient(HOST, node.port)
            try:
                client.connect("sixsix", expect_code=IDENTIFIER_REJECTED)
            finally:
                client.close()
        status, refused = ask(a, "set", max_client_id_size="50", nonsense="1")
        assert (status, refused["error"][:10]) == (400, "nonsense: ")
        limits = rows(b, "settings/show")
        assert {
            row["node"]: row["value"]
            for row in limits
            if row["setting"] == "broker.max_client_id_size"
        } == {"a": 5, "b": 5}

        assert b.process is not None
        b.process.proc.send_signal(signal.SIGSTOP)  # b hangs: a answers alone, in time
        try:
            started = time.monotonic()
            status, answer = ask(a, "session/show")
            assert time.monotonic() - started < ADMIN_TIMEOUT + 1
            assert status == 200 and answer["table"] == []
            # Declared dead first (dead_after is shorter here), or the time is up.
            (error,) = answer["errors"]
            said = ("the link to b went down", f"no answer within {ADMIN_TIMEOUT:g} s")
            assert error["node"] == "b" and error["error"] in said, error
            a.wait_line(r"cluster: node b .*: dead")  # then it is not asked, and said so
            _, answer = ask(a, "set", max_client_id_size="6")
            assert answer["errors"] == [{"node": "b", "error": "declared dead: not asked"}]
        finally:
            b.process.proc.send_signal(signal.SIGCONT)
    finally:
        duo.close()
