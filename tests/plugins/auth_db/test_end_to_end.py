"""auth_db in a real broker against real databases (PostgreSQL and redis-server started
by the tests, testing/databases.py and testing/redis_server.py), with real clients
(paho-mqtt v3.1.1 and v5; raw sockets where the exact MQTT 3 CONNACK byte matters).

The rows are VerneMQ's documented ones (vmq_diversity's postgres.lua and redis.lua):
passwords hashed by the database (`crypt`) or bcrypt, ACLs as JSON arrays.
"""

from __future__ import annotations

import asyncio
import json

import bcrypt
import pytest
import redis

from plugins.auth_db.redis_backend import key
from tests.broker.helpers import (
    V5,
    V311,
    VERSIONS,
    PahoClient,
    RawClient,
    connect_packet,
    unique_id,
)

NOT_AUTHORIZED, SERVER_UNAVAILABLE = 0x87, 0x88
NOT_AUTHORIZED_V3, SERVER_UNAVAILABLE_V3 = 5, 3
ACL = json.dumps([{"pattern": "a/#"}, {"pattern": "%u/%c/#"}])


def pg_row(server, client_id, username, password, publish=ACL, subscribe=ACL, hashed=None):
    """A row as postgres.lua documents it (crypt with a bcrypt salt), or with `hashed`."""
    stored = f"'{hashed}'" if hashed else f"crypt('{password}', gen_salt('bf'))"
    server.sql(
        "INSERT INTO vmq_auth_acl (mountpoint, client_id, username, password, publish_acl,"
        f" subscribe_acl) VALUES ('', '{client_id}', '{username}', {stored},"
        f" '{publish}', '{subscribe}')"
    )


def pg_set_acls(server, client_id, username, publish, subscribe=ACL):
    server.sql(
        f"UPDATE vmq_auth_acl SET publish_acl = '{publish}', subscribe_acl = '{subscribe}'"
        f" WHERE client_id = '{client_id}' AND username = '{username}'"
    )


@pytest.fixture
def login():
    """login(server, version, client_id, username, password, expect_code=0) -> client."""
    made: list[PahoClient] = []

    def connect(server, version, client_id, username, password, expect_code=0):
        client = PahoClient(server.host, server.port, version, client_id=client_id)
        made.append(client)
        client.connect(expect_code=expect_code, username=username, password=password)
        return client

    yield connect
    for client in made:
        client.close()


def broker_with(start_broker, **auth_db):
    return start_broker(
        broker={"allow_anonymous": False},
        plugins={"auth_db": {"enabled": True, **auth_db}},
    )


def plugin_of(server):
    return dict(server.broker.plugins)["auth_db"]


def allowed(client, topic: str, payload: bytes = b"probe", subscribe: bool = True) -> bool:
    """Whether a QoS 1 PUBLISH to `topic` reaches the client's own subscription to it:
    a refused one is followed by an allowed marker, which must come first. (The client
    subscribes to the topic and the marker: every ACL here allows `a/#`.)"""
    if subscribe:
        assert client.subscribe([(topic, 1), ("a/marker", 1)]) == [1, 1]
    client.publish(topic, payload, qos=1)
    client.publish("a/marker", b"marker", qos=1)
    first = client.expect_message()
    if first.topic == topic:
        assert client.expect_message().topic == "a/marker"
        return True
    assert first.topic == "a/marker"
    return False


@pytest.fixture
def pg_broker(start_broker, postgres):
    return broker_with(start_broker, backend="postgres", url=postgres.url)


@pytest.mark.parametrize("version", VERSIONS)
def test_postgres_right_and_wrong_passwords(pg_broker, postgres, login, version):
    pg_row(postgres, "dev-1", "ann", "secret")
    client = login(pg_broker, version, "dev-1", "ann", "secret")
    assert client.subscribe("ann/dev-1/#", 1) == [1]
    assert allowed(client, "ann/dev-1/temp")
    # A wrong password, another client id, an unknown user: no row, the chain refuses.
    login(pg_broker, version, "dev-1", "ann", "Secret", expect_code=NOT_AUTHORIZED)
    login(pg_broker, version, "dev-2", "ann", "secret", expect_code=NOT_AUTHORIZED)
    login(pg_broker, version, "dev-1", "bob", "secret", expect_code=NOT_AUTHORIZED)


