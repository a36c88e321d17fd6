"""Auth switched off by a forgotten key is said, not silent: the warnings of
broker/deciders.py (built from real configs and real plugins), the WARNING a start logs,
and `nautilus check-config FILE` (the real command, as a subprocess)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import config_from_dict
from broker.deciders import explain, warnings
from broker.plugins import configured_plugins
from event_relay.config import RelayConfig
from tests.broker.helpers import V311, PahoClient
from tests.test_cli import clean_env

SECRET = "a-secret-of-more-than-thirty-two-bytes-for-hs256"
JWT = {"auth_jwt": {"enabled": True, "secret": SECRET, "algorithms": ["HS256"]}}


def checked(**sections) -> tuple[list[str], dict[str, str]]:
    config = config_from_dict(sections)
    plugins = configured_plugins(config)
    return warnings(config, plugins), explain(config, plugins)


def test_an_auth_plugin_with_anonymous_access_is_a_warning_naming_both_keys():
    (warning,), decides = checked(broker={"allow_anonymous": True}, plugins=JWT)
    assert "broker.allow_anonymous = true" in warning
    assert "plugins.auth_jwt" in warning
    assert "any client connects" in warning
    assert decides["CONNECT"].startswith("nobody")


def test_an_auth_plugin_without_anonymous_access_decides_and_warns_of_nothing():
    found, decides = checked(broker={"allow_anonymous": False}, plugins=JWT)
    assert found == []
    assert decides["CONNECT"] == "auth_jwt; refused unless one says Ok"
    assert decides["PUBLISH"] == "nobody: every client may, on every topic"


def test_no_plugin_to_authenticate_refuses_everyone(tmp_path):
    (warning,), decides = checked(broker={"allow_anonymous": False})
    assert "no_matching_hook_found" in warning
    assert decides["CONNECT"] == "nobody: every client is refused (no_matching_hook_found)"


def test_the_chains_are_in_call_order(tmp_path):
    acl, passwd = tmp_path / "acl", tmp_path / "passwd"
    acl.write_text("topic devices/#\n")
    passwd.write_text("")
    plugins = {
        **JWT,
        "acl": {"enabled": True, "acl_file": str(acl)},
        "passwd": {"enabled": True, "password_file": str(passwd), "priority": 1},
    }
    _, decides = checked(broker={"allow_anonymous": False}, plugins=plugins)
    assert decides["CONNECT"] == "passwd, then auth_jwt; refused unless one says Ok"
    assert decides["PUBLISH"] == "acl; refused unless one says Ok"


@pytest.mark.parametrize(
    ("address", "warned"), [("0.0.0.0:1883", True), ("127.0.0.1:1883", False), ("[::1]:1", False)]
)
def test_anonymous_access_on_a_reachable_listener_is_a_warning(address, warned):
    found, _ = checked(broker={"allow_anonymous": True}, listeners=[{"address": address}])
    assert [f"listeners[0] (tcp {address})" in w for w in found] == ([True] if warned else [])


def test_webhooks_count_only_with_an_auth_on_register_endpoint():
    def webhooks(hook: str) -> dict:
        endpoint = {"hook": hook, "url": "http://127.0.0.1:9/hook"}
        return {"webhooks": {"enabled": True, "endpoints": [endpoint]}}

    anonymous = {"allow_anonymous": True}
    (warning,), _ = checked(broker=anonymous, plugins=webhooks("auth_on_register"))
    assert "plugins.webhooks" in warning
    assert checked(broker=anonymous, plugins=webhooks("on_publish"))[0] == []


def test_a_start_logs_the_warning_and_the_switch_does_what_it_says(start_broker, caplog):
    caplog.set_level(logging.WARNING, logger="nautilus")
    server = start_broker(broker={"allow_anonymous": True}, plugins=JWT)
    said = [r.getMessage() for r in caplog.records if "allow_anonymous" in r.getMessage()]
    assert len(said) == 1 and "plugins.auth_jwt" in said[0]
    # What it warns of: a token that does not verify connects all the same.
    client = PahoClient(server.host, server.port, V311)
    client.connect(username="device-1", password="not.a.token")
    client.close()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "broker", "check-config", str(path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_config_prints_what_a_start_would_do(tmp_path):
    acl = write(tmp_path / "acl", "user spark\ntopic write $analytics/#\n")
    config = write(
        tmp_path / "nautilus.toml",
        f"""
[broker]
allow_anonymous = true

[[listeners]]
address = "0.0.0.0:1883"

[plugins.auth_jwt]
enabled = true
secret = "{SECRET}"
algorithms = ["HS256"]

[plugins.acl]
enabled = true
acl_file = "{acl}"

[plugins.passwd]
password_file = "unused"

[event_relay]
enabled = true
""",
    )
    done = check_config(config)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "  0.0.0.0:1883             MQTT tcp, listeners[0].address" in out
    assert any(line.split()[:1] == [RelayConfig().address] for line in out)
    assert "plugins, in call order: event_relay, plugins.auth_jwt, plugins.acl" in out
    assert any(line.startswith("  PUBLISH    acl;") for line in out)
    warned = [line for line in out if line.startswith("WARNING: ")]
    assert len(warned) == 2
    assert "plugins.passwd has settings but no `enabled = true`" in warned[0]
    assert "switches off the CONNECT check of plugins.auth_jwt" in warned[1]
    assert out[-1] == f"{config}: ok, 2 warnings"


def test_check_config_names_a_bad_key_and_fails(tmp_path):
    config = write(tmp_path / "bad.toml", "[broker]\nallow_anonymus = false\n")
    done = check_config(config)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "nautilus check-config: unknown config key 'broker.allow_anonymus'"
    )
