"""A database that hangs (SIGSTOP: its connections stay open, the kernel still accepts
new ones, nothing answers) is answered within query_timeout on every path, for each
backend: a CONNECT on the pooled connection, a CONNECT that needs a new connection or
waits for one, and the re-read of a client's ACLs; and the broker recovers by itself
once the database answers again (SIGCONT).

On PostgreSQL a CONNECT on the pooled connection took twice query_timeout: asyncpg's
query timeout, then its wait to let go of the connection (the cancel request and reset),
bounded by the same timeout again.
"""

from __future__ import annotations

import json
import time
from typing import Any

import bcrypt
import pytest
import redis

from plugins.auth_db.backends import DatabaseError
from plugins.auth_db.redis_backend import key
from tests.broker.helpers import V5, V311
from tests.plugins.auth_db.test_end_to_end import (
    SERVER_UNAVAILABLE,
    broker_with,
    login,
    pg_row,
    plugin_of,
)
from tests.plugins.auth_db.test_mysql import my_row

__all__ = ["login"]  # a fixture, used by name

QUERY_TIMEOUT = 2  # seconds (a Duration: whole seconds, or "2s")
MARGIN = 0.75  # for the client's side of it, on a busy machine


def database_with_ann(request: pytest.FixtureRequest, backend: str) -> Any:
    """This test's own server of `backend`, with user ann's default row (`*`: any client
    id of hers), password secret."""
    if backend == "postgres":
        server = request.getfixturevalue("own_postgres")
        pg_row(server, "*", "ann", "secret")
    elif backend == "mysql":
        server = request.getfixturevalue("own_mariadb")
        my_row(server, "*", "ann", "PASSWORD('secret')")
    else:
        server = request.getfixturevalue("own_redis")
        hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
        entry = {"passhash": hashed, "publish_acl": [], "subscribe_acl": []}
        with redis.Redis.from_url(server.url) as store:
            store.set(key("", "*", "ann"), json.dumps(entry))
    return server


@pytest.mark.parametrize("backend", ["postgres", "mysql", "redis"])
def test_a_hung_database_is_answered_within_query_timeout(start_broker, request, login, backend):
    database = database_with_ann(request, backend)
    server = broker_with(
        start_broker, backend=backend, url=database.url, query_timeout=QUERY_TIMEOUT, pool_size=2
    )
    login(server, V5, "dev-1", "ann", "secret")  # the pool has a connection, open and idle
    plugin = plugin_of(server)
    database.pause()
    try:
        # The pooled connection; then a new one (the first is still being let go of);
        # then none left (pool_size 2): each waits query_timeout at most.
        for client_id, version in [("dev-2", V5), ("dev-3", V311), ("dev-4", V5)]:
            started = time.monotonic()
            login(server, version, client_id, "ann", "secret", expect_code=SERVER_UNAVAILABLE)
            assert time.monotonic() - started < QUERY_TIMEOUT + MARGIN, client_id
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="did not answer in 2 s"):
            server.call(plugin.invalidate, "dev-1")  # `nautilus admin auth invalidate`
        assert time.monotonic() - started < QUERY_TIMEOUT + MARGIN
    finally:
        database.resume()
    login(server, V5, "dev-5", "ann", "secret")  # by itself, nothing restarted
    assert server.call(plugin.invalidate, "dev-1") == 1