def test_postgres_default_row_serves_any_client_id(pg_broker, postgres, login):
    pg_row(postgres, "*", "fleet", "shared")
    client = login(pg_broker, V5, "truck-9", "fleet", "shared")
    assert client.subscribe("fleet/truck-9/#", 1) == [1]  # %c is the client's own id
    assert allowed(client, "fleet/truck-9/gps")
    assert client.subscribe("fleet/truck-8/#", 1) == [NOT_AUTHORIZED]


def test_postgres_acl_limits_and_modifiers(pg_broker, postgres, login):
    publish = json.dumps(
        [
            {"pattern": "a/marker"},
            {"pattern": "q/#", "max_qos": 0},
            {"pattern": "small/#", "max_payload_size": 5},
            {"pattern": "r/#", "allowed_retain": False},
            {"pattern": "m/in", "modifiers": {"topic": "m/out"}},
        ]
    )
    subscribe = json.dumps([{"pattern": "#", "max_qos": 1}])
    pg_row(postgres, "dev-1", "ann", "secret", publish, subscribe)
    client = login(pg_broker, V5, "dev-1", "ann", "secret")
    # Per filter: QoS 2 over max_qos is refused, the others are granted.
    assert client.subscribe([("q/#", 1), ("x/#", 2)]) == [1, NOT_AUTHORIZED]
    assert client.subscribe([("a/#", 1), ("small/#", 1), ("r/#", 1), ("m/#", 1)]) == [1, 1, 1, 1]
    assert not allowed(client, "q/a")  # QoS 1 over max_qos 0
    assert allowed(client, "small/a", b"12345")
    assert not allowed(client, "small/b", b"123456")  # over max_payload_size
    client.publish("r/a", b"kept", qos=1, retain=True)
    client.publish("a/marker", b"marker", qos=1)
    assert client.expect_message().topic == "a/marker"  # the retained one was refused
    client.publish("m/in", b"moved", qos=1)
    assert client.expect_message().topic == "m/out"


@pytest.mark.parametrize("prefix", ["$2a$", "$2b$", "$2y$"])
def test_postgres_bcrypt_hashes_checked_by_the_broker(start_broker, postgres, login, prefix):
    hashed = prefix + bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()[4:]
    pg_row(postgres, "dev-1", "ann", None, hashed=hashed)
    server = broker_with(start_broker, backend="postgres", url=postgres.url, password_hash="bcrypt")
    login(server, V311, "dev-1", "ann", "secret")
    login(server, V311, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)


def test_an_acl_changed_in_the_database_applies_on_invalidate(pg_broker, postgres, login):
    pg_row(postgres, "dev-1", "ann", "secret")
    client = login(pg_broker, V5, "dev-1", "ann", "secret")
    assert client.subscribe([("a/#", 1), ("b/#", 1)]) == [1, NOT_AUTHORIZED]
    wider = json.dumps([{"pattern": "a/#"}, {"pattern": "b/#"}])
    pg_set_acls(postgres, "dev-1", "ann", wider, wider)
    assert client.subscribe("b/#", 1) == [NOT_AUTHORIZED]  # the connection's ACLs: old
    assert pg_broker.call(plugin_of(pg_broker).invalidate, "dev-1") == 1
    assert client.subscribe("b/#", 1) == [1]
    assert allowed(client, "b/1")
    pg_set_acls(postgres, "dev-1", "ann", ACL, ACL)  # narrowed again, for a username
    assert pg_broker.call(plugin_of(pg_broker).invalidate, None, "ann") == 1
    assert not allowed(client, "b/2", subscribe=False)  # its b/# stays; the PUBLISH: refused


