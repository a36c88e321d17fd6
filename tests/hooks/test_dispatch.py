"""The hook engine on its own (hooks.dispatch), as pluggy's testing/test_multicall.py does.

`MC(impls)` builds a Chain straight from functions and runs it the way the broker does:
all_till_ok through `run()` (awaited with asyncio.run) and, for a chain with no async
implementation, through `run_sync()` as well, checking both agree.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest

from hooks import HOOKS, NEXT, Chain, Error, Hooks, Next, Ok, PluginError, PublishContext

CONTEXT = PublishContext(client_id="c", topic="a/b", payload=b"x", qos=1)


def chain_of(impls, hook: str = "auth_on_publish") -> Chain:
    return Chain(
        hook,
        tuple((f"p{i}", impl, inspect.iscoroutinefunction(impl)) for i, impl in enumerate(impls)),
    )


def MC(impls, hook: str = "auth_on_publish", context=CONTEXT):  # pluggy's name
    chain = chain_of(impls, hook)
    result = asyncio.run(chain.run(context))
    if chain.synchronous:
        assert chain.run_sync(context) == result
    return result


def answer(value, calls: list | None = None, name: str = ""):
    """A sync implementation returning `value` (and noting its call in `calls`)."""

    def impl(context):
        if calls is not None:
            calls.append(name)
        return value

    return impl


def async_answer(value, calls: list | None = None, name: str = ""):
    async def impl(context):
        await asyncio.sleep(0)
        if calls is not None:
            calls.append(name)
        return value

    return impl


def crash(context):
    raise RuntimeError("boom")


def never(context):
    raise AssertionError("called after the chain was decided")


# -- all_till_ok: the result rules --------------------------------------------------------


def test_ok_stops_and_allows():
    result = MC([answer(Ok()), never])
    assert type(result) is Ok
    assert result.modifiers == {}


def test_ok_with_modifiers_passes_them_on():
    result = MC([answer(NEXT), answer(Ok({"payload": b"new", "qos": 0})), never])
    assert result == Ok({"payload": b"new", "qos": 0})


def test_error_stops_and_denies():
    assert MC([answer(Error("banned", 0x8A)), never]) == Error("banned", 0x8A)


def test_error_defaults_to_not_authorized():
    assert MC([answer(Error())]) == Error("not_authorized", None)


def test_next_asks_the_next_plugin():
    calls: list[str] = []
    result = MC([answer(NEXT, calls, "a"), answer(NEXT, calls, "b"), answer(Ok(), calls, "c")])
    assert result == Ok()
    assert calls == ["a", "b", "c"] * 2  # run() then run_sync()


def test_a_new_next_instance_also_asks_the_next_plugin():
    # `Next` is public (hooks.__all__): Next() must mean what NEXT means.
    assert MC([answer(Next()), answer(Ok())]) == Ok()
    assert MC([answer(Next()), answer(Next())]) == Error("plugin_chain_exhausted")


def test_none_asks_the_next_plugin():
    # A hook that returns None (or falls off its end) has no opinion, as NEXT.
    def silent(context):
        pass

    async def async_silent(context):
        await asyncio.sleep(0)

    calls: list[str] = []
    assert MC([silent, answer(None, calls, "b"), answer(Ok(), calls, "c")]) == Ok()
    assert calls == ["b", "c"] * 2  # run() then run_sync()
    assert MC([async_silent, answer(Error("no")), never]) == Error("no")
    assert MC([silent, async_silent]) == Error("plugin_chain_exhausted")


def test_exhausted_chain_denies():
    assert MC([answer(NEXT), answer(NEXT)]) == Error("plugin_chain_exhausted")


def test_empty_chain_is_falsy_and_denies():
    chain = chain_of([])
    assert not chain
    assert chain.synchronous
    assert chain.run_sync(CONTEXT) == Error("plugin_chain_exhausted")
    assert chain_of([answer(Ok())])


@pytest.mark.parametrize(
    "value",
    [True, False, "ok", 0, {"ok": True}, Ok, Next, Error, ("ok",)],
    ids=repr,
)
def test_anything_else_is_an_invalid_result(value, caplog):
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        assert MC([answer(value), never]) == Error("invalid_result")
    assert "not Ok, Error, Next or None" in caplog.text


def test_a_crash_denies_even_if_a_later_plugin_would_allow(caplog):
    chain = chain_of([answer(NEXT), crash, answer(Ok())])
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        assert chain.run_sync(CONTEXT) == Error("plugin_crashed")
        assert asyncio.run(chain.run(CONTEXT)) == Error("plugin_crashed")
    assert chain.crashes == 2
    assert "plugin p1 crashed in auth_on_publish" in caplog.text
    assert "RuntimeError: boom" in caplog.text  # the traceback is logged


def test_an_async_crash_denies():
    async def async_crash(context):
        await asyncio.sleep(0)
        raise ValueError("async boom")

    chain = chain_of([async_crash, answer(Ok())])
    assert asyncio.run(chain.run(CONTEXT)) == Error("plugin_crashed")
    assert chain.crashes == 1


def test_cancellation_is_not_swallowed():
    # CancelledError is not a plugin failure: it must reach the connection's task.
    async def cancelled(context):
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(chain_of([cancelled, answer(Ok())]).run(CONTEXT))


# -- modifier allow-lists -------------------------------------------------------------------

GOOD = {
    "auth_on_register": {
        "username": "u",
        "client_id": "c2",
        "max_inflight_messages": 5,
        "max_online_messages": 0,
        "max_offline_messages": -1,
        "max_message_size": 1024,
        "max_message_rate": 0,
        "retry_interval": 30,
        "clean_start": False,
        "queue_type": "lifo",
        "shared_subscription_policy": "random",
        "mountpoint": "tenant-a",
        "subscriber_id": {"mountpoint": "tenant-b", "client_id": "c3"},
        "properties": {},
    },
    "auth_on_publish": {
        "topic": "a/b",
        "payload": b"x",
        "qos": 2,
        "retain": True,
        "mountpoint": "tenant-a",
        "properties": {},
    },
    "auth_on_subscribe": {"topics": [("a/#", 1), ["b", 128]], "properties": {}},
    "on_unsubscribe": {"topics": ["a/#"], "properties": {0x1F: "bye"}},
    "on_deliver": {"topic": "x/y", "payload": b"y", "properties": {}},
}
UNKNOWN = {
    "auth_on_register": {"topic": "a"},
    "auth_on_publish": {"username": "u"},
    "auth_on_subscribe": {"qos": 1},
    "on_unsubscribe": {"qos": 1},
    "on_deliver": {"qos": 1},
}
INVALID = {
    "auth_on_register": [
        {"max_inflight_messages": "5"},
        {"max_online_messages": True},
        {"max_online_messages": -2},
        {"max_inflight_messages": -1},
        {"max_message_rate": -1},
        {"retry_interval": -5},
        {"max_message_size": -1},
        {"queue_type": "stack"},
        {"clean_start": 1},
        {"username": b"u"},
        {"shared_subscription_policy": "everyone"},
        {"mountpoint": "a/b"},  # one tree inside another
        {"mountpoint": "$sys"},
        {"mountpoint": 1},
        {"subscriber_id": {"mountpoint": "m"}},  # VerneMQ's pair needs both
        {"subscriber_id": ("m", "")},
        {"subscriber_id": "m"},
    ],
    "auth_on_publish": [
        {"topic": "a/+"},
        {"topic": "a/#"},
        {"topic": ""},
        {"topic": b"a"},
        {"payload": "text"},
        {"qos": 3},
        {"qos": True},
        {"retain": 1},
        {"properties": [1]},
        {"mountpoint": "+"},
    ],
    "auth_on_subscribe": [
        {"topics": "a/#"},
        {"topics": [("a",)]},
        {"topics": [(1, 1)]},
        {"topics": [42]},
    ],
    "on_deliver": [{"payload": "text"}, {"topic": "a/#"}, {"topic": None}],
}


def _both(hook: str) -> list[str]:
    return [hook, f"{hook}_m5"]


# What VerneMQ accepts and Nautilus does not apply: refused, saying why.
UNSUPPORTED = {
    "auth_on_register": [
        ("allow_register", True, "netsplit"),
        ("allow_publish", False, "netsplit"),
        ("allow_subscribe", True, "netsplit"),
        ("allow_unsubscribe", True, "netsplit"),
        ("max_connection_lifetime", 60, "no lifetime limit"),
        ("max_drain_time", 10, "queue migration"),
        ("max_msgs_per_drain_step", 100, "queue migration"),
        ("upgrade_qos", True, "broker.upgrade_outgoing_qos"),
        ("upgrade_qos", False, "broker.upgrade_outgoing_qos"),
    ],
    "auth_on_publish": [
        ("throttle", 10, "max_message_rate"),
    ],
    "auth_on_subscribe": [("properties", {0x26: [("k", "v")]}, "a refusal's does")],
}


@pytest.mark.parametrize(
    ("hook", "key", "value", "why"),
    [(h, *case) for base, cases in UNSUPPORTED.items() for h in _both(base) for case in cases],
)
def test_an_unsupported_modifier_is_an_error_that_says_why(hook, key, value, why, caplog):
    modifiers = {**GOOD[hook.removesuffix("_m5")], key: value}
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        assert MC([answer(Ok(modifiers)), never], hook) == Error("invalid_modifiers")
    [message] = {record.getMessage() for record in caplog.records}  # run(), run_sync()
    assert message.startswith(
        f"plugin p0: modifier {key!r} of {hook} is not supported by Nautilus: "
    ), message
    assert why in message
    assert message.endswith("; treated as an error")


@pytest.mark.parametrize("hook", [h for base in GOOD for h in _both(base)])
def test_allowed_modifiers_pass(hook):
    modifiers = GOOD[hook.removesuffix("_m5")]
    assert MC([answer(Ok(modifiers))], hook) == Ok(modifiers)


@pytest.mark.parametrize("hook", [h for base in UNKNOWN for h in _both(base)])
def test_an_unknown_modifier_is_an_error(hook, caplog):
    modifiers = {**GOOD[hook.removesuffix("_m5")], **UNKNOWN[hook.removesuffix("_m5")]}
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        assert MC([answer(Ok(modifiers)), never], hook) == Error("invalid_modifiers")
    assert "is not allowed in" in caplog.text


@pytest.mark.parametrize(
    ("hook", "modifiers"),
    [(h, m) for base, cases in INVALID.items() for h in _both(base) for m in cases],
)
def test_an_invalid_modifier_value_is_an_error(hook, modifiers, caplog):
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        assert MC([answer(Ok(modifiers)), never], hook) == Error("invalid_modifiers")
    assert "invalid value" in caplog.text


# -- building chains from plugins ---------------------------------------------------------


class V4Only:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def auth_on_publish(self, context):
        self.calls.append("v4")
        return Ok()


class Both(V4Only):
    def auth_on_publish_m5(self, context):
        self.calls.append("m5")
        return Ok()


def test_the_v4_method_serves_the_m5_hook():
    calls: list[str] = []
    hooks = Hooks([("p", V4Only(calls))])
    assert hooks.chain("auth_on_publish_m5").run_sync(CONTEXT) == Ok()
    assert hooks.chain("auth_on_publish").run_sync(CONTEXT) == Ok()
    assert calls == ["v4", "v4"]


def test_the_m5_method_wins_when_both_exist():
    calls: list[str] = []
    hooks = Hooks([("p", Both(calls))])
    hooks.chain("auth_on_publish_m5").run_sync(CONTEXT)
    hooks.chain("auth_on_publish").run_sync(CONTEXT)
    assert calls == ["m5", "v4"]


def test_every_m5_hook_falls_back_to_its_v4_name():
    for name, spec in HOOKS.items():
        if name.endswith("_m5") and name != "on_auth_m5":
            assert spec.v4_fallback == name.removesuffix("_m5")
    assert HOOKS["on_auth_m5"].v4_fallback is None


class Named:
    def __init__(self, name: str, calls: list[str], result=NEXT) -> None:
        self.name, self.calls, self.result = name, calls, result

    def auth_on_subscribe(self, context):
        self.calls.append(self.name)
        return self.result


def test_chains_follow_plugin_order():
    calls: list[str] = []
    hooks = Hooks([(n, Named(n, calls)) for n in ("c", "a", "b")])
    chain = hooks.chain("auth_on_subscribe")
    assert [plugin for plugin, _, _ in chain.impls] == ["c", "a", "b"]
    assert chain.run_sync(CONTEXT) == Error("plugin_chain_exhausted")
    assert calls == ["c", "a", "b"]


def test_hooks_nobody_implements_are_empty_chains():
    hooks = Hooks([("p", V4Only([])), ("q", object())])
    assert hooks.chain("auth_on_publish")
    assert [name for name in HOOKS if hooks.chain(name)] == [
        "auth_on_publish",
        "auth_on_publish_m5",
    ]
    assert not Hooks().chain("on_publish")


def test_versions_gives_a_pair_as_mqtt3_then_mqtt5():
    calls: list[str] = []
    hooks = Hooks([("p", Both(calls)), ("q", V4Only(calls))])
    v3, v5 = hooks.versions("auth_on_publish")
    assert (v3, v5) == (hooks.chain("auth_on_publish"), hooks.chain("auth_on_publish_m5"))
    v3.run_sync(CONTEXT)
    v5.run_sync(CONTEXT)
    assert calls == ["v4", "m5"]  # p decided each time: v4 for MQTT 3, m5 for MQTT 5
    pairs = [name for name in HOOKS if f"{name}_m5" in HOOKS]
    assert len(pairs) == 8
    for name in pairs:
        assert hooks.versions(name) == (hooks.chain(name), hooks.chain(f"{name}_m5"))


@pytest.mark.parametrize("name", ["auth_on_publish_m5", "on_auth_m5", "on_client_gone", "x"])
def test_versions_refuses_what_is_not_a_pair(name):
    with pytest.raises(KeyError, match="is not the MQTT 3 name of a hook pair"):
        Hooks().versions(name)


def test_sync_and_async_implementations_mixed():
    calls: list[str] = []
    impls = [
        answer(NEXT, calls, "sync1"),
        async_answer(NEXT, calls, "async"),
        answer(Ok({"qos": 0}), calls, "sync2"),
    ]
    chain = chain_of(impls)
    assert not chain.synchronous  # the broker must await run(), not call run_sync()
    assert asyncio.run(chain.run(CONTEXT)) == Ok({"qos": 0})
    assert calls == ["sync1", "async", "sync2"]


def test_async_results_follow_the_same_rules():
    assert MC([async_answer(Error("no")), never]) == Error("no")
    assert MC([async_answer(NEXT), async_answer(Ok())]) == Ok()
    assert MC([async_answer(NEXT)]) == Error("plugin_chain_exhausted")
    assert MC([async_answer("yes")]) == Error("invalid_result")
    assert MC([async_answer(Ok({"bogus": 1}))]) == Error("invalid_modifiers")


def test_synchronous_is_decided_per_implementation():
    class Plugin:
        def on_publish(self, context):
            pass

        async def auth_on_publish(self, context):
            return Ok()

    hooks = Hooks([("p", Plugin())])
    assert hooks.chain("on_publish").synchronous
    assert not hooks.chain("auth_on_publish").synchronous
    assert not hooks.chain("auth_on_publish_m5").synchronous  # served by the async v4


# -- the contract, checked when chains are built --------------------------------------------


def contract_problem(plugin) -> str:
    with pytest.raises(PluginError) as info:
        Hooks([("ok", V4Only([])), ("bad", plugin)])
    assert info.value.plugin == "bad"
    assert str(info.value) == f"plugin bad: {info.value.problem}"
    return info.value.problem


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("auth_on_publsh", "auth_on_publish"),
        ("on_publish_m6", "on_publish_m5"),
        ("on_client_wake_up", "on_client_wakeup"),
        ("on_disconnect", None),
    ],
)
def test_a_method_named_like_a_hook_must_be_one(name, suggestion):
    plugin = type("Plugin", (), {name: lambda self, ctx: Ok()})()
    problem = contract_problem(plugin)
    assert problem.startswith(f"method {name} is not a hook; ")
    if suggestion is not None:
        assert problem.endswith(f"did you mean {suggestion}?")
    else:
        assert "did you mean" not in problem
        assert "rename it" in problem


def test_a_hook_set_on_the_instance_is_checked_too():
    plugin = V4Only([])
    plugin.on_publsh = lambda ctx: None
    assert contract_problem(plugin).endswith("did you mean on_publish?")


class WrongSignatures:
    def too_many(self, ctx, extra):
        pass

    def none(self):
        pass

    def keyword_only(self, *, ctx):
        pass

    def required_keyword(self, ctx, *, flag):
        pass

    def annotated(self, ctx: PublishContext, extra: int = 0, *, more: int) -> Ok:
        return Ok()


@pytest.mark.parametrize(
    ("method", "shown"),
    [
        (WrongSignatures().too_many, "(ctx, extra)"),
        (WrongSignatures().none, "()"),
        (WrongSignatures().keyword_only, "(*, ctx)"),
        (WrongSignatures().required_keyword, "(ctx, *, flag)"),
        (WrongSignatures().annotated, "(ctx, extra=0, *, more)"),
        (lambda: None, "()"),
    ],
)
def test_a_hook_must_take_one_positional_argument(method, shown):
    plugin = V4Only([])
    plugin.auth_on_subscribe = method
    assert contract_problem(plugin) == (
        f"hook auth_on_subscribe{shown} must take one positional argument, the context"
    )


def test_a_hook_must_be_callable():
    plugin = V4Only([])
    plugin.on_deliver = "yes"
    assert contract_problem(plugin) == "hook on_deliver is not callable (it is str)"


def test_what_the_contract_allows():
    class Fine:
        auth_on_register = None  # None hides a hook
        on_publish_count = 0  # not a method: not a hook either

        def __init__(self, config=None) -> None:
            self.on_subscribe = self._on_subscribe  # hooks may be set per instance

        def start(self) -> None:  # lifecycle and helpers are not hooks
            pass

        async def stop(self) -> None:
            pass

        def _on_subscribe(self, ctx):
            return Ok()

        def online(self) -> bool:
            return True

        def auth_on_publish(self, ctx, timeout: float = 1.0):  # extra defaults are fine
            return Ok()

        async def on_publish(self, *args):
            pass

        @staticmethod
        def on_deliver(ctx, /):
            return NEXT

    hooks = Hooks([("fine", Fine())])
    assert [name for name in HOOKS if hooks.chain(name)] == [
        "auth_on_publish",
        "auth_on_publish_m5",
        "on_publish",
        "on_publish_m5",
        "on_subscribe",
        "on_subscribe_m5",
        "on_deliver",
        "on_deliver_m5",
    ]


# -- all: events ---------------------------------------------------------------------------


def test_all_calls_every_implementation_and_ignores_results():
    calls: list[str] = []
    impls = [
        answer(Error("ignored"), calls, "a"),
        answer(Ok(), calls, "b"),
        answer("junk", calls, "c"),
    ]
    tasks: set[asyncio.Task] = set()
    chain = chain_of(impls, "on_publish")
    assert chain.notify(CONTEXT, tasks) is None
    assert calls == ["a", "b", "c"]
    assert not tasks
    assert chain.crashes == 0


def test_all_goes_on_after_a_crash(caplog):
    calls: list[str] = []
    chain = chain_of([answer(None, calls, "a"), crash, answer(None, calls, "c")], "on_publish")
    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        chain.notify(CONTEXT, set())
    assert calls == ["a", "c"]
    assert chain.crashes == 1
    assert "plugin p1 crashed in on_publish" in caplog.text


async def _until_done(tasks: set[asyncio.Task]) -> None:
    for _ in range(100):  # the done callbacks run a loop turn after the tasks end
        if not tasks:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"event tasks still running: {tasks}")


def test_all_runs_async_implementations_as_tracked_tasks(caplog):
    calls: list[str] = []

    async def async_crash(context):
        await asyncio.sleep(0)
        raise ValueError("async boom")

    impls = [
        async_answer(None, calls, "a"),
        async_crash,
        answer(None, calls, "sync"),
        async_answer(Error("ignored"), calls, "b"),
    ]
    chain = chain_of(impls, "on_publish")

    async def main() -> None:
        tasks: set[asyncio.Task] = set()
        chain.notify(CONTEXT, tasks)
        assert calls == ["sync"]  # the async ones have not run yet
        assert len(tasks) == 3
        await _until_done(tasks)

    with caplog.at_level(logging.ERROR, logger="nautilus.hooks"):
        asyncio.run(main())
    assert sorted(calls) == ["a", "b", "sync"]
    assert chain.crashes == 1
    assert "plugin p1 crashed in on_publish" in caplog.text
    assert "async boom" in caplog.text


def test_hooks_notify_tracks_tasks_and_counts_crashes():
    seen: list[str] = []

    class Plugin:
        async def on_client_gone(self, context):
            seen.append(context.client_id)
            raise RuntimeError("after the fact")

        def on_client_offline(self, context):
            raise RuntimeError("sync")

    hooks = Hooks([("p", Plugin())])
    context = PublishContext(client_id="x", topic="t", payload=b"")

    async def main() -> None:
        hooks.notify("on_client_gone", context)
        hooks.notify("on_client_offline", context)
        assert len(hooks.tasks) == 1
        await _until_done(hooks.tasks)

    asyncio.run(main())
    assert seen == ["x"]
    assert hooks.crashes == 2


def test_the_fast_publish_context_sets_every_field_as_the_dataclass_does():
    # The broker builds its hot-path contexts without the dataclass's __init__: a field
    # added to PublishContext but forgotten there would be missing; this catches it.
    import dataclasses

    from hooks.spec import MatchedAcl, new_publish_context

    values = {
        "client_id": "c",
        "username": "u",
        "attributes": {"a": 1},
        "session_id": "s",
        "topic": "t/1",
        "payload": b"p",
        "qos": 1,
        "retain": True,
        "properties": {1: 1},
        "matched_acl": MatchedAcl("label", "t/+"),
        "persisted": True,
        "reason": "queue_full",
    }
    fast = new_publish_context(**values)
    assert fast == PublishContext(**values)
    for field in dataclasses.fields(PublishContext):
        assert hasattr(fast, field.name), field.name


class _Recording:
    """A plugin with a message recorder (hooks/recorder.py)."""

    def __init__(self) -> None:
        self.recorder = self  # the plugin records itself
        self.seen: list[str] = []

    def published(self, client, message, matched_acl) -> None:
        self.seen.append("published")

    def delivered(self, session, delivery) -> None:
        self.seen.append("delivered")

    def completed(self, session, delivery) -> None:
        self.seen.append("completed")

    def published_run(self, client, topic, payloads, receivers, matched_acl) -> None:
        self.seen.append("published_run")


def test_the_recorder_of_a_plugin_is_the_hooks_recorder():
    plugin = _Recording()
    assert Hooks([("rec", plugin), ("other", object())]).recorder is plugin
    assert Hooks([("other", object())]).recorder is None


def test_only_one_plugin_may_record_messages():
    with pytest.raises(PluginError, match=r"only one plugin may record messages \(a, b do\)"):
        Hooks([("a", _Recording()), ("b", _Recording())])
