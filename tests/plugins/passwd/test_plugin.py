"""The plugin without a network: config, auth_on_register results, reloading."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import threading

import pytest

from broker.config import ConfigError, Duration
from broker.plugins import load_plugins
from hooks import NEXT, Error, Ok, RegisterContext
from plugins.passwd import PLUGIN, PasswdConfig, PasswdPlugin
from plugins.passwd.hashes import ScryptHash, Sha512Hash, make_hash
from plugins.passwd.passwd_file import set_user, write_atomic

SALT = b"vernemq-salt"
VMQ = (
    f"$6${base64.b64encode(SALT).decode()}$"
    f"{base64.b64encode(hashlib.sha512(b'legacy' + SALT).digest()).decode()}"
)


@pytest.fixture
def passwd_path(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"alice:{make_hash(b'wonderland')}\nold:{VMQ}\n", encoding="utf-8")
    return path


def make(path, interval: int = 0) -> PasswdPlugin:
    return PasswdPlugin(PasswdConfig(str(path), Duration(interval)))


def register(plugin, username, password):
    context = RegisterContext(client_id="c1", username=username, password=password)
    return asyncio.run(plugin.auth_on_register(context))


def test_exported_as_plugin_and_built_from_config(passwd_path):
    plugins = load_plugins(
        {
            "passwd": {
                "enabled": True,
                "password_file": str(passwd_path),
                "password_reload_interval": "5s",
            }
        }
    )
    assert PLUGIN is PasswdPlugin
    [(name, plugin)] = plugins
    assert name == "passwd"
    assert isinstance(plugin, PasswdPlugin)
    assert plugin.config.password_reload_interval == 5
    assert set(plugin.users) == {"alice", "old"}


def test_defaults():
    config = PasswdConfig()
    assert config.password_file == "./nautilus.passwd"
    assert config.password_reload_interval == 10


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"password_file": "MISSING"}, "plugins.passwd.password_file: MISSING: no such file"),
        ({"password_file": 7}, "plugins.passwd.password_file: expected str, got int"),
        ({"password_reload_interval": -1}, "plugins.passwd.password_reload_interval"),
        ({"reload": 1}, "unknown config key 'plugins.passwd.reload'"),
    ],
)
def test_config_errors_name_the_key(tmp_path, passwd_path, settings, message):
    settings = {"password_file": str(passwd_path), **settings}
    if settings["password_file"] == "MISSING":
        settings["password_file"] = str(tmp_path / "MISSING")
        message = message.replace("MISSING", str(tmp_path / "MISSING"))
    with pytest.raises(ConfigError) as info:
        load_plugins({"passwd": {"enabled": True, **settings}})
    assert str(info.value).startswith(message), str(info.value)


def test_broken_file_at_start_is_a_config_error_naming_key_and_line(passwd_path):
    passwd_path.write_text(f"alice:{VMQ}\nbob\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        make(passwd_path)
    assert str(info.value) == (
        f"plugins.passwd.password_file: {passwd_path}:2: expected username:hash"
    )


@pytest.mark.parametrize(
    ("username", "password", "expected"),
    [
        ("alice", b"wonderland", Ok()),
        ("alice", b"Wonderland", Error("invalid_credentials")),
        ("alice", b"", Error("invalid_credentials")),
        ("old", b"legacy", Ok()),  # a VerneMQ $6$ line
        ("old", b"wonderland", Error("invalid_credentials")),
        ("nobody", b"wonderland", NEXT),
        (None, b"wonderland", NEXT),
        ("alice", None, NEXT),
    ],
)
def test_auth_on_register(passwd_path, username, password, expected):
    assert register(make(passwd_path), username, password) == expected


def test_scrypt_runs_in_the_plugins_threads_sha512_inline(passwd_path, monkeypatch):
    threads = []
    for cls in (ScryptHash, Sha512Hash):
        original = cls.verify

        def spy(self, password, original=original):
            threads.append((type(self).__name__, threading.current_thread().name))
            return original(self, password)

        monkeypatch.setattr(cls, "verify", spy)

    async def scenario():
        plugin = make(passwd_path)
        plugin.start()
        try:
            return [
                await plugin.auth_on_register(
                    RegisterContext(client_id="c", username=user, password=password)
                )
                for user, password in (("alice", b"wonderland"), ("old", b"legacy"))
            ]
        finally:
            plugin.stop()

    assert asyncio.run(scenario()) == [Ok(), Ok()]
    assert threads[0][0] == "ScryptHash"
    assert threads[0][1].startswith("nautilus-passwd")
    assert threads[1] == ("Sha512Hash", "MainThread")


# -- reloading ---------------------------------------------------------------------------


def add_user(path, username, password: bytes) -> None:
    write_atomic(path, set_user(path.read_text(encoding="utf-8"), username, make_hash(password)))


def test_reload_swaps_in_a_new_table(passwd_path, caplog):
    plugin = make(passwd_path, interval=10)
    before = plugin.users
    assert not plugin.reloader.check()  # unchanged: nothing read
    add_user(passwd_path, "bob", b"builder")
    with caplog.at_level(logging.INFO, logger="nautilus.plugins.passwd"):
        assert plugin.reloader.check()
    assert plugin.users is not before
    assert set(plugin.users) == {"alice", "old", "bob"}
    assert set(before) == {"alice", "old"}  # the old table was not modified
    assert register(plugin, "bob", b"builder") == Ok()
    assert [r.getMessage() for r in caplog.records] == [
        f"passwd: reloaded 3 users from {passwd_path}"
    ]


def test_broken_file_keeps_old_table_and_logs_one_line(passwd_path, caplog):
    plugin = make(passwd_path, interval=10)
    before = plugin.users
    passwd_path.write_text(f"alice:{VMQ}\nbob:nohash\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="nautilus.plugins.passwd"):
        assert not plugin.reloader.check()
        assert not plugin.reloader.check()  # still broken, not logged again
    assert plugin.users is before
    assert register(plugin, "alice", b"wonderland") == Ok()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"passwd: {passwd_path}:2: user 'bob': expected a hash")
    assert caplog.records[0].levelno == logging.ERROR
    # Fixed: picked up by the next check.
    passwd_path.write_text(f"alice:{VMQ}\n", encoding="utf-8")
    assert plugin.reloader.check()
    assert register(plugin, "alice", b"legacy") == Ok()


def test_missing_file_keeps_old_table(passwd_path, caplog):
    plugin = make(passwd_path, interval=10)
    passwd_path.unlink()
    with caplog.at_level(logging.INFO, logger="nautilus.plugins.passwd"):
        assert not plugin.reloader.check()
        assert not plugin.reloader.check()
    assert len(caplog.records) == 1
    assert str(passwd_path) in caplog.records[0].getMessage()
    assert register(plugin, "alice", b"wonderland") == Ok()


def test_start_schedules_checks_and_stop_cancels(passwd_path):
    async def scenario(interval):
        plugin = make(passwd_path, interval=interval)
        plugin.start()
        scheduled = plugin.reloader._handle is not None
        plugin.stop()
        return scheduled, plugin.reloader._handle

    assert asyncio.run(scenario(10)) == (True, None)
    assert asyncio.run(scenario(0)) == (False, None)  # 0 turns reloading off