def test_cache_ttl_rereads_the_acls(start_broker, postgres, login):
    pg_row(postgres, "dev-1", "ann", "secret")
    server = broker_with(start_broker, backend="postgres", url=postgres.url, cache_ttl=1)
    client = login(server, V5, "dev-1", "ann", "secret")
    plugin = plugin_of(server)
    wider = json.dumps([{"pattern": "a/#"}, {"pattern": "b/#"}, {"pattern": "c/#"}])
    pg_set_acls(postgres, "dev-1", "ann", wider, wider)
    # The background re-read (at most ttl + 1 s later): the entry gets the new ACLs.
    server.wait_for(lambda: len(plugin.cache.get(("", "dev-1")).acls.subscribe) == 3)
    assert client.subscribe("b/#", 1) == [1]


def test_re_read_acls_apply_to_the_next_publish(start_broker, postgres, login):
    """A publish decision is kept by the broker (cache_for) until the ACLs are re-read
    (here by cache_ttl): the next PUBLISH after that is decided by the new ones."""
    wider = json.dumps([{"pattern": "a/#"}, {"pattern": "b/#"}, {"pattern": "c/#"}])
    pg_row(postgres, "dev-1", "ann", "secret", wider, wider)
    server = broker_with(start_broker, backend="postgres", url=postgres.url, cache_ttl=1)
    client = login(server, V5, "dev-1", "ann", "secret")
    assert allowed(client, "b/1") and allowed(client, "b/1", subscribe=False)  # kept
    plugin = plugin_of(server)
    pg_set_acls(postgres, "dev-1", "ann", ACL, wider)
    server.wait_for(lambda: len(plugin.cache.get(("", "dev-1")).acls.publish) == 2)
    assert not allowed(client, "b/1", subscribe=False)


@pytest.mark.parametrize("version", [V311, V5])
def test_postgres_down_keeps_connected_clients_and_refuses_new_ones_clearly(
    start_broker, own_postgres, login, version
):
    pg_row(own_postgres, "dev-1", "ann", "secret")
    server = broker_with(start_broker, backend="postgres", url=own_postgres.url, query_timeout=2)
    client = login(server, version, "dev-1", "ann", "secret")
    assert client.subscribe("a/#", 1) == [1]
    own_postgres.stop()
    assert allowed(client, "a/still")  # decided from the cache
    login(server, version, "dev-2", "ann", "secret", expect_code=SERVER_UNAVAILABLE)
    if version == V311:  # the exact MQTT 3 byte: 3, server unavailable
        raw = RawClient(server.host, server.port, V311)
        try:
            connack = raw.connect(unique_id(), username="ann", password=b"secret", expect_code=None)
            assert connack.body == bytes([0, SERVER_UNAVAILABLE_V3])
        finally:
            raw.close()
    own_postgres.start()  # back: connects work again, by themselves
    login(server, version, "dev-1", "ann", "secret")


