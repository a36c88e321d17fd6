"""plugins/acl/plugin.py and reloader.py, called directly (no broker, no sockets)."""

from __future__ import annotations

import asyncio
import logging

import pytest

import plugins.acl.plugin as acl_plugin
from broker.config import ConfigError, build_section
from broker.plugins import load_plugins
from hooks import (
    FOREVER,
    NEXT,
    Error,
    MatchedAcl,
    Ok,
    PublishContext,
    SubscribeContext,
    TopicRequest,
)
from plugins.acl import PLUGIN, AclPlugin, RuleSet
from plugins.acl.plugin import NO_RULE
from plugins.acl.reloader import Reloader, load
from plugins.acl.schema import Config

from .helpers import write_acl

RULES = """\
topic read public/#
topic write in/+ label metered
user alice
topic alice/#
pattern read clients/%c/#
token write rooms/%(claim, room)
"""


def make(tmp_path, text: str = RULES, **keys) -> AclPlugin:
    path = write_acl(tmp_path / "acl", text)
    return PLUGIN(build_section(Config, {"acl_file": str(path), **keys}, "plugins.acl"))


def publish(plugin, topic, client_id="c", username=None, attributes=None):
    ctx = PublishContext(
        client_id=client_id,
        username=username,
        attributes={} if attributes is None else attributes,
        topic=topic,
        payload=b"",
    )
    return plugin.auth_on_publish(ctx)


def subscribe(plugin, *topics, client_id="c", username=None, attributes=None):
    ctx = SubscribeContext(
        client_id=client_id,
        username=username,
        attributes={} if attributes is None else attributes,
        topics=[TopicRequest(topic=t, qos=q) for t, q in topics],
    )
    return plugin.auth_on_subscribe(ctx)


# -- configuration -----------------------------------------------------------------------


def test_loaded_by_the_broker_from_its_config_table(tmp_path):
    path = write_acl(tmp_path / "acl", RULES)
    [(name, plugin)] = load_plugins(
        {"acl": {"enabled": True, "acl_file": str(path), "publish_rate_limits": {"x": 5}}}
    )
    assert name == "acl" and isinstance(plugin, AclPlugin)
    assert plugin.config.acl_reload_interval == 10
    assert len(plugin.rules) == 6


def test_a_missing_file_stops_the_start(tmp_path):
    with pytest.raises(ConfigError, match=r"^plugins\.acl\.acl_file: .*nope: No such file"):
        load_plugins({"acl": {"enabled": True, "acl_file": str(tmp_path / "nope")}})


def test_a_bad_line_stops_the_start_naming_file_and_line(tmp_path):
    path = write_acl(tmp_path / "acl", "topic a\n\nbogus b\n")
    with pytest.raises(ConfigError) as caught:
        load_plugins({"acl": {"enabled": True, "acl_file": str(path)}})
    assert str(caught.value) == (
        f"plugins.acl.acl_file: {path} line 3: "
        "unknown keyword 'bogus' (expected topic, user, pattern or token)"
    )


def test_a_file_that_is_not_utf8_stops_the_start(tmp_path):
    path = tmp_path / "acl"
    path.write_bytes(b"topic \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_plugins({"acl": {"enabled": True, "acl_file": str(path)}})


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"acl_file": 1}, "plugins.acl.acl_file: expected str, got int"),
        ({"acl_reload_interval": "soon"}, "plugins.acl.acl_reload_interval: expected seconds"),
        ({"publish_rate_limits": {"x": "many"}}, "plugins.acl.publish_rate_limits.x: expected"),
        ({"publish_rate_limits": {"x": 0}}, "plugins.acl.publish_rate_limits.x: must be 1"),
        ({"reload": 1}, "unknown config key 'plugins.acl.reload'"),
    ],
)
def test_bad_keys_are_named(tmp_path, keys, message):
    path = write_acl(tmp_path / "acl", RULES)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_plugins({"acl": {"enabled": True, "acl_file": str(path), **keys}})


# -- hooks -------------------------------------------------------------------------------


def allowed_by(name: str, pattern: str, cache_for: float | None = FOREVER) -> Ok:
    """Ok naming the rule that allowed a publish (Courier's matched_acl modifier), kept
    by the broker until the rules change (unless a rate limit counts each message)."""
    return Ok({"matched_acl": MatchedAcl(name, pattern)}, cache_for=cache_for)


