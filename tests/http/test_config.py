"""[http]: turned off, a bad address (from a file, from the environment), a port that is
taken, and the default that the test fixture overrides."""

from __future__ import annotations

import socket

import pytest

from broker.config import ConfigError, HttpSettings, config_from_dict, load_config
from tests.test_cli import clean_env, nautilus, write_config

from .conftest import get


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_defaults():
    assert HttpSettings() == HttpSettings(
        enabled=True,
        address="127.0.0.1:8888",
        prometheus_namespace="",
        api_keys_file="./data/api-keys",
        request_timeout=10.0,
        keepalive_timeout=75.0,
        max_connections=256,
    )


def test_disabled_means_no_http_server(start_broker, raw_client):
    port = free_port()
    server = start_broker(http={"enabled": False, "address": f"127.0.0.1:{port}"})
    assert server.broker.http is None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass
    client = raw_client(server)  # MQTT is served all the same
    client.connect("still-mqtt")
    assert client.is_open()


def test_enabled_serves_on_the_bound_port(start_broker):
    server = start_broker()
    assert server.broker.http is not None and server.broker.http.address is not None
    host, port = server.broker.http.address
    assert host == "127.0.0.1" and port > 0
    assert get(server, "/health/ping").text == "pong"


@pytest.mark.parametrize(
    "address", ["nowhere", "127.0.0.1", ":8888", "127.0.0.1:99999", "::1:8888", "[::1:8888"]
)
def test_a_bad_address_is_a_config_error_naming_it(address):
    with pytest.raises(ConfigError, match=r"^http\.address: ") as raised:
        config_from_dict({"http": {"address": address}})
    assert repr(address) in str(raised.value)


def test_other_bad_values_name_their_key():
    with pytest.raises(ConfigError, match=r"http\.enabled"):
        config_from_dict({"http": {"enabled": "sometimes"}})
    with pytest.raises(ConfigError, match=r"http\.api_key_file"):
        config_from_dict({"http": {"api_key_file": "typo"}})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("request_timeout", 0, "expected a number of seconds above 0, got 0"),
        ("request_timeout", "10s", "expected a number of seconds above 0, got '10s'"),
        ("keepalive_timeout", -1, "expected a number of seconds above 0, got -1"),
        ("keepalive_timeout", True, "expected a number of seconds above 0, got True"),
        ("max_connections", 0, "must be 1 or more, got 0"),
        ("max_connections", -5, "must be 1 or more, got -5"),
        ("max_connections", 1.5, "expected an integer, got 1.5"),
    ],
)
def test_a_bad_limit_is_one_line_naming_its_key(key, value, says):
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"http": {key: value}})
    assert str(raised.value) == f"http.{key}: {says}"


def test_limits_take_fractions_of_seconds_and_the_environment():
    config = config_from_dict({"http": {"request_timeout": 0.5, "keepalive_timeout": 2}})
    assert (config.http.request_timeout, config.http.keepalive_timeout) == (0.5, 2.0)
    env = {"NAUTILUS_HTTP__MAX_CONNECTIONS": "64", "NAUTILUS_HTTP__REQUEST_TIMEOUT": "3"}
    assert load_config(None, env).http.max_connections == 64
    assert load_config(None, env).http.request_timeout == 3.0


def test_the_command_says_which_key_in_one_line(tmp_path):
    config = write_config(tmp_path / "nautilus.toml")
    with config.open("a", encoding="utf-8") as out:
        out.write('\n[http]\naddress = "localhost"\n')
    env = clean_env()
    del env["NAUTILUS_HTTP__ADDRESS"]  # the file's value, not the tests' override
    result = nautilus("--config", str(config), cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert result.stderr == (
        "nautilus: http.address: expected 'host:port' (IPv6: '[::1]:port'), got 'localhost'\n"
    )
    from_env = nautilus(
        "--config", str(config), cwd=tmp_path, env=clean_env(NAUTILUS_HTTP__ADDRESS="nowhere")
    )
    assert from_env.returncode == 2
    assert from_env.stderr.startswith("nautilus: http.address: ")


def test_a_taken_http_port_stops_the_command_with_one_error_line(tmp_path):
    config = write_config(tmp_path / "nautilus.toml")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = clean_env(NAUTILUS_HTTP__ADDRESS=f"127.0.0.1:{port}")
        result = nautilus("--config", str(config), cwd=tmp_path, env=env)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("nautilus: ")]
    assert len(errors) == 1, result.stderr
    assert "address already in use" in errors[0] and str(port) in errors[0]
    assert "Traceback" not in result.stderr


def test_a_namespace_prometheus_cannot_read_is_refused():
    with pytest.raises(ConfigError, match=r"http\.prometheus_namespace"):
        config_from_dict({"http": {"prometheus_namespace": "my-ns"}})
