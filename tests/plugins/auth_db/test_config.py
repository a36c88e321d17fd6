"""`[plugins.auth_db]`: VerneMQ's defaults, and a bad table named in one line."""

from __future__ import annotations

import pytest

from broker.config import ConfigError
from broker.plugins import load_plugins
from plugins.auth_db import PLUGIN, AuthDbPlugin


def test_built_from_its_table_with_vernemqs_defaults():
    [(name, plugin)] = load_plugins({"auth_db": {"enabled": True}})
    assert (name, PLUGIN) == ("auth_db", AuthDbPlugin)
    config = plugin.config
    assert config.url == "postgresql://root:password@localhost:5432/vernemq_db"
    assert (config.password_hash, config.pool_size, config.query_timeout) == ("crypt", 5, 5)
    [(_, redis_plugin)] = load_plugins({"auth_db": {"enabled": True, "backend": "redis"}})
    assert redis_plugin.config.password_hash == "bcrypt"
    [(_, mysql_plugin)] = load_plugins({"auth_db": {"enabled": True, "backend": "mysql"}})
    assert mysql_plugin.config.url == "mysql://root:password@localhost:3306/vernemq_db"
    assert mysql_plugin.config.password_hash == "password"
    assert mysql_plugin.backend.connect_args == {
        "host": "localhost",
        "port": 3306,
        "user": "root",
        "password": "password",
        "database": "vernemq_db",
    }


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"backend": "oracle"}, "backend: 'oracle' is not one of"),
        ({"password_hash": "md5"}, "password_hash: 'md5' is not one of crypt, bcrypt"),
        ({"backend": "redis", "password_hash": "crypt"}, "password_hash: 'crypt' is not one of"),
        ({"pool_size": 0}, "pool_size: must be 1 or more"),
        ({"query_timeout": 0}, "query_timeout: must be more than 0"),
        ({"colour": 1}, "unknown config key 'plugins.auth_db.colour'"),
        ({"query": {"on_publish": "SELECT 1"}}, r"query.on_publish: unknown \(known: "),
        ({"backend": "redis", "query": {"acls": "x"}}, "query: not for the redis backend"),
    ],
)
def test_a_bad_table_names_the_key(table, message):
    with pytest.raises(ConfigError, match=message):
        load_plugins({"auth_db": {"enabled": True, **table}})