def test_redis_keys_as_vernemq_writes_them(start_broker, redis_url, login):
    store = redis.Redis.from_url(redis_url)
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
    acl = [{"pattern": "a/#"}, {"pattern": "%u/%c/#"}]
    entry = {"passhash": hashed, "publish_acl": acl, "subscribe_acl": acl}
    store.set('["","dev-1","ann"]', json.dumps(entry))  # VerneMQ's key, byte for byte
    store.set(key("", "*", "fleet"), json.dumps(entry))
    server = broker_with(start_broker, backend="redis", url=redis_url)
    client = login(server, V5, "dev-1", "ann", "secret")
    assert client.subscribe([("ann/dev-1/#", 1), ("bob/#", 1)]) == [1, NOT_AUTHORIZED]
    assert allowed(client, "ann/dev-1/x")
    login(server, V5, "truck-1", "fleet", "secret")  # the default entry
    login(server, V5, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)
    store.close()


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_a_thousand_concurrent_connects_on_a_pool_of_five_are_all_answered(
    start_broker, request, backend
):
    if backend == "postgres":
        postgres = request.getfixturevalue("postgres")
        pg_row(postgres, "*", "fleet", "shared")
        url = postgres.url
    else:
        url = request.getfixturevalue("redis_url")
        hashed = bcrypt.hashpw(b"shared", bcrypt.gensalt(4)).decode()
        entry = {"passhash": hashed, "publish_acl": [], "subscribe_acl": []}
        with redis.Redis.from_url(url) as store:
            store.set(key("", "*", "fleet"), json.dumps(entry))
    server = broker_with(start_broker, backend=backend, url=url, pool_size=5)
    count = 1000

    async def connect(i: int) -> int:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        try:
            right = i % 10 != 0  # one in ten with a wrong password
            password = b"shared" if right else b"wrong"
            writer.write(connect_packet(f"dev-{i}", username="fleet", password=password))
            connack = await reader.readexactly(4)  # 0x20 0x02 flags code
            return connack[3] if right else -connack[3]
        finally:
            writer.close()

    async def all_of_them() -> list[int]:
        return await asyncio.gather(*(connect(i) for i in range(count)))

    codes = asyncio.run(asyncio.wait_for(all_of_them(), 60))
    assert codes.count(0) == count * 9 // 10  # every right password let in
    assert codes.count(-NOT_AUTHORIZED_V3) == count // 10  # every wrong one refused
    plugin = plugin_of(server)
    assert server.call(lambda: plugin.counts["errors"]) == 0  # none timed out


def test_a_schema_of_your_own_with_custom_queries(start_broker, postgres, login):
    postgres.sql(
        "CREATE TABLE IF NOT EXISTS devices (login text, device text, secret text, rules json);"
        " DELETE FROM devices;"
        " INSERT INTO devices VALUES ('ann', 'dev-1', crypt('secret', gen_salt('bf')),"
        """ '[{"pattern": "a/#"}, {"pattern": "own/%c/#"}]');"""
        " GRANT ALL ON devices TO root"
    )
    queries = {
        "auth_on_register": (
            "SELECT device AS client_id, rules::TEXT AS publish_acl, rules::TEXT AS"
            " subscribe_acl FROM devices WHERE login = :username AND device = :client_id"
            " AND secret = crypt(:password, secret)"
        ),
        "acls": (
            "SELECT device AS client_id, rules::TEXT AS publish_acl, rules::TEXT AS"
            " subscribe_acl FROM devices WHERE login = :username AND device = :client_id"
        ),
    }
    server = broker_with(start_broker, backend="postgres", url=postgres.url, query=queries)
    client = login(server, V5, "dev-1", "ann", "secret")
    assert client.subscribe([("own/dev-1/#", 1), ("own/dev-2/#", 1)]) == [1, NOT_AUTHORIZED]
    assert allowed(client, "own/dev-1/x")
    login(server, V5, "dev-1", "ann", "wrong", expect_code=NOT_AUTHORIZED)
    assert server.call(plugin_of(server).invalidate, "dev-1") == 1  # through `acls`


def test_a_custom_query_that_compares_no_password_is_refused_at_start(start_broker):
    from broker.config import ConfigError
    from broker.plugins import load_plugins

    table = {"query": {"auth_on_register": "SELECT * FROM t WHERE u = :username"}}
    with pytest.raises(ConfigError, match="compares no :password, so any password would do"):
        load_plugins({"auth_db": {"enabled": True, **table}})


def test_with_bcrypt_a_row_without_a_password_lets_nobody_in(start_broker, postgres, login):
    postgres.sql(
        "INSERT INTO vmq_auth_acl VALUES ('', 'dev-1', 'ann', NULL, '[]', '[]'),"
        " ('', '*', 'ann', NULL, '[]', '[]')"
    )
    server = broker_with(start_broker, backend="postgres", url=postgres.url, password_hash="bcrypt")
    login(server, V311, "dev-1", "ann", "anything", expect_code=NOT_AUTHORIZED)
    login(server, V311, "dev-2", "ann", "", expect_code=NOT_AUTHORIZED)
