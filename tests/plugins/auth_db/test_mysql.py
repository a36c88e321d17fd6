"""auth_db's MySQL backend in a real broker against a real MariaDB (started by the tests,
testing/databases.py), with real clients (paho-mqtt v3.1.1 and v5).

The rows are VerneMQ's documented ones (vmq_diversity's mysql.lua): ACLs as JSON text,
passwords hashed by the database (PASSWORD(), MD5(), SHA1(), SHA2()) or bcrypt, which
the broker checks. The ACL logic itself is the Postgres tests' (test_end_to_end.py).
"""

from __future__ import annotations

import json
import time

import bcrypt
import pytest

from broker.config import ConfigError
from broker.plugins import load_plugins
from tests.broker.helpers import V5, V311, VERSIONS
from tests.plugins.auth_db.test_end_to_end import (
    ACL,
    NOT_AUTHORIZED,
    SERVER_UNAVAILABLE,
    allowed,
    broker_with,
    login,
    plugin_of,
)

__all__ = ["login"]  # a fixture, used by name


def my_row(server, client_id, username, stored, publish=ACL, subscribe=ACL):
    """A row as mysql.lua documents it; `stored` is SQL: `PASSWORD('secret')`, a quoted
    hash, or NULL."""
    server.sql(
        "INSERT INTO vmq_auth_acl (mountpoint, client_id, username, password, publish_acl,"
        f" subscribe_acl) VALUES ('', '{client_id}', '{username}', {stored},"
        f" '{publish}', '{subscribe}')"
    )


def my_set_acls(server, client_id, username, publish, subscribe=ACL):
    server.sql(
        f"UPDATE vmq_auth_acl SET publish_acl = '{publish}', subscribe_acl = '{subscribe}'"
        f" WHERE client_id = '{client_id}' AND username = '{username}'"
    )


@pytest.fixture
def my_broker(start_broker, mariadb):
    """VerneMQ's default method for MySQL: PASSWORD()."""
    return broker_with(start_broker, backend="mysql", url=mariadb.url)


@pytest.mark.parametrize("version", VERSIONS)
def test_mysql_password_right_and_wrong(my_broker, mariadb, login, version):
    my_row(mariadb, "dev-1", "ann", "PASSWORD('secret')")
    client = login(my_broker, version, "dev-1", "ann", "secret")
    assert client.subscribe("ann/dev-1/#", 1) == [1]
    assert allowed(client, "ann/dev-1/temp")
    # A wrong password, another client id, an unknown user: no row, the chain refuses.
    login(my_broker, version, "dev-1", "ann", "Secret", expect_code=NOT_AUTHORIZED)
    login(my_broker, version, "dev-2", "ann", "secret", expect_code=NOT_AUTHORIZED)
    login(my_broker, version, "dev-1", "bob", "secret", expect_code=NOT_AUTHORIZED)


@pytest.mark.parametrize(
    ("method", "stored"),
    [("sha256", "SHA2('secret', 256)"), ("md5", "MD5('secret')"), ("sha1", "SHA1('secret')")],
)
def test_mysql_hash_methods_compared_by_the_database(start_broker, mariadb, login, method, stored):
    my_row(mariadb, "dev-1", "ann", stored)
    my_row(mariadb, "dev-2", "ann", "PASSWORD('secret')")  # made for another method
    server = broker_with(start_broker, backend="mysql", url=mariadb.url, password_hash=method)
    login(server, V5, "dev-1", "ann", "secret")
    login(server, V5, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)
    login(server, V5, "dev-2", "ann", "secret", expect_code=NOT_AUTHORIZED)


@pytest.mark.parametrize("prefix", ["$2a$", "$2b$", "$2y$"])
def test_mysql_bcrypt_hashes_checked_by_the_broker(start_broker, mariadb, login, prefix):
    hashed = prefix + bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()[4:]
    my_row(mariadb, "dev-1", "ann", f"'{hashed}'")
    my_row(mariadb, "dev-2", "ann", "NULL")  # no hash: never matches
    server = broker_with(start_broker, backend="mysql", url=mariadb.url, password_hash="bcrypt")
    login(server, V311, "dev-1", "ann", "secret")
    login(server, V311, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)
    login(server, V311, "dev-2", "ann", "secret", expect_code=NOT_AUTHORIZED)


def test_mysql_default_row_serves_any_client_id(my_broker, mariadb, login):
    my_row(mariadb, "*", "fleet", "PASSWORD('shared')")
    my_row(mariadb, "truck-1", "fleet", "PASSWORD('own')", ACL, json.dumps([{"pattern": "a/#"}]))
    client = login(my_broker, V5, "truck-9", "fleet", "shared")
    assert client.subscribe("fleet/truck-9/#", 1) == [1]  # %c is the client's own id
    assert allowed(client, "fleet/truck-9/gps")
    assert client.subscribe("fleet/truck-8/#", 1) == [NOT_AUTHORIZED]
    # Both rows match truck-1 with its own password: its own row (and ACLs) wins.
    own = login(my_broker, V5, "truck-1", "fleet", "own")
    assert own.subscribe("fleet/truck-1/#", 1) == [NOT_AUTHORIZED]


