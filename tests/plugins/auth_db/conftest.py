"""Fixtures of the auth_db tests: real PostgreSQL, MariaDB and Redis servers on 127.0.0.1
(testing/databases.py, testing/redis_server.py).

`postgres` and `mariadb` are the session's servers with `vmq_auth_acl` emptied before
the test; a test that stops, restarts, kills or pauses its database takes `own_postgres`
or `own_mariadb` instead. The Redis fixtures (`redis_server`, `redis_url`, `own_redis`)
are those of tests/cluster, imported so that they are fixtures here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.databases import MariaDbServer, PostgresServer
from tests.cluster.conftest import own_redis, redis_server, redis_url

__all__ = ["own_redis", "redis_server", "redis_url"]  # fixtures, used by name


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session (tests share it through `postgres`)."""
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDbServer]:
    """One MariaDB server for the whole session (tests share it through `mariadb`)."""
    server = MariaDbServer(tmp_path_factory.mktemp("mariadb"))
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> PostgresServer:
    """The session's PostgreSQL server, with no rows in vmq_auth_acl."""
    postgres_server.sql("DELETE FROM vmq_auth_acl")
    return postgres_server


@pytest.fixture
def mariadb(mariadb_server: MariaDbServer) -> MariaDbServer:
    """The session's MariaDB server, with no rows in vmq_auth_acl."""
    mariadb_server.sql("DELETE FROM vmq_auth_acl")
    return mariadb_server


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, which it may stop, restart, kill or pause."""
    server = PostgresServer(tmp_path / "postgres")
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def own_mariadb(tmp_path: Path) -> Iterator[MariaDbServer]:
    """A MariaDB server of this test's own, which it may stop, restart, kill or pause."""
    server = MariaDbServer(tmp_path / "mariadb")
    try:
        yield server.start()
    finally:
        server.close()
