"""The real commands, run as subprocesses (`python -m broker ...`) against a broker
running in this process: `nautilus api-key add|list|delete` edits the keys file that the
running broker reads again by itself (no restart), and `nautilus admin ...` asks it
through the admin API."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from broker.http.api_keys import ApiKeys
from tests.broker.helpers import unique_id
from tests.test_cli import clean_env, nautilus

from .conftest import api, base_url, error, table


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


# --------------------------------------------------------------------------- api-key


@pytest.fixture
def keyed_config(tmp_path: Path) -> tuple[Path, Path]:
    """A config file whose [http] names a keys file (not there yet)."""
    keys = tmp_path / "state" / "api-keys"
    config = tmp_path / "nautilus.toml"
    config.write_text(f'[http]\napi_keys_file = "{keys}"\n', encoding="utf-8")
    return config, keys


def test_api_key_add_list_delete_on_a_running_broker(start_broker, keyed_config, tmp_path):
    config, keys = keyed_config
    server = start_broker(http={"address": "127.0.0.1:0", "api_keys_file": str(keys)})
    assert error(api(server, "plugins", "no-key-exists-yet-at-all"), 401)

    added = nautilus("api-key", "add", "--config", str(config), cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    key = one_line(added.stdout)
    assert len(key) >= 16
    assert table(api(server, "plugins", key)) == []  # at once, no restart

    chosen = "chosen-key-0123456789"
    added = nautilus("api-key", "add", "--key", chosen, "--file", str(keys), cwd=tmp_path)
    assert (added.returncode, added.stdout) == (0, chosen + "\n")
    assert table(api(server, "plugins", chosen)) == []

    listed = nautilus("api-key", "list", "--config", str(config), cwd=tmp_path)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [key[:6], chosen[:6]]
    assert all(" created " in line for line in lines)

    text = keys.read_text(encoding="utf-8")
    assert key not in text and chosen not in text  # only digests (and 6-character ids)
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600

    # `--` works too (a key of one's own may start with "-").
    deleted = nautilus("api-key", "--config", str(config), "--", "delete", key, cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert error(api(server, "plugins", key), 401)  # stops working at once
    assert table(api(server, "plugins", chosen)) == []  # the other one still works

    by_id = nautilus("api-key", "delete", chosen[:6], "--config", str(config), cwd=tmp_path)
    assert by_id.returncode == 0, by_id.stderr
    assert error(api(server, "plugins", chosen), 401)
    assert nautilus("api-key", "list", "--config", str(config), cwd=tmp_path).stdout == ""


def test_api_key_refusals(keyed_config, tmp_path):
    config, keys = keyed_config
    short = nautilus("api-key", "add", "--key", "short", "--config", str(config), cwd=tmp_path)
    assert short.returncode == 2
    assert short.stdout == ""
    assert one_line(short.stderr).startswith("nautilus api-key: ")
    assert "16" in short.stderr
    assert not keys.exists()

    key = "the-same-key-twice-0000"
    first = nautilus("api-key", "add", "--key", key, "--config", str(config), cwd=tmp_path)
    assert first.returncode == 0
    twice = nautilus("api-key", "add", "--key", key, "--config", str(config), cwd=tmp_path)
    assert twice.returncode == 2
    assert "already" in one_line(twice.stderr)

    missing = nautilus(
        "api-key", "delete", "nothing-like-it", "--config", str(config), cwd=tmp_path
    )
    assert missing.returncode == 1
    assert one_line(missing.stderr).startswith("nautilus api-key: no key")
    assert ApiKeys(str(keys)).find(key) is not None  # the failed commands left the file alone


def test_api_key_with_a_bad_config_is_one_line_exit_2(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[http]\nkeys_file = "misspelt"\n', encoding="utf-8")
    result = nautilus("api-key", "list", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("nautilus api-key: ")
    assert "http.keys_file" in result.stderr


# --------------------------------------------------------------------------- admin


def admin(server: Any, *args: str, key: str | None, cwd: Path, **env: str) -> Any:
    options = ["--url", base_url(server)] if server is not None else []
    if key is not None:
        options.append(f"--key={key}")  # a generated key may start with "-"
    return nautilus("admin", *options, *args, cwd=cwd, env=clean_env(**env))


def test_admin_sessions_table_and_json(keyed_broker, paho_client, tmp_path):
    server, key = keyed_broker()
    client_id = unique_id("shown")
    paho_client(server, client_id=client_id)
    alone = admin(server, "sessions", key=key, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert client_id in alone.stdout
    other = unique_id("zz-other")  # sorts after client_id
    paho_client(server, client_id=other)

    result = admin(server, "sessions", key=key, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:2] == ["client_id", "is_online"]
    assert [row.split()[:2] for row in rows] == [[client_id, "True"], [other, "True"]]

    as_json = admin(server, "--json", "sessions", "--online", key=key, cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == api(server, "sessions", key, online="true").json

    by_env = admin(server, "sessions", "--offline", key=None, cwd=tmp_path, NAUTILUS_API_KEY=key)
    assert (by_env.returncode, by_env.stdout) == (0, "(none)\n")


def test_admin_client_disconnect_retained_metrics_and_plugins(keyed_broker, raw_client, tmp_path):
    server, key = keyed_broker(broker={"systree_enabled": False})
    client_id = unique_id("cli")
    client = raw_client(server)
    client.connect(client_id)
    client.subscribe(("x/#", 1))
    client.publish("shelf/kept", b"k", qos=1, retain=True)  # not to itself

    shown = admin(server, "client", client_id, key=key, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    fields = {}
    for line in shown.stdout.splitlines():  # one row of many fields: "key  value" lines
        name = line.split()[0]
        fields[name] = line[len(name) :].strip()
    assert fields["client_id"] == client_id
    assert json.loads(fields["subscriptions"])[0]["topic"] == "x/#"

    retained = admin(server, "--json", "retained", "--topic", "shelf/+", key=key, cwd=tmp_path)
    assert [r["topic"] for r in json.loads(retained.stdout)["table"]] == ["shelf/kept"]
    cleared = admin(server, "retained-delete", "shelf/kept", key=key, cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    assert table(api(server, "retain/show", key)) == []

    reset = admin(server, "--json", "metrics", "--reset", key=key, cwd=tmp_path)
    assert json.loads(reset.stdout)["table"][0]["mqtt_publish_received"] == 0
    assert server.call(lambda: server.broker.metrics.mqtt_publish_received) == 0

    gone = admin(server, "disconnect", client_id, "--cleanup", key=key, cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert client.expect_closed() == []
    assert error(api(server, "session/client", key, client_id=client_id), 404)

    plugins = admin(server, "plugins", key=key, cwd=tmp_path)
    assert (plugins.returncode, plugins.stdout) == (0, "(none)\n")


def test_admin_errors_are_one_line_exit_1(keyed_broker, tmp_path):
    server, key = keyed_broker()
    no_key = admin(server, "sessions", key=None, cwd=tmp_path)
    assert no_key.returncode == 1
    assert no_key.stdout == ""
    assert one_line(no_key.stderr).startswith("nautilus admin: 401")

    wrong = admin(server, "sessions", key="wrong-wrong-wrong-wrong", cwd=tmp_path)
    assert wrong.returncode == 1
    assert one_line(wrong.stderr).startswith("nautilus admin: 401")

    unknown = admin(server, "client", "ghost", key=key, cwd=tmp_path)
    assert unknown.returncode == 1
    assert one_line(unknown.stderr).startswith("nautilus admin: 404: ")
    assert "ghost" in unknown.stderr

    plugin = admin(server, "plugin-enable", "nope", key=key, cwd=tmp_path)
    assert plugin.returncode == 1
    assert one_line(plugin.stderr).startswith("nautilus admin: 404: ")

    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    unreachable = nautilus("admin", "--url", url, f"--key={key}", "sessions", cwd=tmp_path)
    assert unreachable.returncode == 1
    assert unreachable.stdout == ""
    assert one_line(unreachable.stderr).startswith(f"nautilus admin: cannot reach {url}")


def test_admin_with_a_url_without_a_scheme_is_one_line_exit_2(tmp_path):
    result = nautilus("admin", "--url", "broker-1", "--key", "k" * 16, "sessions", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("nautilus admin: --url: expected http://")


def test_a_damaged_keys_file_is_one_line(tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text("not json\n", encoding="utf-8")
    result = nautilus("api-key", "list", "--file", str(keys), cwd=tmp_path)
    assert result.returncode != 0
    assert one_line(result.stderr).startswith("nautilus api-key: ")


def test_generated_keys_can_be_given_on_the_command_line(tmp_path):
    keys = tmp_path / "api-keys"
    made = [ApiKeys(str(keys)).add() for _ in range(200)]
    assert all(key.isalnum() and len(key) == 32 for key in made)  # never "-...": no option
    refused = nautilus(
        "api-key", "add", "--key=-dashed-key-0123456789", "--file", str(keys), cwd=tmp_path
    )
    assert refused.returncode == 2
    assert one_line(refused.stderr) == (
        "nautilus api-key: an API key may not start with '-' (commands would take it for an option)"
    )
