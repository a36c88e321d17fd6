"""Keys from a JWKS URL: fetched at start, refreshed on a new kid (rate-limited) and
periodically; an endpoint that is down is survived. The endpoint is a real aiohttp server
on 127.0.0.1 (jwks_server.py); clients go through a real broker."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.plugins import load_plugins
from hooks import NEXT, Ok, RegisterContext
from plugins.auth_jwt.keys import JwksError, parse_jwks
from tests.broker.helpers import V5, V311, VERSIONS
from tests.plugins.auth_jwt.helpers import (
    BAD_CREDENTIALS,
    SERVER_UNAVAILABLE,
    jwt_sections,
    raw_connect,
    recorder_of,
)
from tests.plugins.auth_jwt.tokens import claims, ec_key, ed25519_key, hs_sign, rsa_key


def _token(pair, kid: str | None, username: str = "alice", alg: str | None = None) -> str:
    return pair.sign(claims(username), kid=kid, alg=alg)


@pytest.mark.parametrize("version", VERSIONS)
def test_rotation_a_new_kid_is_fetched_and_accepted(start_broker, jwks, version):
    old, new, edwards = rsa_key(), ec_key(), ed25519_key()
    jwks.serve(old.jwk("2024"))
    server = start_broker(**jwt_sections(jwks_url=jwks.url, jwks_min_refresh_interval=0))
    assert jwks.requests == 1  # fetched by start(), before the broker listens
    assert raw_connect(server, version, "alice", _token(old, "2024"))[1] == 0
    jwks.serve(old.jwk("2024"), new.jwk("2025"), edwards.jwk("ed"))
    client_id, code = raw_connect(server, version, "alice", _token(new, "2025"))
    assert code == 0
    assert recorder_of(server).expect(client_id).attributes["jwt_claims"]["rid"] == "alice"
    assert jwks.requests == 2
    assert raw_connect(server, version, "alice", _token(edwards, "ed"))[1] == 0
    assert raw_connect(server, version, "alice", _token(old, "2024"))[1] == 0
    assert jwks.requests == 2  # known kids need no fetch


def test_unknown_kid_refreshes_are_rate_limited(start_broker, jwks):
    old, new = rsa_key(), rsa_key("next")
    jwks.serve(old.jwk("a"))
    server = start_broker(**jwt_sections(jwks_url=jwks.url))  # at most one per 30 s
    jwks.serve(old.jwk("a"), new.jwk("b"))
    for version in (V311, V5):
        client_id, code = raw_connect(server, version, "alice", _token(new, "b"))
        assert code == BAD_CREDENTIALS[version]
        assert recorder_of(server).expect(client_id).reason == "invalid_signature"
    assert raw_connect(server, V311, "alice", _token(old, "a"))[1] == 0
    assert jwks.requests == 1  # the start-up fetch only


def test_periodic_refresh_picks_up_new_keys_and_drops_revoked_ones(start_broker, jwks):
    old, new = rsa_key(), rsa_key("next")
    jwks.serve(old.jwk("a"))
    server = start_broker(
        **jwt_sections(jwks_url=jwks.url, jwks_refresh_interval=1, jwks_min_refresh_interval=3600)
    )
    jwks.serve(new.jwk("b"))  # "a" is revoked
    # The third request starts a second after the second one's keys were installed.
    jwks.wait_requests(3)
    assert raw_connect(server, V311, "alice", _token(new, "b"))[1] == 0
    assert raw_connect(server, V311, "alice", _token(old, "a"))[1] == 4


@pytest.mark.parametrize("version", VERSIONS)
def test_endpoint_down_at_start_then_back(start_broker, jwks, version):
    pair = rsa_key()
    jwks.fail(503)
    server = start_broker(**jwt_sections(jwks_url=jwks.url, jwks_min_refresh_interval=0))
    client_id, code = raw_connect(server, version, "alice", _token(pair, "a"))
    assert code == SERVER_UNAVAILABLE[version]  # retry later, your token may be fine
    assert recorder_of(server).expect(client_id).reason == "jwks_unavailable"
    jwks.serve(pair.jwk("a"))
    assert raw_connect(server, version, "alice", _token(pair, "a"))[1] == 0


def test_endpoint_down_later_keeps_the_cached_keys(start_broker, jwks):
    pair, new = rsa_key(), rsa_key("next")
    jwks.serve(pair.jwk("a"))
    server = start_broker(**jwt_sections(jwks_url=jwks.url, jwks_min_refresh_interval=0))
    jwks.fail(500)
    assert raw_connect(server, V311, "alice", _token(new, "b"))[1] == 4  # refresh failed
    assert jwks.requests == 2
    assert raw_connect(server, V311, "alice", _token(pair, "a"))[1] == 0


def test_tokens_without_kid_try_the_keys_of_their_type(start_broker, jwks):
    rsa, other, curve = rsa_key(), rsa_key("other"), ec_key()
    jwks.serve(other.jwk("x"), rsa.jwk("y"), curve.jwk())
    server = start_broker(**jwt_sections(jwks_url=jwks.url))
    assert raw_connect(server, V311, "alice", _token(rsa, None))[1] == 0
    assert raw_connect(server, V311, "alice", _token(curve, None))[1] == 0
    assert raw_connect(server, V311, "alice", _token(rsa_key("stranger"), None))[1] == 4


def test_a_key_is_used_only_with_its_own_alg_and_type(start_broker, jwks):
    pair, curve = rsa_key(), ec_key()
    jwks.serve(pair.jwk("r", alg="RS256"), curve.jwk("e"))
    server = start_broker(**jwt_sections(jwks_url=jwks.url))
    assert raw_connect(server, V311, "alice", _token(pair, "r"))[1] == 0
    assert raw_connect(server, V311, "alice", _token(pair, "r", alg="PS256"))[1] == 4
    # An RSA-signed token naming the EC key's kid.
    assert raw_connect(server, V311, "alice", _token(pair, "e"))[1] == 4


def test_hmac_tokens_are_refused_even_with_an_oct_key_in_the_set(start_broker, jwks):
    secret_jwk = {"kty": "oct", "kid": "h", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"}
    jwks.serve(rsa_key().jwk("a"), secret_jwk)
    server = start_broker(**jwt_sections(jwks_url=jwks.url))
    forged = hs_sign(claims("alice"), secret=b"secret-secret-secret-secret-secret", kid="h")
    assert raw_connect(server, V311, "alice", forged)[1] == 4


def test_parse_jwks_keeps_signature_keys_only():
    document = {
        "keys": [
            rsa_key().jwk("sig"),
            rsa_key().jwk("enc", use="enc"),
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
            ec_key().jwk("wrong-alg", alg="HS256"),
            {"kty": "RSA", "kid": "broken", "n": "??", "e": "AQAB"},
            "not a key",
        ]
    }
    keys, skipped = parse_jwks(json.dumps(document).encode())
    assert [key.kid for key in keys] == ["sig"]
    assert skipped == 5
    for bad in (b"not json", b"[]", b'{"keys": []}', json.dumps({"keys": [document["keys"][2]]})):
        with pytest.raises(JwksError):
            parse_jwks(bad if isinstance(bad, bytes) else bad.encode())


def test_concurrent_connects_share_one_refresh(jwks):
    """Twenty CONNECTs with a new kid at once cause one fetch, and all get in."""
    old, new = rsa_key(), rsa_key("next")
    jwks.serve(old.jwk("a"))

    async def scenario():
        ((_, plugin),) = load_plugins(
            {"auth_jwt": {"enabled": True, "jwks_url": jwks.url, "jwks_min_refresh_interval": 0}}
        )
        await plugin.start()
        try:
            jwks.serve(old.jwk("a"), new.jwk("b"))
            token = _token(new, "b").encode()
            contexts = [
                RegisterContext(client_id=f"c{i}", username="alice", password=token)
                for i in range(20)
            ]
            results = await asyncio.gather(*(plugin.auth_on_register(c) for c in contexts))
            return results, contexts
        finally:
            await plugin.stop()

    results, contexts = asyncio.run(scenario())
    assert results == [Ok()] * 20
    assert all(c.attributes["jwt_claims"]["rid"] == "alice" for c in contexts)
    assert jwks.requests == 2


def test_no_password_is_next_without_any_fetch(jwks):
    jwks.serve(rsa_key().jwk("a"))

    async def scenario():
        ((_, plugin),) = load_plugins({"auth_jwt": {"enabled": True, "jwks_url": jwks.url}})
        await plugin.start()
        try:
            ctx = RegisterContext(client_id="c", username="alice")
            return await plugin.auth_on_register(ctx)
        finally:
            await plugin.stop()

    assert asyncio.run(scenario()) is NEXT
    assert jwks.requests == 1
