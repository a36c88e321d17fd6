"""[plugins.auth_jwt] keys: one key source, a safe algorithm allow-list, readable errors."""

from __future__ import annotations

import datetime
import inspect

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import NameOID

from broker.config import ConfigError
from broker.plugins import load_plugins
from plugins.auth_jwt import PLUGIN
from tests.plugins.auth_jwt.tokens import SECRET, ec_key, ed25519_key, rsa_key


def build(**keys):
    """The plugin as the broker builds it from a [plugins.auth_jwt] table."""
    ((_, plugin),) = load_plugins({"auth_jwt": {"enabled": True, **keys}})
    return plugin


@pytest.mark.parametrize(
    ("keys", "got"),
    [
        ({}, "none"),
        ({"secret": SECRET, "jwks_url": "https://idp.example/jwks"}, "secret and jwks_url"),
        ({"secret": SECRET, "public_key_file": "k.pem"}, "secret and public_key_file"),
    ],
)
def test_exactly_one_key_source(keys, got):
    with pytest.raises(ConfigError) as error:
        build(**keys)
    assert str(error.value) == (
        f"plugins.auth_jwt: set exactly one of secret, public_key_file, jwks_url (got {got})"
    )


def test_default_algorithms_follow_the_key_source(tmp_path):
    assert build(secret=SECRET).rules.algorithms == {"HS256", "HS384", "HS512"}
    rsa = build(public_key_file=rsa_key().write_public(tmp_path))
    assert rsa.rules.algorithms == {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
    assert build(public_key_file=ec_key().write_public(tmp_path)).rules.algorithms == {"ES256"}
    ed = build(public_key_file=ed25519_key().write_public(tmp_path))
    assert ed.rules.algorithms == {"EdDSA"}
    jwks = build(jwks_url="https://idp.example/jwks")
    assert "HS256" not in jwks.rules.algorithms
    assert {"RS256", "ES256", "EdDSA"} <= jwks.rules.algorithms


def test_an_allow_list_narrows_the_defaults(tmp_path):
    plugin = build(public_key_file=rsa_key().write_public(tmp_path), algorithms=["RS256"])
    assert plugin.rules.algorithms == {"RS256"}


@pytest.mark.parametrize("name", ["none", "None", "NONE"])
def test_alg_none_is_never_allowed(name):
    with pytest.raises(ConfigError, match=r"^plugins\.auth_jwt\.algorithms: 'none' is never"):
        build(secret=SECRET, algorithms=["HS256", name])


def test_hs_with_a_public_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="algorithm confusion"):
        build(public_key_file=rsa_key().write_public(tmp_path), algorithms=["RS256", "HS256"])
    with pytest.raises(ConfigError, match="algorithm confusion"):
        build(jwks_url="https://idp.example/jwks", algorithms=["HS512"])


@pytest.mark.parametrize(
    ("source", "algorithms", "message"),
    [
        ("secret", ["RS256"], "RS256 cannot be verified with secret"),
        ("ec", ["ES384"], "ES384 cannot be verified with public_key_file"),
        ("rsa", ["EdDSA"], "EdDSA cannot be verified with public_key_file"),
        ("secret", ["HS1024"], "unknown algorithm 'HS1024'"),
    ],
)
def test_algorithms_the_key_cannot_verify_are_refused(tmp_path, source, algorithms, message):
    keys = {"secret": SECRET}
    if source != "secret":
        pair = rsa_key() if source == "rsa" else ec_key()
        keys = {"public_key_file": pair.write_public(tmp_path)}
    with pytest.raises(ConfigError, match=message):
        build(**keys, algorithms=algorithms)


def test_algorithms_must_be_an_array():
    with pytest.raises(ConfigError, match=r"plugins\.auth_jwt\.algorithms: expected an array"):
        build(secret=SECRET, algorithms="HS256")


def test_public_key_file_errors_name_the_key(tmp_path):
    where = r"^plugins\.auth_jwt\.public_key_file: "
    with pytest.raises(ConfigError, match=where + "cannot read"):
        build(public_key_file=str(tmp_path / "missing.pem"))
    private = tmp_path / "private.pem"
    private.write_bytes(rsa_key().private_pem())
    with pytest.raises(ConfigError, match=where + ".*holds a private key"):
        build(public_key_file=str(private))
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(ConfigError, match=where + ".*not a PEM public key"):
        build(public_key_file=str(junk))


def test_a_certificate_gives_its_public_key(tmp_path):
    pair = ec_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer.example")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pair.public)
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(pair.private, hashes.SHA256())
    )
    path = tmp_path / "cert.pem"
    path.write_bytes(certificate.public_bytes(Encoding.PEM))
    assert build(public_key_file=str(path)).rules.algorithms == {"ES256"}


def test_unsupported_curves_are_refused(tmp_path):
    path = tmp_path / "k1.pem"
    key = ec.generate_private_key(ec.SECP256K1())
    path.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(ConfigError, match="curve secp256k1 is not supported"):
        build(public_key_file=str(path))


def test_jwks_url_must_be_http():
    with pytest.raises(ConfigError, match=r"plugins\.auth_jwt\.jwks_url: expected an http"):
        build(jwks_url="file:///etc/jwks.json")


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'plugins\.auth_jwt\.secret_key'"):
        build(secret_key=SECRET)
    with pytest.raises(ConfigError, match=r"plugins\.auth_jwt\.leeway: expected seconds"):
        build(secret=SECRET, leeway="soon")


def test_durations_accept_units():
    plugin = build(jwks_url="https://idp.example/jwks", leeway="1m", jwks_refresh_interval="1h")
    assert plugin.rules.leeway == 60
    assert plugin.keys.refresh_interval == 3600


def test_the_hook_is_async_only_for_jwks(tmp_path):
    """Static keys never wait for I/O: the hook stays a plain method and runs inline."""
    assert not inspect.iscoroutinefunction(build(secret=SECRET).auth_on_register)
    pem = build(public_key_file=rsa_key().write_public(tmp_path))
    assert not inspect.iscoroutinefunction(pem.auth_on_register)
    jwks = build(jwks_url="https://idp.example/jwks")
    assert inspect.iscoroutinefunction(jwks.auth_on_register)


def test_plugin_is_exported():
    assert PLUGIN.__name__ == "AuthJwtPlugin"
