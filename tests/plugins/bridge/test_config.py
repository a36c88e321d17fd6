"""`[[bridges]]` tables: a mistake is one line naming its key."""

from __future__ import annotations

import pytest

from broker.config import ConfigError
from broker.plugins import load_plugins
from plugins.bridge.config import parse_bridges

GOOD = {"name": "cloud", "address": "example.com:1883", "topics": [{"pattern": "a/#"}]}


def test_vernemqs_settings_and_their_defaults():
    [bridge] = parse_bridges([GOOD])
    assert (bridge.client_id, bridge.clean_session, bridge.keepalive_interval) == (
        "auto",
        False,
        60,
    )
    assert (bridge.restart_timeout, bridge.try_private, bridge.mqtt_version) == (10, True, 4)
    [rule] = bridge.topics
    assert (rule.direction, rule.qos, rule.retain, rule.local_prefix) == ("out", 0, False, "")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"topics": [{"pattern": "a/#", "direction": "sideways"}]},
            r"bridges\[0\].topics\[0\].direction",
        ),
        (
            {"topics": [{"pattern": "a/#/b"}]},
            r"bridges\[0\].topics\[0\].pattern: not a topic filter",
        ),
        ({"topics": [{"pattern": "a", "qos": 3}]}, r"topics\[0\].qos: 0, 1 or 2"),
        ({"topics": [{"pattern": "a", "local_prefix": "x/+/"}]}, r"local_prefix: no wildcards"),
        ({"topics": []}, r"bridges\[0\].topics: at least one"),
        ({"address": "example.com"}, r"bridges\[0\].address: expected host:port"),
        ({"mqtt_version": 6}, r"bridges\[0\].mqtt_version"),
        ({"mountpoint": "a/b"}, r"bridges\[0\].mountpoint: a mountpoint cannot contain '/'"),
        ({"colour": "red"}, r"unknown config key 'bridges\[0\].colour'"),
    ],
)
def test_a_bad_table_names_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_bridges([{**GOOD, **change}])


def test_two_bridges_of_one_name_are_refused():
    with pytest.raises(ConfigError, match=r"bridges\[1\].name: must be given, and differ"):
        parse_bridges([GOOD, GOOD])


def test_bridges_need_a_tcp_listener_of_their_mountpoint_with_a_fixed_port():
    section = {"enabled": True, "module": "plugins.bridge:BridgePlugin", "tables": [GOOD]}
    with pytest.raises(ConfigError, match="needs a tcp listener with no mountpoint and a fixed"):
        load_plugins({"bridge": {**section, "local_addresses": {"": "127.0.0.1:0"}}})
    tenant = {**section, "tables": [{**GOOD, "mountpoint": "t-a"}]}
    with pytest.raises(
        ConfigError, match=r'bridges\[0\]: needs a tcp listener with mountpoint "t-a"'
    ):
        load_plugins({"bridge": {**tenant, "local_addresses": {"": "127.0.0.1:1883"}}})
