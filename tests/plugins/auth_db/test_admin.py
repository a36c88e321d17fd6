"""`nautilus admin auth invalidate` and `/api/v1/auth/invalidate` over a real broker with
auth_db on a real PostgreSQL, and the plugin's figures on /metrics."""

from __future__ import annotations

import json

from tests.http.conftest import api, error, keyed_broker, keys_file, scrape, table
from tests.http.test_commands import admin
from tests.plugins.auth_db.test_end_to_end import ACL, NOT_AUTHORIZED, login, pg_row, pg_set_acls

__all__ = ["keyed_broker", "keys_file", "login"]  # fixtures, used by name

WIDER = json.dumps([{"pattern": "a/#"}, {"pattern": "b/#"}])


def auth_db_broker(keyed_broker, postgres):
    return keyed_broker(
        broker={"allow_anonymous": False},
        plugins={"auth_db": {"enabled": True, "backend": "postgres", "url": postgres.url}},
    )


def test_the_command_applies_a_changed_acl_to_connected_clients(
    keyed_broker, postgres, login, tmp_path
):
    pg_row(postgres, "dev-1", "ann", "secret")
    pg_row(postgres, "dev-2", "ann", "secret")
    server, key = auth_db_broker(keyed_broker, postgres)
    one, two = (login(server, 5, cid, "ann", "secret") for cid in ("dev-1", "dev-2"))
    for client_id in ("dev-1", "dev-2"):
        pg_set_acls(postgres, client_id, "ann", WIDER, WIDER)
    assert one.subscribe("b/#", 1) == [NOT_AUTHORIZED]  # still the ACLs it connected with

    done = admin(server, "auth", "invalidate", "--client-id", "dev-1", key=key, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plugin", "clients", "broker", "0", "auth_db", "1"]
    assert one.subscribe("b/#", 1) == [1]
    assert two.subscribe("b/#", 1) == [NOT_AUTHORIZED]  # not named

    everyone = admin(server, "--json", "auth", "invalidate", "--all", key=key, cwd=tmp_path)
    assert json.loads(everyone.stdout)["table"] == [
        {"plugin": "broker", "clients": 0},
        {"plugin": "auth_db", "clients": 2},
    ]
    assert two.subscribe("b/#", 1) == [1]


def test_the_api_names_whom_and_says_what_is_missing(keyed_broker, postgres, login):
    pg_row(postgres, "dev-1", "ann", "secret", ACL, ACL)
    server, key = auth_db_broker(keyed_broker, postgres)
    login(server, 4, "dev-1", "ann", "secret")
    assert table(api(server, "auth/invalidate", key, username="ann")) == [
        {"plugin": "broker", "clients": 0},
        {"plugin": "auth_db", "clients": 1},
    ]
    assert table(api(server, "auth/invalidate", key, username="bob"))[1]["clients"] == 0
    assert "client_id, username or all=true is required" in error(
        api(server, "auth/invalidate", key), 400
    )
    assert "not with client_id" in error(
        api(server, "auth/invalidate", key, all="true", username="ann"), 400
    )
    figures = scrape(server)
    assert figures("auth_db_cache_entries") == 1
    assert figures("auth_db_queries") == 2  # the CONNECT and the re-read of ann (bob: none)
    assert figures.types["auth_db_pool_in_use"] == "gauge"


def test_without_a_plugin_that_keeps_decisions_only_the_broker_forgets(keyed_broker, tmp_path):
    server, key = keyed_broker()
    answer = admin(server, "auth", "invalidate", "--all", key=key, cwd=tmp_path)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == ["plugin", "clients", "broker", "0"]
