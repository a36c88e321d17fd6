"""Fixtures of the HTTP tests: a real broker (tests/conftest.py) with its HTTP server on
127.0.0.1 port 0, real MQTT clients (tests/broker/helpers.py), and plain HTTP through
urllib (blocking, on the test thread, while the broker serves on its own loop).

`get(server, path, ...)` answers a `Reply` whatever the status (urllib raises on 4xx /
5xx; that is caught here), so a test asserts on status, headers and body alike.
`keyed_broker(**sections)` starts a broker whose `api_keys_file` holds one key made with
the real ApiKeys (only its SHA-256 in the file), returned with the server.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.http.api_keys import ApiKeys
from tests.broker.helpers import TIMEOUT, paho_client, raw_client
from tests.conftest import BrokerThread

__all__ = ["paho_client", "raw_client"]  # fixtures, used by name


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def base_url(server: BrokerThread) -> str:
    assert server.broker.http is not None and server.broker.http.address is not None
    host, port = server.broker.http.address
    return f"http://{host}:{port}"


def get(
    server: BrokerThread | str,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    data: bytes | None = None,
) -> Reply:
    """One HTTP request to the broker's HTTP server (or to a base URL)."""
    url = (server if isinstance(server, str) else base_url(server)) + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return Reply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Reply(error.code, dict(error.headers), error.read())


def basic(key: str) -> dict[str, str]:
    """The key as the basic-auth username, with an empty password (VerneMQ's way)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


def api(
    server: BrokerThread, command: str, key: str, *, method: str = "GET", **query: str
) -> Reply:
    """/api/v1/<command>?<query> with the key as basic-auth username."""
    return get(server, f"/api/v1/{command}", method=method, headers=basic(key), query=query)


def table(reply: Reply) -> list[dict[str, Any]]:
    """The rows of a successful admin API answer."""
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/json")
    answer = reply.json
    assert answer["type"] == "table", answer
    return answer["table"]


def error(reply: Reply, status: int) -> str:
    """The message of an admin API error answer with this status."""
    assert reply.status == status, (reply.status, reply.body)
    answer = reply.json
    assert answer["type"] == "error", answer
    assert isinstance(answer["error"], str) and answer["error"]
    return answer["error"]


# --------------------------------------------------------------------------- /metrics


@dataclass
class Scrape:
    """/metrics as served (`text`) and as the official parser reads it: family name ->
    labels -> value, and family name -> type. (The parser names a counter's samples
    `<name>_total`; the family keeps the name as served.)"""

    text: str
    values: dict[str, dict[frozenset[tuple[str, str]], float]]
    types: dict[str, str]

    def __call__(self, name: str, node: str = "nautilus", **labels: str) -> float:
        """The sample of `name` with exactly these labels (and the node's)."""
        assert name in self.values, f"{name} not on /metrics: {sorted(self.values)}"
        key = frozenset({"node": node, **labels}.items())
        samples = self.values[name]
        assert key in samples, f"{name}{dict(key)} not on /metrics: {samples}"
        return samples[key]


def scrape(server: BrokerThread) -> Scrape:
    reply = get(server, "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    found = Scrape(reply.text, {}, {})
    for family in text_string_to_metric_families(reply.text):
        assert family.name not in found.types, f"{family.name} served twice"
        found.types[family.name] = family.type
        samples = found.values[family.name] = {}
        for sample in family.samples:
            samples[frozenset(sample.labels.items())] = sample.value
    return found


# --------------------------------------------------------------------------- API keys


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    return tmp_path / "keys" / "api-keys"


@pytest.fixture
def keyed_broker(start_broker, keys_file) -> Callable[..., tuple[BrokerThread, str]]:
    """keyed_broker(**sections) -> (server, an API key it accepts)."""

    def start(**sections: Any) -> tuple[BrokerThread, str]:
        key = ApiKeys(str(keys_file)).add()
        http = {"address": "127.0.0.1:0", "api_keys_file": str(keys_file)}
        http.update(sections.pop("http", {}))
        return start_broker(http=http, **sections), key

    return start
