"""`[http] cors_origins`: the answers a page of an allowed origin may read, and the
preflight a browser sends before an admin API call with a key (real HTTP, urllib)."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, config_from_dict

from .conftest import api, basic, get

DASH = "https://dash.example.com"


def test_an_allowed_origin_may_read_health_status_metrics_and_the_api(keyed_broker):
    server, key = keyed_broker(http={"cors_origins": [DASH]})
    for path in ("/health", "/status.json", "/metrics"):
        reply = get(server, path, headers={"Origin": DASH})
        assert reply.status == 200
        assert reply.headers["Access-Control-Allow-Origin"] == DASH
        assert reply.headers["Vary"] == "Origin"
    shown = get(server, "/api/v1/session/show", headers={"Origin": DASH, **basic(key)})
    assert shown.status == 200 and shown.headers["Access-Control-Allow-Origin"] == DASH
    refused = get(server, "/api/v1/session/show", headers={"Origin": DASH})  # no key
    assert refused.status == 401 and refused.headers["Access-Control-Allow-Origin"] == DASH


def test_the_preflight_is_answered_without_a_key(keyed_broker):
    server, _ = keyed_broker(http={"cors_origins": [DASH]})
    headers = {
        "Origin": DASH,
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }
    reply = get(server, "/api/v1/session/show", method="OPTIONS", headers=headers)
    assert reply.status == 204
    assert reply.headers["Access-Control-Allow-Origin"] == DASH
    assert "Authorization" in reply.headers["Access-Control-Allow-Headers"]
    assert reply.headers["Access-Control-Allow-Methods"] == "GET, POST"


def test_other_origins_and_the_default_get_no_header(keyed_broker, start_broker):
    server, key = keyed_broker(http={"cors_origins": [DASH]})
    other = get(server, "/health", headers={"Origin": "https://evil.example.com"})
    assert "Access-Control-Allow-Origin" not in other.headers
    plain, _ = keyed_broker()  # none by default
    assert (
        "Access-Control-Allow-Origin" not in get(plain, "/health", headers={"Origin": DASH}).headers
    )
    assert api(server, "session/show", key).status == 200  # no Origin: as before


def test_any_origin_with_a_star(keyed_broker):
    server, _ = keyed_broker(http={"cors_origins": ["*"]})
    reply = get(server, "/status.json", headers={"Origin": "http://localhost:3000"})
    assert reply.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_a_value_that_is_not_an_origin_names_the_key():
    with pytest.raises(ConfigError, match=r"http.cors_origins\[1\]: 'dash.example.com' is not"):
        config_from_dict({"http": {"cors_origins": [DASH, "dash.example.com"]}})