def test_mysql_acl_limits_applied(my_broker, mariadb, login):
    publish = json.dumps(
        [
            {"pattern": "a/marker"},
            {"pattern": "small/#", "max_payload_size": 5},
            {"pattern": "m/in", "modifiers": {"topic": "m/out"}},
        ]
    )
    subscribe = json.dumps([{"pattern": "#", "max_qos": 1}])
    my_row(mariadb, "dev-1", "ann", "PASSWORD('secret')", publish, subscribe)
    client = login(my_broker, V5, "dev-1", "ann", "secret")
    assert client.subscribe([("small/#", 1), ("x/#", 2)]) == [1, NOT_AUTHORIZED]
    assert client.subscribe([("a/#", 1), ("m/#", 1)]) == [1, 1]
    assert allowed(client, "small/a", b"12345", subscribe=False)
    assert not allowed(client, "small/b", b"123456", subscribe=False)  # over max_payload_size
    client.publish("m/in", b"moved", qos=1)
    assert client.expect_message().topic == "m/out"


def test_an_acl_changed_with_update_applies_on_invalidate(my_broker, mariadb, login):
    my_row(mariadb, "dev-1", "ann", "PASSWORD('secret')")
    client = login(my_broker, V5, "dev-1", "ann", "secret")
    assert client.subscribe([("a/#", 1), ("b/#", 1)]) == [1, NOT_AUTHORIZED]
    wider = json.dumps([{"pattern": "a/#"}, {"pattern": "b/#"}])
    my_set_acls(mariadb, "dev-1", "ann", wider, wider)
    assert client.subscribe("b/#", 1) == [NOT_AUTHORIZED]  # the connection's ACLs: old
    assert my_broker.call(plugin_of(my_broker).invalidate, "dev-1") == 1
    assert client.subscribe("b/#", 1) == [1]
    assert allowed(client, "b/1")


@pytest.mark.parametrize("version", [V311, V5])
def test_mysql_down_keeps_connected_clients_and_refuses_new_ones(
    start_broker, own_mariadb, login, version
):
    my_row(own_mariadb, "dev-1", "ann", "PASSWORD('secret')")
    server = broker_with(start_broker, backend="mysql", url=own_mariadb.url, query_timeout=2)
    client = login(server, version, "dev-1", "ann", "secret")
    assert client.subscribe("a/#", 1) == [1]
    own_mariadb.stop()
    assert allowed(client, "a/still")  # decided from the cache
    login(server, version, "dev-2", "ann", "secret", expect_code=SERVER_UNAVAILABLE)
    own_mariadb.start()  # back: connects work again, by themselves
    login(server, version, "dev-1", "ann", "secret")


def test_mysql_down_when_the_broker_starts(start_broker, own_mariadb, login):
    my_row(own_mariadb, "dev-1", "ann", "PASSWORD('secret')")
    own_mariadb.stop()
    server = broker_with(start_broker, backend="mysql", url=own_mariadb.url, query_timeout=2)
    login(server, V5, "dev-1", "ann", "secret", expect_code=SERVER_UNAVAILABLE)
    own_mariadb.start()
    login(server, V5, "dev-1", "ann", "secret")


def test_a_query_over_query_timeout_is_refused_and_its_connection_not_reused(
    start_broker, own_mariadb, login
):
    my_row(own_mariadb, "dev-1", "ann", "PASSWORD('secret')")
    server = broker_with(start_broker, backend="mysql", url=own_mariadb.url, query_timeout=1)
    login(server, V5, "dev-1", "ann", "secret")  # a pooled connection, open
    own_mariadb.pause()  # it accepts, nothing answers
    started = time.monotonic()
    login(server, V5, "dev-1", "ann", "secret", expect_code=SERVER_UNAVAILABLE)
    assert time.monotonic() - started < 3
    own_mariadb.resume()
    # The timed-out query's late answer (a row) must not be read as this one's.
    login(server, V5, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)
    assert plugin_of(server).backend.in_use() == 0


def test_mysql_builds_from_a_url_without_a_port():
    [(_, plugin)] = load_plugins(
        {"auth_db": {"enabled": True, "backend": "mysql", "url": "mysql://u:p%40ss@db.example/x"}}
    )
    assert plugin.backend.connect_args == {
        "host": "db.example",
        "port": 3306,
        "user": "u",
        "password": "p@ss",
        "database": "x",
    }


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://root:password@localhost:5432/vernemq_db", "expected mysql://"),
        ("mysql://root:password@localhost:3306", "expected mysql://"),
        ("mysql://root:password@localhost:3306/vernemq_db?ssl=true", "expected mysql://"),
        ("mysql://root:password@localhost:99999/vernemq_db", "Port out of range"),
    ],
)
def test_a_bad_url_names_the_key(url, message):
    with pytest.raises(ConfigError, match=f"plugins.auth_db.url: .*{message}"):
        load_plugins({"auth_db": {"enabled": True, "backend": "mysql", "url": url}})


def test_a_method_mysql_has_not_is_refused():
    with pytest.raises(ConfigError, match="'crypt' is not one of password, md5, sha1, sha256"):
        load_plugins({"auth_db": {"enabled": True, "backend": "mysql", "password_hash": "crypt"}})
