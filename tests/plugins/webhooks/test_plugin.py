"""The plugin object: config checks, the hook methods it grows, and calls made directly."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from broker.config import ConfigError
from broker.plugins import load_plugins
from hooks import NEXT, Error, Hooks, Ok, PublishContext, RegisterContext

from .conftest import NEXT as NEXT_ANSWER


def load(*endpoints: dict, **keys):
    section = {"enabled": True, "endpoints": list(endpoints), **keys}
    ((_, plugin),) = load_plugins({"webhooks": section})
    return plugin


def endpoint(hook: str = "auth_on_register", url: str = "http://127.0.0.1:9/h", **kw) -> dict:
    return {"hook": hook, "url": url, **kw}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"hook": "auth_on_registr", "url": "http://h/"}, "did you mean 'auth_on_register'"),
        ({"url": "http://h/"}, "plugins.webhooks.endpoints[0].hook: required"),
        ({"hook": "on_publish"}, "plugins.webhooks.endpoints[0].url: required"),
        ({"hook": "on_publish", "url": "ftp://h/x"}, "expected http://host"),
        ({"hook": "on_publish", "url": "http:///x"}, "expected http://host"),
        ({"hook": "on_publish", "url": "http://h/", "no_payload": True}, "no_payload"),
        ({"hook": "on_publish", "url": "http://h/", "colour": "red"}, "endpoints[0].colour"),
        ({"hook": "on_publish", "url": "http://h/", "response_timeout": -1}, "response_timeout"),
        ({"hook": "on_publish", "url": 5}, "plugins.webhooks.endpoints[0].url: expected str"),
    ],
)
def test_endpoint_config_errors(section, message):
    with pytest.raises(ConfigError) as caught:
        load(section)
    assert message in str(caught.value)


def test_on_deliver_is_served_by_an_async_method():
    for hook in ("on_deliver", "on_deliver_m5"):
        plugin = load(endpoint(hook, name="rewriter"))
        assert inspect.iscoroutinefunction(getattr(plugin, hook))


def test_plugin_config_errors():
    with pytest.raises(ConfigError, match=r"plugins\.webhooks\.response_timeout: must be 1"):
        load(endpoint(), response_timeout=0)
    with pytest.raises(ConfigError, match="pool_max_connections"):
        load(endpoint(), pool_max_connections=0)
    with pytest.raises(ConfigError, match=r"endpoints\[1\]: auth_on_register already has"):
        load(endpoint(name="x"), endpoint(url="http://other/", name="x"))
    with pytest.raises(ConfigError, match="with url"):
        load(endpoint(name="x"), endpoint(name="y"))
    with pytest.raises(ConfigError, match=r"plugins\.webhooks\.endpoints: expected an array"):
        load_plugins({"webhooks": {"enabled": True, "endpoints": {"hook": "on_publish"}}})


def test_one_method_per_configured_hook():
    plugin = load(
        endpoint("auth_on_register"),
        endpoint("auth_on_publish_m5"),
        endpoint("on_publish"),
        endpoint("on_client_gone"),
    )
    assert inspect.iscoroutinefunction(plugin.auth_on_register)
    assert inspect.iscoroutinefunction(plugin.auth_on_publish_m5)
    assert plugin.auth_on_register.__self__ is plugin
    assert callable(plugin.on_publish) and not inspect.iscoroutinefunction(plugin.on_publish)
    assert not hasattr(plugin, "auth_on_subscribe") and not hasattr(plugin, "on_deliver")
    hooks = Hooks([("webhooks", plugin)])
    # v4 endpoints serve MQTT 5 clients too; an _m5 endpoint serves only MQTT 5 clients.
    assert hooks.chain("auth_on_register") and hooks.chain("auth_on_register_m5")
    assert hooks.chain("auth_on_publish_m5") and not hooks.chain("auth_on_publish")
    assert hooks.chain("on_publish_m5") and hooks.chain("on_client_gone")
    assert not hooks.chain("auth_on_subscribe") and not hooks.chain("on_deliver")


def test_endpoints_are_ordered_by_name_then_url():
    plugin = load(
        endpoint(url="http://h/3"),
        endpoint(url="http://h/1", name="b"),
        endpoint(url="http://h/2", name="a"),
    )
    assert [e.url for e in plugin.hooks["auth_on_register"]] == [
        "http://h/2",
        "http://h/1",
        "http://h/3",
    ]


def run(plugin, coro_fn):
    async def main():
        await plugin.start()
        try:
            return await coro_fn()
        finally:
            await plugin.stop()

    return asyncio.run(main())


def ctx() -> RegisterContext:
    return RegisterContext(client_id="c", username="u", password=b"p", peer=("127.0.0.1", 1))


def test_direct_calls_ok_next_error(hook_server):
    one = hook_server.answer("/one", NEXT_ANSWER)
    two = hook_server.answer("/two", {"result": "ok", "modifiers": {"max_inflight_messages": 3}})
    plugin = load(endpoint(url=one, name="1"), endpoint(url=two, name="2"))
    assert run(plugin, lambda: plugin.auth_on_register(ctx())) == Ok({"max_inflight_messages": 3})
    hook_server.answer("/two", NEXT_ANSWER)
    assert run(plugin, lambda: plugin.auth_on_register(ctx())) is NEXT
    hook_server.answer("/one", {"result": {"error": "banned"}})
    assert run(plugin, lambda: plugin.auth_on_register(ctx())) == Error("banned")
    assert hook_server.count("/one") == 3 and hook_server.count("/two") == 2


def test_keep_alive_connection_is_reused(hook_server):
    url = hook_server.answer("/pub", {"result": "ok"})
    plugin = load(endpoint("auth_on_publish", url))
    message = PublishContext(client_id="c", topic="t", payload=b"x")

    async def many():
        return [await plugin.auth_on_publish(message) for _ in range(20)]

    assert run(plugin, many) == [Ok()] * 20
    peers = {hook_server.expect("/pub").peer for _ in range(20)}
    assert len(peers) == 1  # twenty calls, one pooled keep-alive connection


def test_calls_after_stop_are_denied(hook_server):
    url = hook_server.answer("/reg", {"result": "ok"})
    plugin = load(endpoint(url=url))

    async def after_stop():
        await plugin.start()
        await plugin.stop()
        return await plugin.auth_on_register(ctx())

    assert asyncio.run(after_stop()) == Error("request_failed")
