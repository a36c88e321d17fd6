"""Brokers with auth_jwt enabled, and clients that send a token as their password."""

from __future__ import annotations

from typing import Any

from tests.broker.helpers import V5, RawClient, unique_id
from tests.plugins.auth_jwt.recorder import Recorder

RECORDER = {"enabled": True, "module": "tests.plugins.auth_jwt.recorder:Recorder"}
ALLOW_ALL = {"enabled": True, "module": "tests.plugins.auth_jwt.recorder:AllowAll"}

# CONNACK codes on the wire, per protocol version.
BAD_CREDENTIALS = {4: 4, 5: 0x86}
NOT_AUTHORIZED = {4: 5, 5: 0x87}
SERVER_UNAVAILABLE = {4: 3, 5: 0x88}


def jwt_sections(after: dict[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """start_broker() arguments: anonymous access off, auth_jwt with `keys`, then the
    plugins in `after`, then a Recorder."""
    plugins: dict[str, Any] = {"auth_jwt": {"enabled": True, **keys}, **(after or {})}
    plugins["recorder"] = RECORDER
    return {"broker": {"allow_anonymous": False}, "plugins": plugins}


def plugin_of(server: Any, name: str) -> Any:
    return dict(server.broker.plugins)[name]


def recorder_of(server: Any) -> Recorder:
    return plugin_of(server, "recorder")


def raw_connect(
    server: Any, version: int, username: str | None, password: bytes | str | None
) -> tuple[str, int]:
    """CONNECT over a raw socket; (client id, CONNACK code exactly as on the wire).

    A refused client must get its CONNACK and then see the connection closed."""
    client = RawClient(server.host, server.port, version)
    client_id = unique_id("raw")
    try:
        if isinstance(password, str):
            password = password.encode()
        connack = client.connect(client_id, expect_code=None, username=username, password=password)
        if connack.reason_code:
            assert client.expect_closed() == []
        return client_id, connack.reason_code
    finally:
        client.close()


def paho_code(version: int, wire: int) -> int:
    """paho reports a 3.1.1 CONNACK code as its MQTT 5 equivalent (4 -> 0x86, 5 -> 0x87)."""
    if version == V5:
        return wire
    return {0: 0, 3: 0x88, 4: 0x86, 5: 0x87}[wire]