def test_publish_is_ok_naming_the_rule_or_next(tmp_path):
    plugin = make(tmp_path)
    assert publish(plugin, "in/x") == allowed_by("metered", "in/+")
    assert publish(plugin, "alice/x", username="alice") == allowed_by("", "alice/#")
    assert publish(plugin, "alice/x", username="bob") == NO_RULE
    assert publish(plugin, "public/x") == NO_RULE  # read only
    # A pattern's substitutions are made in the reported pattern.
    room_7 = {"jwt_claims": {"room": 7}}
    assert publish(plugin, "rooms/7", attributes=room_7) == allowed_by("", "rooms/7")
    assert publish(plugin, "rooms/7", attributes={"jwt_claims": {"room": 8}}) == NO_RULE


def test_subscribe_notes_the_allowing_rule_on_each_request(tmp_path):
    plugin = make(tmp_path)
    ctx = SubscribeContext(
        client_id="c",
        topics=[TopicRequest(topic="public/a", qos=0), TopicRequest(topic="clients/c/x", qos=1)],
    )
    plugin.auth_on_subscribe(ctx)
    assert [r.matched_acl for r in ctx.topics] == [
        MatchedAcl("", "public/#"),
        MatchedAcl("", "clients/c/#"),
    ]


def test_subscribe_all_allowed_is_a_plain_ok(tmp_path):
    result = subscribe(make(tmp_path), ("public/#", 1), ("clients/c/+", 2))
    assert result == Ok()


def test_subscribe_refuses_topic_by_topic(tmp_path):
    result = subscribe(make(tmp_path), ("public/a", 1), ("secret", 2), ("clients/c/x", 2))
    assert result == Ok({"topics": [("public/a", 1), ("secret", 0x87), ("clients/c/x", 2)]})


def test_subscribe_with_nothing_allowed_is_next(tmp_path):
    assert subscribe(make(tmp_path), ("secret", 0), ("clients/other/x", 1)) is NEXT


def test_the_subscribe_modifier_passes_the_hook_contract(tmp_path):
    from hooks.spec import check_modifiers

    result = subscribe(make(tmp_path), ("public/a", 1), ("secret", 2))
    assert check_modifiers("auth_on_subscribe_m5", result.modifiers) is None


# -- caches ------------------------------------------------------------------------------


def test_decisions_are_cached_and_the_cache_is_bounded(tmp_path, monkeypatch):
    plugin = make(tmp_path)
    monkeypatch.setattr(acl_plugin, "CACHE_SIZE", 3)
    attributes: dict = {}
    assert type(publish(plugin, "in/x", attributes=attributes)) is Ok
    view = attributes[acl_plugin.VIEW]
    calls = []
    original = type(view).check
    monkeypatch.setattr(type(view), "check", lambda self, *a: calls.append(a) or original(self, *a))
    for _ in range(3):
        assert type(publish(plugin, "in/x", attributes=attributes)) is Ok
    assert calls == []  # decided once, then from the cache
    for topic in ("in/a", "in/b", "in/c", "in/d"):
        publish(plugin, topic, attributes=attributes)
    assert len(plugin._writes) == 3
    assert type(publish(plugin, "in/x", attributes=attributes)) is Ok
    assert calls[-1] == ("write", "in/x")  # evicted, decided again


def test_substitutions_are_resolved_once_per_connection(tmp_path):
    plugin = make(tmp_path)
    attributes: dict = {}
    subscribe(plugin, ("clients/c/x", 0), attributes=attributes)
    view = attributes[acl_plugin.VIEW]
    publish(plugin, "in/a", attributes=attributes)
    subscribe(plugin, ("clients/c/y", 0), attributes=attributes)
    assert attributes[acl_plugin.VIEW] is view


def test_new_claims_or_new_rules_make_a_new_view(tmp_path):
    plugin = make(tmp_path)
    attributes: dict = {"jwt_claims": {"room": 1}}
    assert type(publish(plugin, "rooms/1", attributes=attributes)) is Ok
    attributes["jwt_claims"] = {"room": 2}
    assert publish(plugin, "rooms/1", attributes=attributes) == NO_RULE
    assert type(publish(plugin, "rooms/2", attributes=attributes)) is Ok
    plugin.swap(RuleSet.from_text("topic write rooms/1\n"))
    assert type(publish(plugin, "rooms/1", attributes=attributes)) is Ok
    assert publish(plugin, "rooms/2", attributes=attributes) == NO_RULE


