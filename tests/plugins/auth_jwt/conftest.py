"""Fixtures for the auth_jwt tests: paho and raw clients, a JWKS server, key files."""

from __future__ import annotations

import pytest

from tests.broker.helpers import PahoClient, paho_client, raw_client
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
    made: list[PahoClient] = []

    def make(server, version, username, token, *, expect_code: int | None = 0):
        client = PahoClient(server.host, server.port, version)
        made.append(client)
        client.result = client.connect(
            expect_code=expect_code, username=username, password=token if username else None
        )
        return client

    yield make
    for client in made:
        client.close()
