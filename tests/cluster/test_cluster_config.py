"""[cluster] and [plugins.redis_subs] configuration errors: each names its key
(broker/config.py's _validate_cluster, plugins/redis_subs/plugin.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from broker.config import Config, ConfigError, config_from_dict
from broker.plugins import load_plugins
from plugins.redis_subs import RedisSubs
from plugins.redis_subs.store import RedisStore

REDIS_ON = {"redis_subs": {"enabled": True}}


def cluster(plugins: Mapping[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """A config with a [cluster] table (an address unless given) and redis_subs on."""
    keys.setdefault("address", "127.0.0.1:0")
    return {"cluster": keys, "plugins": REDIS_ON if plugins is None else plugins}


def error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)
    return str(caught.value)


def test_redis_metadata_needs_the_redis_plugin_and_auto_picks_by_it() -> None:
    no_plugin: list[dict[str, Any]] = [{}, {"redis_subs": {}}, {"redis_subs": {"enabled": False}}]
    for plugins in no_plugin:
        assert error(cluster(plugins, metadata="redis")).startswith("cluster.metadata:")
        # By default ("auto") a cluster without the plugin keeps its metadata itself.
        assert config_from_dict(cluster(plugins)).cluster.metadata == "swc"
    config = config_from_dict(cluster())  # the plugin enabled: a Redis set-up stays one
    assert config.cluster.address == "127.0.0.1:0"
    assert config.cluster.metadata == "redis"
    assert config_from_dict(cluster(metadata="swc")).cluster.metadata == "swc"


def test_no_cluster_needs_no_plugin() -> None:
    config = config_from_dict({})
    assert config.cluster.address == ""
    assert config.broker.node_name == "nautilus"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("address", "127.0.0.1"),
        ("address", "127.0.0.1:port"),
        ("address", "::1:5000"),
        ("address", ":5000"),
        ("address", "127.0.0.1:70000"),
        ("advertise", "host-only"),
        ("advertise", "10.0.0.1:"),
    ],
)
def test_bad_addresses_name_their_key(key: str, value: str) -> None:
    keys: dict[str, Any] = {key: value}
    message = error(cluster(**keys))
    assert message.startswith(f"cluster.{key}:")
    assert repr(value) in message


def test_a_bad_peer_address_names_the_peer() -> None:
    message = error(cluster(peer_addresses={"b": "127.0.0.1:1", "c": "nowhere"}))
    assert message.startswith("cluster.peer_addresses.c:")
    assert "'nowhere'" in message
    message = error(cluster(peer_addresses={"b": 5}))
    assert message.startswith("cluster.peer_addresses.b:")


def test_good_addresses() -> None:
    config = config_from_dict(
        cluster(
            address="[::1]:0",
            advertise="node-a.example:44053",
            peer_addresses={"b": "10.0.0.2:44053", "c": "[fe80::1]:1"},
        )
    )
    assert config.cluster.advertise == "node-a.example:44053"
    assert config.cluster.peer_addresses == {"b": "10.0.0.2:44053", "c": "[fe80::1]:1"}


@pytest.mark.parametrize(("liveness", "dead"), [(0.5, 0.5), (1, 0.9), (2.0, 1)])
def test_dead_after_must_be_longer_than_liveness_interval(liveness: float, dead: float) -> None:
    message = error(cluster(liveness_interval=liveness, dead_after=dead))
    assert message.startswith("cluster.dead_after:")
    config = config_from_dict(cluster(liveness_interval=liveness, dead_after=liveness + 0.1))
    assert config.cluster.dead_after == liveness + 0.1


def test_dead_after_and_liveness_must_be_positive() -> None:
    assert error(cluster(dead_after=0)).startswith("cluster.dead_after:")
    assert error(cluster(liveness_interval=-1)).startswith("cluster.liveness_interval:")


def test_node_names_that_differ_are_refused() -> None:
    message = error({**cluster(node_name="a"), "broker": {"node_name": "b"}})
    assert message.startswith("cluster.node_name:")
    assert "'a'" in message and "'b'" in message


@pytest.mark.parametrize(
    ("broker", "cluster_name", "expected"),
    [
        ({"node_name": "a"}, "a", "a"),  # both, equal
        ({}, "a", "a"),  # only [cluster]'s: it names the node
        ({"node_name": "a"}, None, "a"),  # only [broker]'s
        ({"node_name": "a"}, "", "a"),  # "" is the default: the broker's name is kept
        ({}, None, "nautilus"),
    ],
)
def test_the_node_name_lands_in_broker_node_name(
    broker: dict[str, Any], cluster_name: str | None, expected: str
) -> None:
    keys: dict[str, Any] = {} if cluster_name is None else {"node_name": cluster_name}
    config = config_from_dict({**cluster(**keys), "broker": broker})
    assert config.broker.node_name == expected


def test_cluster_node_name_defaults_to_empty() -> None:
    assert Config().cluster.node_name == ""
    assert config_from_dict(cluster()).cluster.node_name == ""


@pytest.mark.parametrize("name", ["a/b", "a+", "#", "a\0"])
def test_a_cluster_node_name_is_one_topic_level(name: str) -> None:
    assert error(cluster(node_name=name)).startswith("cluster.node_name:")


# --------------------------------------------------------------------------- redis_subs


def plugin_error(table: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_plugins({"redis_subs": {"enabled": True, **table}})
    return str(caught.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "", "redis:/x"])
def test_a_bad_url_scheme_names_the_key(url: str) -> None:
    message = plugin_error({"url": url})
    assert message.startswith("plugins.redis_subs.url:")
    assert repr(url) in message


def test_a_bad_sentinel_endpoint_names_the_key() -> None:
    message = plugin_error({"sentinel_endpoints": ["127.0.0.1:26379", "sentinel-2"]})
    assert message.startswith("plugins.redis_subs.sentinel_endpoints[1]:")
    assert "'sentinel-2'" in message
    message = plugin_error({"sentinel_endpoints": ["127.0.0.1:26379", 7]})
    assert message.startswith("plugins.redis_subs.sentinel_endpoints[1]:")


def test_unknown_and_mistyped_keys_name_the_key() -> None:
    assert "plugins.redis_subs.urls" in plugin_error({"urls": "redis://x"})
    assert plugin_error({"database": "0"}).startswith("plugins.redis_subs.database:")


@pytest.mark.parametrize("url", ["redis://h:1/0", "rediss://h:1/0", "unix:///tmp/redis.sock"])
def test_good_urls_load(url: str) -> None:
    ((name, plugin),) = load_plugins({"redis_subs": {"enabled": True, "url": url}})
    assert name == "redis_subs"
    assert isinstance(plugin, RedisSubs)
    assert plugin.config.url == url
    assert plugin.sentinels == []


def test_the_backend_gets_the_plugins_settings() -> None:
    ((_, plugin),) = load_plugins(
        {
            "redis_subs": {
                "enabled": True,
                "url": "redis://user:pw@127.0.0.1:1/3",
                "key_prefix": "cluster-x:",
                "sentinel_endpoints": ["127.0.0.1:26379", "[::1]:26380"],
                "sentinel_master": "main",
            }
        }
    )
    assert plugin.sentinels == [("127.0.0.1", 26379), ("::1", 26380)]
    store = plugin.metadata_backend(dead_after=1.5)
    try:
        assert isinstance(store, RedisStore)
        assert store.prefix == "cluster-x:"
        assert store.dead_ms == 1500
        assert store.where == "Redis Sentinel main via 127.0.0.1:26379"
    finally:
        asyncio.run(store.close())  # never connected: nothing to wait for