def test_a_swap_clears_the_decisions(tmp_path):
    plugin = make(tmp_path)
    assert publish(plugin, "new/x") == NO_RULE
    plugin.swap(RuleSet.from_text("topic new/#\n"))
    assert type(publish(plugin, "new/x")) is Ok
    assert publish(plugin, "in/x") == NO_RULE
    assert len(plugin._writes) == 2  # only what was decided since the swap


# -- rate limits -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limit_per_label_per_second(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(acl_plugin, "monotonic", clock)
    rules = "topic write free/# label unmetered\n" + RULES  # before `user alice`: for all
    plugin = make(tmp_path, rules, publish_rate_limits={"metered": 3})
    results = [publish(plugin, f"in/{i}", client_id=f"c{i}") for i in range(5)]
    assert results[:3] == [allowed_by("metered", "in/+", None)] * 3
    assert results[3:] == [Error("rate_limit_exceeded", 0x97)] * 2
    assert plugin.rate_limited == 2
    assert all(type(publish(plugin, "free/x")) is Ok for _ in range(10))  # no limit on its label
    assert type(publish(plugin, "alice/x", username="alice")) is Ok  # no label at all
    clock.now += 0.99
    assert publish(plugin, "in/x") == Error("rate_limit_exceeded", 0x97)
    clock.now += 0.02  # a new second: counting starts again
    assert [publish(plugin, "in/x") for _ in range(4)] == [
        allowed_by("metered", "in/+", None)
    ] * 3 + [Error("rate_limit_exceeded", 0x97)]


# -- reloading ---------------------------------------------------------------------------


def test_reloader_swaps_only_when_the_file_changed(tmp_path):
    path = write_acl(tmp_path / "acl", "topic a\n")
    stamp = load(str(path))[0]
    swapped = []
    reloader = Reloader(str(path), 1, stamp, swapped.append)
    assert reloader._check(reloader.stamp) is None  # unchanged: not even read
    write_acl(path, "topic a\ntopic b\n")
    reloader._apply(*reloader._check(reloader.stamp))
    assert [len(r) for r in swapped] == [4]
    assert reloader._check(reloader.stamp) is None


def test_reloader_keeps_the_rules_of_a_bad_file_and_says_so_once(tmp_path, caplog):
    path = write_acl(tmp_path / "acl", "topic a\n")
    swapped = []
    reloader = Reloader(str(path), 1, load(str(path))[0], swapped.append)
    write_acl(path, "topic a\ntopik b\n")
    with caplog.at_level(logging.INFO, logger="nautilus.plugins.acl"):
        reloader._apply(*reloader._check(reloader.stamp))
        assert reloader._check(reloader.stamp) is None  # the same bad file: not re-read
        path.unlink()
        reloader._apply(*reloader._check(reloader.stamp))
        reloader._apply(*reloader._check(reloader.stamp))
        write_acl(path, "topic c\n")
        reloader._apply(*reloader._check(reloader.stamp))
    assert [r.getMessage() for r in caplog.records] == [
        f"acl file {path} line 2: unknown keyword 'topik' (expected topic, user, pattern or "
        "token); keeping the previous rules",
        f"acl file {path}: No such file or directory; keeping the previous rules",
        f"acl file {path} reloaded: 2 rules",
    ]
    assert [r.rules[0].filter for r in swapped] == ["c"]


def test_reloader_timer_runs_until_stopped(tmp_path):
    path = write_acl(tmp_path / "acl", "topic a\n")

    async def scenario() -> None:
        swapped: asyncio.Queue = asyncio.Queue()
        reloader = Reloader(str(path), 0.05, load(str(path))[0], swapped.put_nowait)
        reloader.start()
        write_acl(path, "topic b\n")
        rules = await asyncio.wait_for(swapped.get(), 5)
        assert rules.rules[0].filter == "b"
        reloader.stop()
        assert reloader._timer is None

    asyncio.run(scenario())


def test_a_zero_interval_never_starts_the_timer(tmp_path):
    plugin = make(tmp_path, acl_reload_interval=0)

    async def scenario() -> None:
        plugin.start()
        assert plugin.reloader._timer is None
        plugin.stop()

    asyncio.run(scenario())
