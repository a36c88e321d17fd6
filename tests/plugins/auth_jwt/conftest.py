"""Fixtures for the auth_jwt tests: paho and raw clients, a JWKS server, key files."""

from __future__ import annotations

import pytest

from tests.broker.helpers import paho_client, raw_client
from tests.plugins.auth_jwt.helpers import JwtPahoClient
from tests.plugins.auth_jwt.jwks_server import JwksServer

__all__ = ["jwks", "jwt_paho", "paho_client", "raw_client"]


@pytest.fixture
def jwks():
    server = JwksServer().start()
    yield server
    server.stop()


@pytest.fixture
def jwt_paho():
    """jwt_paho(server, version, username, token, expect_code=0) -> connected client."""
    made: list[JwtPahoClient] = []

    def make(server, version, username, token, *, expect_code: int | None = 0):
        client = JwtPahoClient(server.host, server.port, version, username, token)
        made.append(client)
        client.result = client.connect(expect_code=expect_code)
        return client

    yield make
    for client in made:
        client.close()
