"""[event_relay] config errors name the key (through the config loader and the plugin
loader, and through the real `nautilus --config` command), and `nautilus events tail`
against a real broker process."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from broker.config import ConfigError, config_from_dict
from broker.plugins import configured_plugins
from event_relay.schema import HOOK_NAMES
from tests.broker.helpers import RawClient, unique_id
from tests.test_cli import clean_env, nautilus

from .conftest import RELAY_LISTENING

HOST = "127.0.0.1"


def load(relay: dict[str, Any]) -> list[tuple[str, Any]]:
    config = config_from_dict(
        {
            "listeners": [{"address": "127.0.0.1:0"}],
            "store": {"backend": "memory"},
            "event_relay": relay,
        }
    )
    return configured_plugins(config)


BAD = [
    pytest.param({"foo": 1}, "unknown config key 'event_relay.foo'", id="unknown-key"),
    pytest.param(
        {"hooks": ["on_publish", "on_publsh"]},
        "event_relay.hooks: 'on_publsh' is not an event hook",
        id="hook-name",
    ),
    pytest.param({"hooks": "on_publish"}, "event_relay.hooks: expected an array", id="hooks"),
    pytest.param(
        {"sample": {"on_publish": {"metered": 150}}},
        "event_relay.sample.on_publish.metered: must be 0 to 100, got 150",
        id="sample-150",
    ),
    pytest.param(
        {"sample": {"on_publish": {"metered": -1}}},
        "event_relay.sample.on_publish.metered: must be 0 to 100, got -1",
        id="sample-negative",
    ),
    pytest.param(
        {"sample": {"on_register": {"metered": 5}}},
        "event_relay.sample.on_register: only on_publish, on_deliver, on_delivery_complete",
        id="sample-hook",
    ),
    pytest.param(
        {"sample": {"on_publish": {"metered": "half"}}},
        "event_relay.sample.on_publish.metered: expected an integer",
        id="sample-type",
    ),
    pytest.param(
        {"address": "127.0.0.1"}, "event_relay.address: expected 'host:port'", id="address"
    ),
    pytest.param({"address": ":7883"}, "event_relay.address: expected 'host:port'", id="no-host"),
    pytest.param(
        {"address": "relay:port"}, "event_relay.address: expected 'host:port'", id="port-name"
    ),
    pytest.param({"durability": "disk"}, "event_relay.durability: 'disk' is not one of", id="dur"),
    pytest.param({"payloads": "some"}, "event_relay.payloads: 'some' is not one of", id="payl"),
    pytest.param(
        {"memory_events": 0}, "event_relay.memory_events: must be 1 or more, got 0", id="mem"
    ),
    pytest.param(
        {"batch_events": "many"}, "event_relay.batch_events: expected an integer", id="batch"
    ),
    pytest.param({"secret": 5}, "event_relay.secret: expected str", id="secret"),
    pytest.param(
        {"heartbeat_interval": -1},
        "event_relay.heartbeat_interval: expected 0 (off) or a number of seconds, got -1",
        id="heartbeat",
    ),
    pytest.param(
        {"heartbeat_interval": "1s"},
        "event_relay.heartbeat_interval: expected 0 (off) or a number of seconds",
        id="heartbeat-type",
    ),
    pytest.param(
        {"sidecar": {"port": 0}}, "event_relay.sidecar.port: must be 1 to 65535", id="sidecar"
    ),
]


@pytest.mark.parametrize(("keys", "message"), BAD)
def test_config_errors_name_the_key(keys, message):
    with pytest.raises(ConfigError) as caught:
        load({"enabled": True, "address": "127.0.0.1:0", **keys})
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_keys_of_a_relay_that_is_off_are_checked_too():
    # A misspelt `enabled` must not leave the relay silently off.
    with pytest.raises(ConfigError, match=r"^unknown config key 'event_relay\.enable'"):
        load({"enable": True})
    assert load({"enabled": False, "address": "127.0.0.1:7883"}) == []


def test_a_heartbeat_interval_of_0_turns_heartbeats_off():
    ((_, relay),) = load({"enabled": True, "address": "127.0.0.1:0", "heartbeat_interval": 0})
    assert relay.config.heartbeat_interval == 0.0


def test_enabled_must_be_a_boolean():
    with pytest.raises(ConfigError, match=r"^event_relay\.enabled: expected true or false"):
        load({"enabled": "yes"})


def test_a_spool_path_that_is_a_file_is_a_config_error_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ((_, relay),) = load({"enabled": True, "durability": "spool", "spool_path": str(blocker)})
    with pytest.raises(ConfigError, match=r"^event_relay\.spool_path: "):
        asyncio.run(relay.start())


def test_building_the_relay_takes_no_spool_a_broker_holds(tmp_path):
    """Its spool is opened when it starts: `nautilus check-config` builds the plugins
    beside a broker running on the same config."""
    relay_table = {"enabled": True, "durability": "spool", "spool_path": str(tmp_path / "ev")}
    ((_, running),) = load(relay_table)

    async def beside_a_running_one() -> None:
        await running.start()
        try:
            load(relay_table)
        finally:
            await running.stop()

    asyncio.run(beside_a_running_one())


def test_a_spool_path_that_is_a_file_one_line_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = tmp_path / "bad.toml"
    config.write_text(
        '[[listeners]]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n'
        f'[event_relay]\nenabled = true\ndurability = "spool"\nspool_path = "{blocker}"\n',
        encoding="utf-8",
    )
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("nautilus: event_relay.spool_path: ")


def test_a_good_section_loads_the_relay_first(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic #\n")
    config = config_from_dict(
        {
            "broker": {"node_name": "edge-1"},
            "store": {"backend": "memory"},
            "plugins": {"acl": {"enabled": True, "acl_file": str(acl)}},
            "event_relay": {"enabled": True, "hooks": ["on_publish", "on_client_gone"]},
        }
    )
    plugins = configured_plugins(config)
    assert [name for name, _ in plugins] == ["event_relay", "acl"]
    relay = plugins[0][1]
    assert relay.config.node_name == "edge-1"
    assert relay.config.serve is True
    # Hooks not listed are hidden from the broker, but on_register: on_client_gone's
    # events say when their session connected.
    # The per-message events come through its recorder (hooks/recorder.py), never as hooks.
    hooks = [hook for hook in HOOK_NAMES if getattr(relay, hook, None) is not None]
    assert sorted(hooks) == ["on_client_gone", "on_register"]
    assert relay.recorder is not None


def test_no_relay_unless_enabled():
    assert load({"address": "127.0.0.1:0"}) == []
    assert load({"enabled": False}) == []


def test_a_port_out_of_range_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^event_relay\.address: "):
        load({"enabled": True, "address": "127.0.0.1:99999"})


CLI_BAD = [
    pytest.param("foo = 1\n", "event_relay.foo", id="unknown-key"),
    pytest.param('hooks = ["on_publish", "on_nothing"]\n', "event_relay.hooks", id="hook"),
    pytest.param(
        "[event_relay.sample.on_publish]\nmetered = 150\n",
        "event_relay.sample.on_publish.metered",
        id="sample",
    ),
    pytest.param('address = "7883"\n', "event_relay.address", id="address"),
    pytest.param('durability = "disk"\n', "event_relay.durability", id="durability"),
]


@pytest.mark.parametrize(("text", "key"), CLI_BAD)
def test_bad_relay_config_one_line_exit_2(tmp_path, text, key):
    config = tmp_path / "bad.toml"
    config.write_text(
        '[[listeners]]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n'
        f"[event_relay]\nenabled = true\n{text}",
        encoding="utf-8",
    )
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nautilus: ")
    assert key in lines[0]


# --------------------------------------------------------------------------- events tail


def relay_broker_process(tmp_path: Path, start_process, extra: str = ""):
    config = tmp_path / "relay.toml"
    config.write_text(
        '[[listeners]]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n'
        f'[event_relay]\nenabled = true\naddress = "127.0.0.1:0"\n{extra}',
        encoding="utf-8",
    )
    proc = start_process(config)
    match = next(m for m in map(RELAY_LISTENING.search, proc.lines) if m)
    return proc, f"{HOST}:{match[1]}"


def test_events_tail_prints_json_lines(tmp_path, start_process):
    proc, relay = relay_broker_process(tmp_path, start_process)
    pub = RawClient(HOST, proc.port)
    try:
        client_id = unique_id("tail")
        pub.connect(client_id)
        pub.publish("cli/text", "héllo".encode(), qos=1)
        pub.publish("cli/binary", b"\xff\x00", qos=0)
        pub.publish("cli/third", b"3", qos=1)
    finally:
        pub.close()
    result = nautilus(
        "events", "tail", "--relay", relay, "--from", "earliest", "--type", "on_publish",
        "--count", "2", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    first, second = (json.loads(line) for line in lines)
    for event in (first, second):
        assert event["type"] == "on_publish"
        assert event["client_id"] == client_id
        assert event["username"] is None and event["mountpoint"] == ""
        assert event["acl_name"] == event["acl_pattern"] == ""
        assert event["retain"] is False
        assert isinstance(event["ts"], int) and isinstance(event["session_id"], str)
    assert first["session_id"] == second["session_id"]
    assert {k: first[k] for k in ("seq", "topic", "qos", "payload", "payload_size")} == {
        "seq": 3,  # after the register and wakeup
        "topic": "cli/text",
        "qos": 1,
        "payload": "héllo",
        "payload_size": 6,
    }
    assert {k: second[k] for k in ("seq", "topic", "qos", "payload_base64", "payload_size")} == {
        "seq": 5,  # after the first one's no_matching_subscribers drop
        "topic": "cli/binary",
        "qos": 0,
        "payload_base64": "/wA=",
        "payload_size": 2,
    }
    assert "payload" not in second


def test_events_tail_with_a_secret(tmp_path, start_process):
    proc, relay = relay_broker_process(tmp_path, start_process, 'secret = "s3cret"\n')
    pub = RawClient(HOST, proc.port)
    try:
        pub.connect(unique_id("tail"))
        pub.publish("cli/secret", b"kept", qos=1)
    finally:
        pub.close()
    args = ("events", "tail", "--relay", relay, "--from", "earliest", "--count", "1")
    refused = nautilus(*args, cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"nautilus events: relay {relay}: unauthorized: a valid secret is required"
    ]
    result = nautilus(*args, "--secret", "s3cret", "--type", "on_publish", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["payload"] == "kept"
    env = clean_env(NAUTILUS_RELAY_SECRET="s3cret")
    result = nautilus(*args, "--type", "on_publish", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{line}\n"


def test_events_tail_when_no_relay_runs(tmp_path):
    with socket.socket() as reserved:  # bound, not listening: connections are refused
        reserved.bind((HOST, 0))
        port = reserved.getsockname()[1]
        result = nautilus("events", "tail", "--relay", f"{HOST}:{port}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"nautilus events: cannot reach the relay at {HOST}:{port}: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "yesterday"], "--from: expected earliest, latest, committed"),
        (["--type", "on_publish,on_nothing"], "--type: unknown event types on_nothing"),
        (["--relay", "nowhere"], "--relay: expected 'host:port'"),
    ],
)
def test_events_tail_bad_arguments_exit_2(tmp_path, args, message):
    result = nautilus("events", "tail", "--relay", f"{HOST}:9", *args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"nautilus events: {message}")
