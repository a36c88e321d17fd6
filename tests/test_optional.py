"""Optional libraries (broker/optional.py): a broker whose config does not need a library
starts and serves without it; one that needs a missing or broken one loses only the
listener, HTTP side or plugin that needs it, with one ERROR line naming the library and
the fix.

The brokers are the real command (`python -m broker`, tests/test_cli.py's BrokerProcess)
with PYTHONPATH starting at a directory of broken libraries: each package there raises
ImportError when imported, as a broken install does (websockets 17 removing a name the
broker imports was one). Every wait is on a stderr line or an acknowledgement; every
process is killed at teardown.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import queue
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker import optional
from broker.config import ConfigError, config_from_dict
from broker.plugins import Unavailable, configured_plugins, load_plugins
from hooks import Error
from tests.test_cli import TIMEOUT, BrokerProcess, Client, clean_env, nautilus

OPTIONAL = ["websockets", "proxyprotocol", "aiohttp", "redis", "msgpack", "plyvel", "jwt"]
DISTRIBUTION = {"proxyprotocol": "proxy-protocol", "jwt": "PyJWT"}
ERROR = re.compile(r"\bERROR\b")
TCP = '[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:0"\n'
# Anonymous clients, one TCP listener, no HTTP, memory store.
TCP_ONLY = (
    f'[broker]\nallow_anonymous = true\n{TCP}[http]\nenabled = false\n[store]\nbackend = "memory"\n'
)


@functools.cache
def requirements() -> tuple[str, ...]:
    """nautilus-mqtt's requirements as the brokers started here see them: from a process
    outside the checkout, whose root may hold a nautilus_mqtt.egg-info of its own."""
    code = (
        "import importlib.metadata, json; "
        "print(json.dumps(importlib.metadata.requires('nautilus-mqtt')))"
    )
    with tempfile.TemporaryDirectory() as elsewhere:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=elsewhere,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        )
    return tuple(json.loads(result.stdout) or ())


def declared(distribution: str) -> str:
    """What the installed nautilus-mqtt requires of `distribution` ('websockets>=13'),
    read here independently of broker/optional.py."""
    for line in requirements():
        spec, _, marker = line.partition(";")
        name = re.match(r"[A-Za-z0-9._-]+", spec)
        if name and name[0].lower() == distribution.lower() and "extra" not in marker:
            return spec.strip()
    raise AssertionError(f"nautilus-mqtt declares no {distribution}")


def broken_libraries(root: Path, *names: str) -> Path:
    """A directory of packages that raise ImportError when imported."""
    for name in names:
        package = root / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ImportError(\"cannot import name 'OP_BINARY' from '{name}.frames' "
            '(a broken install)")\n',
            encoding="utf-8",
        )
    return root


def env_with_broken(root: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return clean_env(PYTHONPATH=path)


@pytest.fixture
def start(tmp_path) -> Iterator:
    """start(config_text, broken=[names]): a broker whose stderr said it listens."""
    started: list[BrokerProcess] = []

    def run(text: str, broken: list[str]) -> BrokerProcess:
        config = tmp_path / "nautilus.toml"
        config.write_text(text, encoding="utf-8")
        env = env_with_broken(broken_libraries(tmp_path / "broken", *broken))
        process = BrokerProcess(config, cwd=tmp_path, env=env)
        started.append(process)
        return process

    try:
        yield run
    finally:
        for process in started:
            process.kill()


def round_trip(port: int) -> None:
    """Subscribe, publish, receive: the broker serves MQTT on `port`."""
    with contextlib.ExitStack() as clients:
        subscriber = Client(port, "subscriber")
        clients.callback(subscriber.close)
        publisher = Client(port, "publisher")
        clients.callback(publisher.close)
        subscriber.subscribe("optional/t", 1)
        publisher.publish("optional/t", b"served", qos=1)
        message = subscriber.expect_message()
        assert (message.topic, message.payload) == ("optional/t", b"served")


def lines_to_the_end(process: BrokerProcess) -> list[str]:
    assert process.stop() == 0
    return process.drain()


# --------------------------------------------------------------------------- real brokers


def test_a_tcp_only_broker_serves_with_every_optional_library_broken(start):
    process = start(
        TCP_ONLY,
        broken=OPTIONAL,
    )
    round_trip(process.port)
    lines = lines_to_the_end(process)
    assert not [line for line in lines if ERROR.search(line)], lines


WS = '[[listeners]]\ntype = "ws"\naddress = "127.0.0.1:0"\n'
PROXIED = '[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:0"\nproxy_protocol = true\n'


@pytest.mark.parametrize(
    ("extra", "http", "library", "what"),
    [
        (WS, "enabled = false", "websockets", "listeners[1] (ws on 127.0.0.1:0) not started"),
        (PROXIED, "enabled = false", "proxyprotocol", "listeners[1] (tcp on 127.0.0.1:0)"),
        ("", 'address = "127.0.0.1:0"', "aiohttp", "[http] on 127.0.0.1:0 not started"),
    ],
    ids=["ws-listener", "proxy-protocol-listener", "http"],
)
def test_a_broken_library_costs_only_what_needs_it(start, extra, http, library, what):
    process = start(
        f"[broker]\nallow_anonymous = true\n{TCP}{extra}[http]\n{http}\n"
        '[store]\nbackend = "memory"\n',
        broken=[library],
    )
    round_trip(process.port)  # listeners[0], TCP, serves
    lines = lines_to_the_end(process)
    errors = [line for line in lines if ERROR.search(line)]
    assert len(errors) == 1, lines
    distribution = DISTRIBUTION.get(library, library)
    assert what in errors[0]
    assert f"the {distribution} library cannot be imported" in errors[0]
    assert "OP_BINARY" in errors[0]  # what the library said
    assert errors[0].endswith(f"fix: pip install '{declared(distribution)}'")


def test_health_names_what_a_missing_library_left_out(start):
    # The broker serves MQTT on its other listeners, but it is not what it was configured
    # to be: /health says why (load balancers and rollouts see it), /status.json shows
    # the listener stopped.
    process = start(
        f"[broker]\nallow_anonymous = true\n{TCP}{WS}"
        '[http]\naddress = "127.0.0.1:0"\n[store]\nbackend = "memory"\n',
        broken=["websockets"],
    )
    port = process.wait_for(re.compile(r"HTTP on 127\.0\.0\.1:(\d+)"))[1]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT)
    assert refused.value.code == 503
    [reason] = json.loads(refused.value.read())["reasons"]
    assert reason.startswith("listeners[1] (ws on 127.0.0.1:0) not started: the websockets")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=TIMEOUT) as r:
        [node] = json.loads(r.read())  # [{node name: its figures}]
    listeners = next(iter(node.values()))["listeners"]
    assert [listener["status"] for listener in listeners] == ["running", "stopped"]
    round_trip(process.port)


def test_a_plugin_whose_library_is_broken_is_skipped_and_refuses_in_its_place(start):
    process = start(
        TCP_ONLY + "[plugins.redis_subs]\nenabled = true\n",
        broken=["redis"],
    )
    # Skipping an auth plugin must not allow what it would refuse: whatever it might have
    # decided is refused (with no plugin left in the chains, everything would be allowed).
    client = V5Client(process.port)
    try:
        assert client.subscribe("optional/t") == 0x87
        assert client.publish("optional/t") == 0x87
    finally:
        client.close()
    lines = lines_to_the_end(process)
    errors = [line for line in lines if ERROR.search(line)]
    assert len(errors) == 1, lines
    assert "plugins.redis_subs skipped" in errors[0]
    assert "the redis library cannot be imported" in errors[0]
    assert errors[0].endswith(f"fix: pip install '{declared('redis')}'")
    assert "no built-in plugin" not in errors[0]
    assert not [line for line in lines if "plugin redis_subs enabled" in line]


@pytest.mark.parametrize(
    ("sections", "library", "status", "what"),
    [
        (
            '[cluster]\naddress = "127.0.0.1:0"\n[plugins.redis_subs]\nenabled = true\n',
            "msgpack",
            2,
            "nautilus: [cluster] cannot start: the msgpack library",
        ),
        (
            '[store]\nbackend = "leveldb"\npath = "data"\n',
            "plyvel",
            1,
            "nautilus: [store] backend = leveldb cannot open: the plyvel library",
        ),
    ],
    ids=["cluster", "leveldb-store"],
)
def test_a_cluster_or_store_without_its_library_stops_start_up_with_one_line(
    tmp_path, sections, library, status, what
):
    # A node of a cluster does not serve alone, nor a broker without the store it was
    # given: these stop, as a config error or a store error does.
    config = tmp_path / "nautilus.toml"
    config.write_text(f"{TCP}[http]\nenabled = false\n{sections}", encoding="utf-8")
    env = env_with_broken(broken_libraries(tmp_path / "broken", library))
    result = nautilus("--config", str(config), cwd=tmp_path, env=env)
    assert result.returncode == status, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(what), result.stderr
    assert last.endswith(f"fix: pip install '{declared(library)}'")
    assert "Traceback" not in result.stderr


class V5Client:
    """A paho-mqtt MQTT 5 client that reports the reason codes of its acknowledgements."""

    def __init__(self, port: int) -> None:
        self.acks: queue.Queue[int] = queue.Queue()
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="v5", protocol=mqtt.MQTTv5)
        self.paho.on_connect = lambda c, u, flags, code, p: self.acks.put(code.value)
        self.paho.on_subscribe = lambda c, u, mid, codes, p: self.acks.put(codes[0].value)
        self.paho.on_publish = lambda c, u, mid, code, p: self.acks.put(code.value)
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        assert self.acks.get(timeout=TIMEOUT) == 0  # CONNACK: allow_anonymous

    def subscribe(self, topic: str) -> int:
        self.paho.subscribe(topic, 1)
        return self.acks.get(timeout=TIMEOUT)

    def publish(self, topic: str) -> int:
        self.paho.publish(topic, b"refused?", qos=1)
        return self.acks.get(timeout=TIMEOUT)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.paho.disconnect()
        self.paho.loop_stop()


# --------------------------------------------------------------------------- in process


def test_the_fix_is_the_declared_requirement():
    # This process's metadata (which may be the checkout's egg-info, not the brokers').
    lines = importlib.metadata.requires("nautilus-mqtt") or []
    websockets = next(line for line in lines if line.startswith("websockets"))
    assert optional.requirement("websockets") == websockets.partition(";")[0].strip()
    jwt = next(line for line in lines if line.startswith("PyJWT"))
    # Names compare normalized; extras are kept.
    assert optional.requirement("pyjwt") == jwt.partition(";")[0].strip()
    assert optional.requirement("uvloop").startswith("uvloop>=")  # the marker left out
    assert optional.requirement("no-such-distribution") == "no-such-distribution"


def test_an_import_error_of_our_own_is_a_bug_not_a_missing_library():
    with pytest.raises(ModuleNotFoundError):
        optional.load("broker.no_such_module", "nothing")


def test_a_plugin_needing_a_missing_library_is_replaced_by_a_refusal(tmp_path, monkeypatch, caplog):
    package = tmp_path / "needs_lib_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import nautilus_no_such_library\n\nclass Plugin:\n    pass\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="nautilus.plugins"):
        [(name, plugin)] = load_plugins(
            {"needs": {"enabled": True, "module": "needs_lib_plugin:Plugin"}}
        )
    assert name == "needs"
    assert isinstance(plugin, Unavailable)
    for hook in ("auth_on_register", "auth_on_publish_m5", "auth_on_subscribe", "on_auth_m5"):
        assert isinstance(getattr(plugin, hook)(None), Error)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == plugin.problem
    assert "the nautilus_no_such_library library cannot be imported" in plugin.problem
    assert plugin.problem.endswith("fix: pip install 'nautilus_no_such_library'")


def test_a_plugin_that_is_not_there_is_still_a_config_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no built-in plugin of that name"):
        load_plugins({"no_such_plugin": {"enabled": True}})
    # An import error inside the plugin's own package is the plugin's, not a library's.
    package = tmp_path / "half_plugin"
    package.mkdir()
    (package / "__init__.py").write_text("from half_plugin.part import X\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"No module named 'half_plugin\.part'"):
        load_plugins({"half": {"enabled": True, "module": "half_plugin:Plugin"}})


def test_a_library_a_plugin_imports_as_it_is_built_also_skips_it(monkeypatch, caplog):
    # The event relay imports protobuf only when its sidecar push is on: in its constructor.
    for module in [m for m in sys.modules if m.startswith(("event_relay.sidecar", "google.pro"))]:
        monkeypatch.delitem(sys.modules, module)  # put back after the test
    monkeypatch.setitem(sys.modules, "google.protobuf", None)  # unimportable
    with caplog.at_level(logging.ERROR, logger="nautilus.plugins"):
        [(name, plugin)] = configured_plugins(
            config_from_dict({"event_relay": {"sidecar": {"enabled": True}}})
        )
    assert name == "event_relay"
    assert isinstance(plugin, Unavailable)
    [record] = caplog.records
    assert record.getMessage().startswith("event_relay skipped")
    assert "the protobuf library cannot be imported" in plugin.problem
    assert plugin.problem.endswith(f"fix: pip install '{optional.requirement('protobuf')}'")


def test_nautilus_spark_without_pyspark_says_how_to_install_it_in_one_line(tmp_path):
    env = env_with_broken(broken_libraries(tmp_path, "pyspark"))
    code = "import sys, spark_consumers; sys.exit(spark_consumers.main(['--help']))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("nautilus-spark: PySpark cannot be imported")
    assert "pip install 'nautilus-mqtt[spark]'" in line
