"""The side doors (hooks/spec.py SIDE_DOORS, hooks/side_doors.py): what the broker finds
on a plugin besides its hooks, held to its declaration when the plugin loads, and resolved
once (plugin_doors) for the parts that use them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.plugins import load_plugins
from hooks import (
    SIDE_DOORS,
    Hooks,
    MatchedAcl,
    PluginDoors,
    PluginError,
    RecordedClient,
    RecordedDelivery,
    RecordedMessage,
    SideDoors,
    check_plugin,
    plugin_doors,
    side_doors,
)

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    def published(self, client, message, matched_acl) -> None:
        pass

    def delivered(self, session, delivery) -> None:
        pass

    def completed(self, session, delivery) -> None:
        pass

    def published_run(self, client, topic, payloads, receivers, matched_acl) -> None:
        pass


class Backend:
    """Stands for a cluster metadata backend."""


class Bridges:
    def rows(self) -> list:
        return [{"name": "b1"}]

    async def run(self, name: str, running: bool) -> None:
        pass


class EveryDoor:
    """A plugin with every side door, each as the broker calls it."""

    metadata = "redis"

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.bridges = Bridges()

    async def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def before_ack(self) -> bool:
        return True

    def metrics(self) -> list:
        return []

    def metadata_backend(self, dead_after: float) -> Backend:
        return Backend()

    async def invalidate(self, client_id: str | None, username: str | None) -> int:
        return 0

    def placement(self, node: str, alive) -> None:
        pass

    def reload_tls(self) -> None:
        pass


def plugin(**attributes):
    """A plugin object with these attributes (functions become methods)."""
    return type("Plugin", (), attributes)()


def recorder(**methods):
    """A Recorder with these methods replaced (None: without it)."""
    return type("BadRecorder", (Recorder,), methods)()


def bridges(**methods):
    """A Bridges with these methods replaced (None: without it)."""
    return type("BadBridges", (Bridges,), methods)()


def problem(bad) -> str:
    """The one-line problem check_plugin finds, checked to name the plugin."""
    with pytest.raises(PluginError) as info:
        check_plugin("bad", bad)
    assert info.value.plugin == "bad"
    assert str(info.value) == f"plugin bad: {info.value.problem}"
    assert "\n" not in str(info.value)
    return info.value.problem


# -- the declaration ------------------------------------------------------------------------


def test_every_declared_door_is_looked_up_and_nothing_else():
    assert [f.name for f in dataclasses.fields(SideDoors)] == list(SIDE_DOORS)


def test_the_declared_signatures():
    assert {name: door.signature for name, door in SIDE_DOORS.items()} == {
        "start": "[async] start() -> None",
        "stop": "[async] stop() -> None",
        "before_ack": "before_ack() -> bool",
        "metrics": "metrics() -> Iterable[Metric]",
        "metadata": "metadata: str",
        "metadata_backend": "metadata_backend(dead_after) -> MetadataBackend",
        "invalidate": "[async] invalidate(client_id, username) -> int",
        "bridges": "bridges: BridgeControl",
        "placement": "placement(node, alive) -> None",
        "reload_tls": "reload_tls() -> None",
        "recorder": "recorder: MessageRecorder",
    }


# -- well-formed doors --------------------------------------------------------------------


def test_a_plugin_with_every_door_passes_and_they_are_found():
    every = EveryDoor()
    check_plugin("every", every)
    doors = side_doors(every)
    assert doors.start == every.start
    assert doors.stop == every.stop
    assert doors.invalidate == every.invalidate
    assert doors.before_ack == every.before_ack
    assert doors.metrics == every.metrics
    assert doors.metadata == "redis"
    assert doors.metadata_backend == every.metadata_backend
    assert doors.bridges is every.bridges
    assert doors.placement == every.placement
    assert doors.reload_tls == every.reload_tls
    assert doors.recorder is every.recorder


def test_a_plugin_without_doors_has_none():
    check_plugin("plain", object())
    assert side_doors(object()) == SideDoors()


def test_none_hides_a_door():
    hidden = plugin(before_ack=None, recorder=None, metadata=None, start=None)
    check_plugin("hidden", hidden)
    assert side_doors(hidden) == SideDoors()


@pytest.mark.parametrize(
    "attributes",
    [
        {"start": lambda self, *args: None},  # *args: callable without arguments
        {"stop": lambda self, timeout=5.0: None},  # a default: callable without arguments
        {"metadata_backend": lambda self, *args: None, "metadata": "redis"},
    ],
    ids=["varargs", "default", "backend-varargs"],
)
def test_extra_parameters_with_defaults_are_fine(attributes):
    check_plugin("fine", plugin(**attributes))


def test_a_door_set_on_the_instance_counts():
    class Acknowledged:
        def __init__(self, durable: bool) -> None:
            if durable:
                self.before_ack = self._flush

        def _flush(self) -> bool:
            return True

    durable = Acknowledged(durable=True)
    assert side_doors(durable).before_ack == durable._flush
    assert side_doors(Acknowledged(durable=False)).before_ack is None


def test_a_compiled_recorder_without_signatures_is_trusted():
    compiled = pytest.importorskip("event_relay._recorder")
    recorder = compiled.Recorder(_Log(), {"on_publish"}, "full", {}, lambda callback: None)
    check_plugin("relay", plugin(recorder=recorder))


class _Log:
    next_seq = 1

    def append(self, code, values) -> None:
        pass

    def append_records(self, *args) -> None:
        pass


# -- malformed doors: one line naming the plugin and the attribute ------------------------


async def _async(self, *args):
    return True


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"start": 3}, "start is not callable (it is int)"),
        ({"stop": lambda self, force: None}, "stop(force) cannot be called as stop()"),
        (
            {"before_ack": _async},
            "before_ack must be a plain method, not async: the broker does not await it",
        ),
        (
            {"before_ack": lambda self, turn: True},
            "before_ack(turn) cannot be called as before_ack()",
        ),
        ({"metrics": [1, 2]}, "metrics is not callable (it is list)"),
        ({"metrics": _async}, "metrics must be a plain method, not async: the broker does not"),
        ({"metadata": 5, "metadata_backend": lambda self, d: None}, "metadata must be a non-empty"),
        (
            {"metadata": "", "metadata_backend": lambda self, d: None},
            "metadata must be a non-empty",
        ),
        (
            {"metadata": "redis"},
            "metadata needs metadata_backend(dead_after) -> MetadataBackend beside it",
        ),
        ({"metadata_backend": lambda self, d: None}, "metadata_backend needs metadata: str beside"),
        (
            {"metadata": "redis", "metadata_backend": lambda self: None},
            "metadata_backend() cannot be called as metadata_backend(dead_after)",
        ),
        (
            {"metadata": "redis", "metadata_backend": _async},
            "metadata_backend must be a plain method, not async",
        ),
        ({"recorder": 1}, "recorder int has no method published (MessageRecorder)"),
        (
            {"recorder": recorder(completed=None)},
            "recorder BadRecorder has no method completed (MessageRecorder)",
        ),
        (
            {"recorder": recorder(published=lambda self, c, m: None)},
            "recorder.published(c, m) cannot be called as published(client, message, matched_acl)",
        ),
        (
            {"recorder": recorder(delivered=_async)},
            "recorder.delivered must be a plain method, not async",
        ),
        ({"bridges": 1}, "bridges int has no method rows (BridgeControl)"),
        ({"bridges": bridges(run=None)}, "bridges BadBridges has no method run (BridgeControl)"),
        ({"bridges": bridges(rows=_async)}, "bridges.rows must be a plain method, not async"),
        (
            {"bridges": bridges(run=lambda self, name: None)},
            "bridges.run(name) cannot be called as run(name, running)",
        ),
    ],
    ids=lambda value: "" if isinstance(value, str) else "-".join(value),
)
def test_a_malformed_door_stops_loading(attributes, expected):
    assert problem(plugin(**attributes)).startswith(expected)


def test_hooks_refuse_a_malformed_door_too():
    with pytest.raises(PluginError, match=r"^plugin bad: before_ack must be a plain method"):
        Hooks([("fine", EveryDoor()), ("bad", plugin(before_ack=_async))])


def test_the_loader_names_the_config_table():
    with pytest.raises(ConfigError) as info:
        load_plugins({"bad": {"enabled": True, "module": "tests.hooks.sample:AsyncBeforeAck"}})
    assert str(info.value) == (
        "plugins.bad: before_ack must be a plain method, not async: the broker does not await it"
    )


def test_a_broker_refuses_to_start_with_a_malformed_door(start_broker):
    with pytest.raises(ConfigError, match=r"^plugins\.bad: before_ack must be a plain method"):
        start_broker(
            plugins={"bad": {"enabled": True, "module": "tests.hooks.sample:AsyncBeforeAck"}}
        )


# -- resolved once, for the parts that use them ---------------------------------------------


def test_the_doors_of_every_plugin_in_call_order_by_use():
    every, other = EveryDoor(), EveryDoor()
    doors = plugin_doors([("every", every), ("bare", object()), ("other", other)])
    assert [(d.plugin, d.start, d.stop) for d in doors.lifecycles] == [
        ("every", every.start, every.stop),
        ("other", other.start, other.stop),
    ]
    assert doors.before_ack == (every.before_ack, other.before_ack)
    assert doors.metrics == (("every", every.metrics), ("other", other.metrics))
    assert doors.invalidate == (("every", every.invalidate), ("other", other.invalidate))
    assert doors.bridges == (every.bridges, other.bridges)
    assert doors.placement == (every.placement, other.placement)
    assert doors.reload_tls == (("every", every.reload_tls), ("other", other.reload_tls))
    assert doors.metadata_backends == {"redis": every.metadata_backend}  # the first's


def test_a_disabled_plugin_loses_its_say_and_keeps_its_own_work():
    every = EveryDoor()
    doors = plugin_doors([("every", every)], disabled={"every"})
    assert doors.before_ack == () and doors.invalidate == ()
    assert doors.metrics == (("every", every.metrics),)
    assert doors.bridges == (every.bridges,)
    assert [d.plugin for d in doors.lifecycles] == ["every"]
    assert doors.reload_tls == (("every", every.reload_tls),)


def test_no_plugins_no_doors():
    assert plugin_doors([]) == PluginDoors()


def test_a_disabled_plugins_before_ack_waits_until_it_is_enabled_again(start_broker, paho_client):
    keeper = {"enabled": True, "module": "tests.hooks.sample:KeepsBeforeAck"}
    server = start_broker(plugins={"keeper": keeper})
    plugin = dict(server.broker.plugins)["keeper"]
    client = paho_client(server)

    def calls_after_a_qos1_publish() -> int:
        client.publish("t", b"x", qos=1)  # returns once acknowledged
        return server.call(lambda: plugin.before_ack_calls)

    called = calls_after_a_qos1_publish()
    assert called >= 1
    server.call(server.broker.set_plugin_enabled, "keeper", False)
    assert calls_after_a_qos1_publish() == called
    server.call(server.broker.set_plugin_enabled, "keeper", True)
    assert calls_after_a_qos1_publish() > called


# -- the broker asks the contract ---------------------------------------------------------

_SIDE_DOOR_GETATTR = re.compile(r"getattr\([^,]+,\s*[\"'](" + "|".join(SIDE_DOORS) + r")[\"']")


@pytest.mark.parametrize("package", ["broker", "plugins", "event_relay"])
def test_no_one_else_looks_a_side_door_up_by_name(package):
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for match in _SIDE_DOOR_GETATTR.finditer(path.read_text())
    ]
    assert not found, "use the broker's PluginDoors (hooks.plugin_doors) instead: " + ", ".join(
        found
    )


def test_the_broker_resolves_the_side_doors_once():
    """Only when the plugins load or change (hooks.plugin_doors), never per use."""
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "broker").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "side_doors(" in line
    ]
    assert not found, "carry the broker's PluginDoors (`doors`) instead: " + ", ".join(found)


# -- the recorder's protocol and the compiled recorder ------------------------------------


def _members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if isinstance(value, property)}


def test_the_compiled_recorder_reads_only_the_protocols_fields():
    """event_relay/_recorder.c reads the broker's objects by field name, which no type
    checker sees: each `static Field X_NAME = {"field"}` must be a member of the protocol
    its prefix stands for (hooks/recorder.py)."""
    source = (ROOT / "event_relay" / "_recorder.c").read_text()
    fields = re.findall(r"\b([DMAPR])_[A-Z_]+ = \{\"(\w+)\"\}", source)
    assert len(fields) == 19  # what the file declares today: a new one is found too
    protocols = {
        "D": _members(RecordedDelivery),
        "M": _members(RecordedMessage),
        "A": {field.name for field in dataclasses.fields(MatchedAcl)},
        "P": _members(RecordedClient),
        "R": _members(RecordedClient),
    }
    unknown = [(prefix, name) for prefix, name in fields if name not in protocols[prefix]]
    assert not unknown, f"read by _recorder.c, not in hooks/recorder.py: {unknown}"
