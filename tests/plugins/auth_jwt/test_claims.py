"""The hook called directly: the username rule's edge cases and what Ok leaves behind."""

from __future__ import annotations

import pytest

from broker.authorization import register_refusal
from broker.plugins import load_plugins
from hooks import NEXT, Error, Ok, RegisterContext
from tests.plugins.auth_jwt.tokens import DELETE, SECRET, claims, hs_sign


@pytest.fixture
def plugin():
    ((_, built),) = load_plugins({"auth_jwt": {"enabled": True, "secret": SECRET}})
    return built


def register(plugin, username, token):
    password = token.encode() if isinstance(token, str) else token
    ctx = RegisterContext(client_id="c", username=username, password=password)
    return plugin.auth_on_register(ctx), ctx


def test_ok_leaves_the_verified_claims(plugin):
    token_claims = claims("alice", tenant="acme", groups=["a", "b"])
    result, ctx = register(plugin, "alice", hs_sign(token_claims))
    assert result == Ok()
    assert ctx.attributes == {"jwt_claims": token_claims}


@pytest.mark.parametrize(
    ("username", "rid", "reason"),
    [
        ("42", 42, "username_rid_mismatch"),  # a number is not the string
        (None, None, "username_rid_mismatch"),  # null does not match a missing username
        ("Alice", "alice", "username_rid_mismatch"),  # exact, case included
        ("alice:1", "alice", "username_rid_mismatch"),  # the whole username (Courier today)
        ("alice", DELETE, "missing_rid"),
    ],
)
def test_the_username_rule_is_exact(plugin, username, rid, reason):
    result, ctx = register(plugin, username, hs_sign(claims(rid=rid)))
    assert result == Error(reason)
    assert ctx.attributes == {}


def test_no_password_is_next(plugin):
    assert register(plugin, "alice", None)[0] is NEXT
    assert register(plugin, "alice", b"")[0] is NEXT


def test_refusal_reasons_map_to_the_documented_codes(plugin):
    bad, _ = register(plugin, "alice", "garbage")
    mismatch, _ = register(plugin, "bob", hs_sign(claims("alice")))
    assert register_refusal(bad) == 0x86
    assert register_refusal(mismatch) == 0x87


def test_a_token_for_an_audience_needs_that_audience_configured(plugin):
    """RFC 7519 4.1.3: a broker with no audience is not the audience a token names."""
    result, _ = register(plugin, "alice", hs_sign(claims("alice", aud="someone")))
    assert result == Error("invalid_signature")
