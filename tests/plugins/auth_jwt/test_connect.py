"""CONNECT with a JWT as the password, through a real broker, MQTT 3.1.1 and 5.0.

Every refusal is checked three ways: the CONNACK code exactly as on the wire (raw
socket), what paho-mqtt reports, and the reason on_register_failed receives.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest

from broker import admin
from tests.broker.helpers import V5, V311, VERSIONS, unique_id
from tests.plugins.auth_jwt.helpers import (
    ALLOW_ALL,
    BAD_CREDENTIALS,
    NOT_AUTHORIZED,
    jwt_sections,
    paho_code,
    raw_connect,
    recorder_of,
)
from tests.plugins.auth_jwt.tokens import (
    AUDIENCE,
    DELETE,
    ISSUER,
    SECRET,
    claims,
    ec_key,
    ed25519_key,
    forge_hs256,
    hs_sign,
    rsa_key,
    tamper,
    unsigned,
)

# -- accepted tokens --------------------------------------------------------------------


def _keys(kind: str, tmp_path) -> tuple[dict[str, Any], Any]:
    """(plugin keys, sign(claims) -> token) for one kind of key."""
    if kind.startswith("HS"):
        return {"secret": SECRET}, lambda c: hs_sign(c, alg=kind)
    pair = {"RS256": rsa_key, "PS256": rsa_key, "ES256": ec_key, "EdDSA": ed25519_key}[kind]()
    return {"public_key_file": pair.write_public(tmp_path)}, lambda c: pair.sign(c, alg=kind)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512", "RS256", "PS256", "ES256", "EdDSA"])
def test_a_valid_token_connects_and_leaves_its_claims(
    start_broker, jwt_paho, tmp_path, alg, version
):
    keys, sign = _keys(alg, tmp_path)
    server = start_broker(**jwt_sections(**keys))
    token_claims = claims("alice", tenant="acme")
    client = jwt_paho(server, version, "alice", sign(token_claims))
    event = recorder_of(server).expect(client.client_id)
    assert event.hook == "on_register"
    assert event.attributes["jwt_claims"] == token_claims
    client.subscribe("tenants/acme/t", 1)
    client.publish("tenants/acme/t", b"hello", qos=1)
    assert client.expect_message().payload == b"hello"


# -- refused tokens ---------------------------------------------------------------------


def _good(**changes: Any) -> dict[str, Any]:
    return claims("alice", **{"iss": ISSUER, "aud": AUDIENCE, **changes})


def _tampered() -> str:
    return tamper(rsa_key().sign(_good()), _good(admin=True))


@dataclass(frozen=True)
class Denial:
    name: str
    token: Any  # () -> str | bytes, built when the test runs (fresh timestamps)
    reason: str = "invalid_signature"


DENIALS = [
    Denial("expired", lambda: rsa_key().sign(_good(exp=int(time.time()) - 10))),
    Denial("nbf_in_the_future", lambda: rsa_key().sign(_good(nbf=int(time.time()) + 60))),
    Denial("iat_in_the_future", lambda: rsa_key().sign(_good(iat=int(time.time()) + 60))),
    Denial("wrong_issuer", lambda: rsa_key().sign(_good(iss="https://evil.example"))),
    Denial("no_issuer", lambda: rsa_key().sign(_good(iss=DELETE))),
    Denial("wrong_audience", lambda: rsa_key().sign(_good(aud="someone-else"))),
    Denial("alg_none", lambda: unsigned(_good())),
    Denial("hs256_keyed_with_the_rsa_public_key", lambda: forge_hs256(_good(), _public_pem())),
    Denial("signed_by_another_key", lambda: rsa_key("other").sign(_good())),
    Denial("es256_signature", lambda: ec_key().sign(_good())),
    Denial("tampered_payload", _tampered),
    Denial("garbage_password", lambda: "not-a-jwt"),
    Denial("binary_password", lambda: b"\xff\x00\xfe.\x01.\x02"),
    Denial("rid_mismatch", lambda: rsa_key().sign(_good(rid="mallory")), "username_rid_mismatch"),
    Denial("missing_rid", lambda: rsa_key().sign(_good(rid=DELETE)), "missing_rid"),
]


def _public_pem() -> bytes:
    return rsa_key().public_pem()


@pytest.fixture
def rsa_broker(start_broker, tmp_path):
    """RSA public key, issuer and audience required."""
    return start_broker(
        **jwt_sections(
            public_key_file=rsa_key().write_public(tmp_path), issuer=ISSUER, audience=AUDIENCE
        )
    )


def test_the_control_token_is_accepted(rsa_broker):
    """The refusals below differ from this token only in what their name says."""
    for version in (V311, V5):
        _, code = raw_connect(rsa_broker, version, "alice", rsa_key().sign(_good()))
        assert code == 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("denial", DENIALS, ids=[d.name for d in DENIALS])
def test_refused(rsa_broker, jwt_paho, denial, version):
    token = denial.token()
    client_id, code = raw_connect(rsa_broker, version, "alice", token)
    codes = BAD_CREDENTIALS if denial.reason == "invalid_signature" else NOT_AUTHORIZED
    assert code == codes[version]
    event = recorder_of(rsa_broker).expect(client_id)
    assert (event.hook, event.reason) == ("on_register_failed", denial.reason)
    assert "jwt_claims" not in event.attributes
    jwt_paho(rsa_broker, version, "alice", token, expect_code=paho_code(version, code))


def test_refusals_are_logged_without_the_token(rsa_broker, caplog):
    caplog.set_level(logging.INFO, logger="nautilus.plugins.auth_jwt")
    token = rsa_key().sign(_good(exp=int(time.time()) - 10))
    client_id, _ = raw_connect(rsa_broker, V311, "alice", token)
    ours = [r for r in caplog.records if r.name == "nautilus.plugins.auth_jwt"]
    assert [r.levelno for r in ours] == [logging.INFO]
    message = ours[0].getMessage()
    assert client_id in message and "invalid_signature" in message and "expired" in message
    signature = token.rsplit(".", 1)[1]
    assert not any(signature in r.getMessage() or token in r.getMessage() for r in caplog.records)


# -- no password: NEXT ------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_no_password_asks_the_next_plugin(start_broker, version):
    server = start_broker(**jwt_sections(after={"allow_all": ALLOW_ALL}, secret=SECRET))
    assert raw_connect(server, version, "alice", None)[1] == 0
    assert raw_connect(server, version, "alice", b"")[1] == 0
    # A token that fails is a decision: the next plugin is not asked.
    bad = hs_sign(claims("alice"), secret="another-" * 8)
    assert raw_connect(server, version, "alice", bad)[1] == BAD_CREDENTIALS[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_no_password_and_no_other_plugin_is_not_authorized(start_broker, version):
    server = start_broker(**jwt_sections(secret=SECRET))
    client_id, code = raw_connect(server, version, "alice", None)
    assert code == NOT_AUTHORIZED[version]
    assert recorder_of(server).expect(client_id).reason == "plugin_chain_exhausted"


# -- claim rules ------------------------------------------------------------------------


def test_leeway_allows_clock_skew(start_broker):
    server = start_broker(**jwt_sections(secret=SECRET, leeway="30s"))
    now = int(time.time())
    for accepted in (
        claims("alice", exp=now - 10),
        claims("alice", iat=now + 10),
        claims("alice", nbf=now + 10),
    ):
        assert raw_connect(server, V311, "alice", hs_sign(accepted))[1] == 0
    for refused in (
        claims("alice", exp=now - 60),
        claims("alice", iat=now + 60),
        claims("alice", nbf=now + 60),
    ):
        assert raw_connect(server, V311, "alice", hs_sign(refused))[1] == 4


def test_username_claim_can_be_another_claim(start_broker):
    server = start_broker(**jwt_sections(secret=SECRET, username_claim="sub"))
    token = hs_sign(claims(None, rid=DELETE, sub="alice"))
    assert raw_connect(server, V5, "alice", token)[1] == 0
    client_id, code = raw_connect(server, V5, "bob", token)
    assert code == 0x87
    assert recorder_of(server).expect(client_id).reason == "username_rid_mismatch"


def test_username_rule_can_be_turned_off(start_broker):
    server = start_broker(**jwt_sections(secret=SECRET, username_claim=""))
    token = hs_sign(claims(None, rid=DELETE))
    assert raw_connect(server, V311, unique_id("anyone"), token)[1] == 0


def test_required_claims(start_broker):
    server = start_broker(**jwt_sections(secret=SECRET, required_claims=["exp"]))
    assert raw_connect(server, V311, "alice", hs_sign(claims("alice")))[1] == 0
    forever = hs_sign(claims("alice", exp=DELETE))
    assert raw_connect(server, V311, "alice", forever)[1] == 4


def test_hs_algorithms_can_be_narrowed(start_broker):
    server = start_broker(**jwt_sections(secret=SECRET, algorithms=["HS512"]))
    assert raw_connect(server, V311, "alice", hs_sign(claims("alice"), alg="HS512"))[1] == 0
    assert raw_connect(server, V311, "alice", hs_sign(claims("alice"), alg="HS256"))[1] == 4


# -- the mountpoint claim ---------------------------------------------------------------


def test_the_mountpoint_claim_puts_each_token_on_its_tree(start_broker, jwt_paho):
    server = start_broker(**jwt_sections(secret=SECRET, mountpoint_claim="tenant"))
    acme = jwt_paho(server, V5, "alice", hs_sign(claims("alice", tenant="acme")))
    other = jwt_paho(server, V5, "bob", hs_sign(claims("bob", tenant="globex")))
    acme.subscribe("#", 1)
    other.publish("t", b"globex's", 1)
    acme.publish("t", b"acme's", 1)
    assert acme.expect_message().payload == b"acme's"
    acme.expect_no_message()
    row = server.call(admin.client, server.broker, acme.client_id, "acme")
    assert (row["mountpoint"], row["user"]) == ("acme", "alice")


@pytest.mark.parametrize(
    ("tenant", "reason"), [(DELETE, "missing_mountpoint"), ("a/b", "invalid_mountpoint")]
)
def test_a_token_without_a_usable_mountpoint_claim_is_refused(start_broker, tenant, reason):
    server = start_broker(**jwt_sections(secret=SECRET, mountpoint_claim="tenant"))
    token = hs_sign(claims("alice", tenant=tenant))
    client_id, code = raw_connect(server, V5, "alice", token)
    assert code == NOT_AUTHORIZED[V5]
    assert recorder_of(server).expect(client_id).reason == reason
