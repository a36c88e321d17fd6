"""A row's ACL objects (plugins/auth_db/acl.py): parsed, substituted and matched as
VerneMQ's vmq_diversity_cache does (its cache_test.lua's cases among them)."""

from __future__ import annotations

import pytest

from broker.config import ConfigError
from plugins.auth_db.acl import NO_LIMIT, AclError, Acls, parse_acls
from plugins.auth_db.backends import Row, chosen, prepare
from plugins.auth_db.cache import AclCache, Entry


def acls(publish, subscribe=None, mountpoint="", client_id="c1", username="u1") -> Acls:
    return Acls(
        parse_acls(publish, "publish_acl", mountpoint, client_id, username),
        parse_acls(subscribe, "subscribe_acl", mountpoint, client_id, username),
    )


def test_patterns_match_as_vernemq_matches_them():
    rules = acls(None, '[{"pattern": "a/+/c"}, {"pattern": "c/#"}]')  # cache_test.lua
    assert rules.for_subscribe("a/+/c", 1)
    assert rules.for_subscribe("a/b/c", 1)
    assert rules.for_subscribe("c/b/a", 1)
    assert rules.for_subscribe("c", 1)  # `c/#` covers `c`
    assert not rules.for_subscribe("a/b/d", 1)
    assert not rules.for_subscribe("d/d/d", 1)
    assert not rules.for_subscribe("#", 0)  # a wildcard is a plain level: not `c`


def test_percent_levels_are_the_clients_own():
    rules = acls([{"pattern": "%m/%u/%c/#"}], mountpoint="mp", client_id="dev-7", username="ann")
    assert rules.for_publish("mp/ann/dev-7/temp", 0, 1, False)
    assert not rules.for_publish("mp/bob/dev-7/temp", 0, 1, False)
    assert not rules.for_publish("mp/ann/dev-8/temp", 0, 1, False)


def test_limits_of_a_publish_acl():
    rules = acls(
        '[{"pattern": "q/#", "max_qos": 1, "max_payload_size": 4, "allowed_retain": false}]'
    )
    assert rules.for_publish("q/a", 1, 4, False)
    assert not rules.for_publish("q/a", 2, 4, False)  # over max_qos
    assert not rules.for_publish("q/a", 1, 5, False)  # over max_payload_size
    assert not rules.for_publish("q/a", 1, 4, True)  # retain not allowed


def test_the_first_acl_that_allows_wins_and_brings_its_modifiers():
    rules = acls(
        [
            {"pattern": "x/#", "max_qos": 0, "modifiers": {"topic": "low/x"}},
            {"pattern": "x/#", "modifiers": {"qos": 0, "payload": "redacted"}},
        ]
    )
    low = rules.for_publish("x/1", 0, 1, False)
    assert low is not None and dict(low.modifiers) == {"topic": "low/x"}
    high = rules.for_publish("x/1", 2, 1, False)
    assert high is not None and dict(high.modifiers) == {"qos": 0, "payload": b"redacted"}


def test_subscribe_max_qos_refuses_a_higher_request():
    rules = acls(None, [{"pattern": "s/#", "max_qos": 1}])
    assert rules.for_subscribe("s/a", 1) and not rules.for_subscribe("s/a", 2)


def test_defaults_and_null():
    [acl] = parse_acls('[{"pattern": "a"}]', "publish_acl", "", "c", "u")
    assert (acl.max_qos, acl.max_payload_size, acl.allowed_retain) == (2, NO_LIMIT, True)
    assert parse_acls(None, "publish_acl", "", "c", "u") == ()  # null: nothing allowed
    assert not acls(None).for_publish("a", 0, 0, False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "publish_acl: not JSON"),
        ('{"pattern": "a"}', "expected a JSON array"),
        ('[{"max_qos": 1}]', "needs a string pattern"),
        ('[{"pattern": "a", "max_qos": 3}]', "max_qos must be 0, 1 or 2"),
        ('[{"pattern": "a", "allowed_retain": "yes"}]', "allowed_retain must be true or false"),
        ('[{"pattern": "a", "modifiers": {"colour": 1}}]', "modifiers must be an object of"),
    ],
)
def test_a_bad_acl_says_what_is_wrong(value, message):
    with pytest.raises(AclError, match=message):
        parse_acls(value, "publish_acl", "", "c", "u")


def test_the_clients_own_row_before_the_default_row():
    own, default = Row("c1", None, None, None), Row("*", None, None, None)
    assert chosen([default, own]) is own
    assert chosen([default]) is default
    assert chosen([]) is None
    # bcrypt: only rows whose password matched count
    assert chosen([own, default], [False, True]) is default
    assert chosen([own, default], [False, False]) is None


def test_a_connections_end_does_not_drop_a_newer_connections_entry():
    cache = AclCache()
    cache.put(("", "c1"), Entry("u1", "c1", "new-session", Acls(), 0.0))
    cache.drop(("", "c1"), "old-session")  # the taken-over connection ends after
    assert cache.get(("", "c1")) is not None
    cache.drop(("", "c1"), "new-session")
    assert cache.get(("", "c1")) is None


def test_named_parameters_become_the_drivers_placeholders():
    sql = "SELECT a::TEXT FROM t WHERE u = :username AND p = crypt(:password, p) AND u2 = :username"
    query = prepare(sql, "${}".format, "plugins.auth_db.query.auth_on_register")
    assert query.text == "SELECT a::TEXT FROM t WHERE u = $1 AND p = crypt($2, p) AND u2 = $3"
    assert query.arguments({"username": "ann", "password": "pw"}) == ["ann", "pw", "ann"]
    assert prepare("x = :client_id", lambda n: "%s", "w").text == "x = %s"
    with pytest.raises(ConfigError, match=r"query.acls: unknown parameter :user \(known: "):
        prepare("u = :user", "${}".format, "plugins.auth_db.query.acls")
