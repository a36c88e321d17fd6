"""Keys generated for the tests, and tokens signed with them (honest ones and forgeries).

Nothing here is checked in: every key is made when the tests start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

SECRET = "a-test-secret-" * 5  # 65 bytes: long enough for HS512 (RFC 7518 section 3.2)
ISSUER = "https://issuer.example"
AUDIENCE = "nautilus"
_DELETE = object()


@dataclass(frozen=True)
class KeyPair:
    name: str
    private: Any
    alg: str  # the algorithm tests sign with

    @property
    def public(self) -> Any:
        return self.private.public_key()

    def public_pem(self) -> bytes:
        return self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def private_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write_public(self, directory: Path) -> str:
        path = directory / f"{self.name}.pub.pem"
        path.write_bytes(self.public_pem())
        return str(path)

    def jwk(self, kid: str | None = None, **fields: Any) -> dict[str, Any]:
        """The public key as a JWK (with `kid` and any other fields given)."""
        algorithm = jwt.get_algorithm_by_name(self.alg)
        jwk = algorithm.to_jwk(self.public, as_dict=True)
        if kid is not None:
            jwk["kid"] = kid
        return {**jwk, **fields}

    def sign(self, claims: dict[str, Any], kid: str | None = None, alg: str | None = None) -> str:
        headers = {"kid": kid} if kid is not None else None
        return jwt.encode(claims, self.private, algorithm=alg or self.alg, headers=headers)


@cache
def rsa_key(name: str = "rsa") -> KeyPair:
    return KeyPair(name, rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


@cache
def ec_key(name: str = "ec") -> KeyPair:
    return KeyPair(name, ec.generate_private_key(ec.SECP256R1()), "ES256")


@cache
def ed25519_key(name: str = "ed25519") -> KeyPair:
    return KeyPair(name, ed25519.Ed25519PrivateKey.generate(), "EdDSA")


def claims(username: str | None = "alice", **changes: Any) -> dict[str, Any]:
    """Valid claims for `username` (rid, iat, exp five minutes on); `changes` override
    them, and a value of DELETE removes the claim."""
    now = int(time.time())
    base: dict[str, Any] = {"rid": username, "iat": now, "exp": now + 300}
    base.update(changes)
    return {name: value for name, value in base.items() if value is not _DELETE}


DELETE = _DELETE


def hs_sign(
    claims: dict[str, Any],
    secret: str | bytes = SECRET,
    alg: str = "HS256",
    kid: str | None = None,
) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid} if kid else None)


def forge_hs256(claims: dict[str, Any], secret: bytes) -> str:
    """An HS256 token keyed with `secret`, built by hand: PyJWT refuses to use a PEM
    public key as an HMAC secret, which is exactly the algorithm-confusion attack."""
    signing_input = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    signing_input += "." + _b64(json.dumps(claims).encode())
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


def tamper(token: str, claims: dict[str, Any]) -> str:
    """`token` with its claims replaced and its header and signature kept."""
    header, _, signature = token.split(".")
    return f"{header}.{_b64(json.dumps(claims).encode())}.{signature}"


def unsigned(claims: dict[str, Any]) -> str:
    """alg "none": a header, the claims and an empty signature."""
    return jwt.encode(claims, None, algorithm="none")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
