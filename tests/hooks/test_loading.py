"""Plugin loading from `[plugins.<name>]` tables (broker.plugins.load_plugins) and the CLI."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from broker import deciders
from broker.config import PLUGIN_TABLES, ConfigError, config_from_dict
from broker.plugins import TABLES_GROUP, call_all, configured_plugins, load_plugins
from hooks import Hooks, plugin_doors

from .sample import NoConfig, Recorder

ROOT = Path(__file__).resolve().parents[2]
RECORDER = "tests.hooks.sample:Recorder"


def rec(**keys):
    return {"enabled": True, "module": RECORDER, **keys}


def test_disabled_plugins_load_nothing():
    assert load_plugins({}) == []
    # A disabled table is not even imported: a wrong module there does not matter.
    assert load_plugins({"x": {"enabled": False, "module": "no.such.module:Nothing"}}) == []
    assert load_plugins({"x": {"module": "no.such.module:Nothing"}}) == []  # off by default


def test_settings_without_the_switch_are_said_once(caplog):
    # VerneMQ's issue 369: a forgotten `enabled` left a plugin off in silence.
    with caplog.at_level(logging.WARNING, logger="nautilus.plugins"):
        assert load_plugins({"auth_db": {"backend": "redis"}, "acl": {"enabled": False}}) == []
    assert [r.getMessage() for r in caplog.records] == [
        "plugins.auth_db has settings but no `enabled = true`: the plugin is off"
    ]


def test_a_third_party_plugin_by_module():
    [(name, plugin)] = load_plugins({"rec": rec(hooks=["on_publish"])})
    assert name == "rec"
    assert isinstance(plugin, Recorder)
    assert plugin.config == Recorder.Config(hooks=["on_publish"])


def test_a_plugin_without_config_is_built_without_arguments():
    [(_, plugin)] = load_plugins({"p": {"enabled": True, "module": "tests.hooks.sample:NoConfig"}})
    assert type(plugin) is NoConfig


def test_config_defaults_apply():
    [(_, plugin)] = load_plugins({"rec": rec()})
    assert plugin.config == Recorder.Config()


def error(sections) -> str:
    with pytest.raises(ConfigError) as info:
        load_plugins(sections)
    return str(info.value)


@pytest.mark.parametrize(
    "module", ["tests.hooks.sample", "tests.hooks.sample:Recorder:x", 42, "", ["a:b"]], ids=repr
)
def test_a_bad_module_string_is_named(module):
    message = error({"x": {"enabled": True, "module": module}})
    assert message.startswith("plugins.x.module: expected 'package.module:Class'")


def test_a_missing_module_is_named():
    message = error({"x": {"enabled": True, "module": "tests.hooks.no_such_module:Plugin"}})
    assert message.startswith("plugins.x: cannot load plugin: ")
    assert "tests.hooks.no_such_module" in message


def test_an_unknown_built_in_plugin_is_named():
    message = error({"no_such_plugin": {"enabled": True}})
    assert message == "plugins.no_such_plugin: cannot load plugin: no built-in plugin of that name"


@pytest.mark.parametrize("attribute", ["NoSuchClass", "NOT_A_CLASS", "TIMEOUT"])
def test_a_missing_class_is_named(attribute):
    message = error({"x": {"enabled": True, "module": f"tests.hooks.sample:{attribute}"}})
    assert message == f"plugins.x: tests.hooks.sample has no plugin class {attribute!r}"


def test_an_unknown_key_for_a_plugin_without_config_is_named():
    message = error({"p": {"enabled": True, "module": "tests.hooks.sample:NoConfig", "depth": 3}})
    # The same wording as for a plugin with a Config (and the rest of the config).
    assert message == "unknown config key 'plugins.p.depth'"


def test_an_unknown_key_for_a_plugin_with_config_is_named():
    assert error({"rec": rec(colour="red")}) == "unknown config key 'plugins.rec.colour'"


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"hooks": "on_publish"}, "plugins.rec.hooks: expected an array"),
        ({"hooks": [1]}, "plugins.rec.hooks[0]: expected str"),
        ({"answers": ["ok"]}, "plugins.rec.answers: expected a table"),
    ],
)
def test_a_wrong_type_for_a_config_key_is_named(keys, expected):
    assert error({"rec": rec(**keys)}).startswith(expected)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"enabled": "yes"}, "plugins.x.enabled: expected true or false"),
        ({"enabled": True, "priority": "1"}, "plugins.x.priority: expected an integer"),
        ({"enabled": True, "priority": True}, "plugins.x.priority: expected an integer"),
    ],
)
def test_bad_reserved_keys_are_named(keys, expected):
    assert error({"x": {"module": RECORDER, **keys}}).startswith(expected)


def test_priority_first_ascending_then_config_order():
    sections = {
        "a": rec(),
        "b": rec(priority=10),
        "c": rec(),
        "d": rec(priority=1),
        "e": rec(priority=10),
        "f": rec(priority=-5),
    }
    plugins = load_plugins(sections)
    assert [name for name, _ in plugins] == ["f", "d", "b", "e", "a", "c"]
    # ... and the hook chains keep that order.
    chain = Hooks(plugins).chain("auth_on_publish")
    assert [name for name, _, _ in chain.impls] == ["f", "d", "b", "e", "a", "c"]


def sample_plugin(cls: str) -> dict:
    return {"enabled": True, "module": f"tests.hooks.sample:{cls}"}


def test_a_misspelled_hook_stops_loading_naming_plugin_method_and_hook():
    assert error({"rec": rec(), "m": sample_plugin("Misspelled")}) == (
        "plugins.m: method auth_on_publsh is not a hook; did you mean auth_on_publish?"
    )


def test_a_hook_with_the_wrong_signature_stops_loading():
    assert error({"two": sample_plugin("TwoArguments")}) == (
        "plugins.two: hook on_publish(context, extra) must take one positional argument, "
        "the context"
    )


def test_hooks_lifecycle_methods_and_helpers_keep_the_contract(caplog):
    sections = {
        "rec": rec(),
        "p": sample_plugin("NoConfig"),
        "life": sample_plugin("WithLifecycle"),
    }
    with caplog.at_level(logging.WARNING):
        plugins = load_plugins(sections)
    assert [name for name, _ in plugins] == ["rec", "p", "life"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # The lifecycle methods still run with the broker.
    life = dict(plugins)["life"]
    lifecycles = plugin_doors(plugins).lifecycles
    assert [lifecycle.plugin for lifecycle in lifecycles] == ["life"]
    asyncio.run(call_all(lifecycles, "start"))
    assert life.started == 1
    asyncio.run(call_all(lifecycles, "stop"))
    assert life.started == 0


def test_other_async_hooks_are_fine():
    async_hooks = ["auth_on_publish", "auth_on_register_m5", "on_publish", "on_deliver"]
    [(_, plugin)] = load_plugins({"rec": rec(async_hooks=async_hooks)})
    hooks = Hooks([("rec", plugin)])
    assert not hooks.chain("auth_on_publish").synchronous
    assert not hooks.chain("on_deliver").synchronous
    assert hooks.chain("auth_on_subscribe").synchronous


# -- the real command ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('module = "tests.hooks.no_such_module:X"', "nautilus: plugins.bad: cannot load plugin"),
        ('module = "tests.hooks.sample"', "nautilus: plugins.bad.module: expected"),
        (f'module = "{RECORDER}"\nhooks = "all"', "nautilus: plugins.bad.hooks: expected an array"),
        (
            'module = "tests.hooks.sample:Misspelled"',
            "nautilus: plugins.bad: method auth_on_publsh is not a hook; did you mean",
        ),
        (
            'module = "tests.hooks.sample:TwoArguments"',
            "nautilus: plugins.bad: hook on_publish(context, extra) must take one",
        ),
        (
            'module = "tests.hooks.sample:AsyncBeforeAck"',
            "nautilus: plugins.bad: before_ack must be a plain method, not async",
        ),
    ],
)
def test_cli_exits_2_with_one_line_naming_the_plugin(tmp_path, table, expected):
    config = tmp_path / "nautilus.toml"
    config.write_text(
        '[[listeners]]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n'
        f"[plugins.bad]\nenabled = true\n{table}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NAUTILUS_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "broker", "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(expected), lines[0]
    assert done.stdout == ""


# -- plugins of a table of their own: [event_relay], [[bridges]] ---------------------------


def test_every_plugin_table_has_the_entry_point_that_names_its_plugin():
    declared = {entry.name for entry in entry_points(group=TABLES_GROUP)}  # setup.cfg's
    assert declared == set(PLUGIN_TABLES) == {"event_relay", "bridges"}


def test_a_plugin_table_loads_the_class_its_entry_point_names():
    config = config_from_dict(
        {
            "event_relay": {"enabled": True, "address": "127.0.0.1:0"},
            "bridges": [{"name": "b1", "address": "127.0.0.1:1", "topics": [{"pattern": "x/#"}]}],
        }
    )
    plugins = configured_plugins(config)
    assert [(name, type(plugin).__name__) for name, plugin in plugins] == [
        ("event_relay", "EventRelay"),  # first: its section asks for priority -1
        ("bridges", "BridgePlugin"),
    ]
    assert [deciders.table(name) for name, _ in plugins] == ["event_relay", "bridges"]


def test_a_plugin_section_cannot_take_the_name_of_a_plugin_table():
    assert error({"bridges": sample_plugin("NoConfig")}) == (
        "plugins.bridges: 'bridges' is the plugin of the [bridges] table"
    )


def test_a_plugin_table_no_entry_point_names_is_one_line(tmp_path):
    # An install older than the table's entry point: its metadata comes first on the path.
    stale = tmp_path / "nautilus_mqtt-0.1.0.dist-info"
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: nautilus-mqtt\nVersion: 0.1\n")
    (stale / "entry_points.txt").write_text("[nautilus.commands]\nevents = event_relay.cli:main\n")
    config = tmp_path / "nautilus.toml"
    config.write_text('[event_relay]\nenabled = true\naddress = "127.0.0.1:0"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("NAUTILUS_")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    done = subprocess.run(
        [sys.executable, "-m", "broker", "check-config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "nautilus check-config: event_relay: no installed plugin reads this table (the "
        "nautilus.tables entry points of nautilus-mqtt are missing: install it again, "
        "`pip install -e .` in a checkout)"
    ]
