"""What a token must be: an allowed algorithm, a good signature, valid times and claims.

Pure functions over PyJWT, no I/O. Every refusal is a `Refused(reason, detail)`: `reason`
is what the broker reports (and maps to a CONNACK code), `detail` is one line for the log.
Neither ever contains the token.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jwt

from broker.mountpoints import problem as mountpoint_problem

if TYPE_CHECKING:
    from jwt.types import Options

# Algorithm families, by the JWK key type ("kty") that verifies them.
HMAC = frozenset({"HS256", "HS384", "HS512"})
RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
EC = frozenset({"ES256", "ES384", "ES512"})
OKP = frozenset({"EdDSA"})
KEY_TYPE = {
    **dict.fromkeys(HMAC, "oct"),
    **dict.fromkeys(RSA, "RSA"),
    **dict.fromkeys(EC, "EC"),
    **dict.fromkeys(OKP, "OKP"),
}
KNOWN = frozenset(KEY_TYPE)

# Courier's reasons (vmq_enhanced_auth); the broker maps invalid_signature to CONNACK 4 /
# 0x86 (bad credentials) and the claim reasons to 5 / 0x87 (not authorized).
INVALID_SIGNATURE = "invalid_signature"
USERNAME_MISMATCH = "username_rid_mismatch"
MISSING_USERNAME_CLAIM = "missing_rid"
MISSING_MOUNTPOINT_CLAIM = "missing_mountpoint"
INVALID_MOUNTPOINT = "invalid_mountpoint"


class Refused(Exception):
    """A token that does not let its client in."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Rules:
    """The checks every token goes through, prepared once from the plugin's config."""

    algorithms: frozenset[str]
    leeway: int = 0
    issuer: str | None = None
    audience: str | None = None
    required: tuple[str, ...] = ()
    username_claim: str = "rid"  # "" turns the username rule off
    mountpoint_claim: str = ""  # the claim naming the client's mountpoint; "": none
    # Prepared PyJWT arguments, so that a CONNECT builds no list or dict.
    _algorithms: list[str] = field(init=False, repr=False, compare=False)
    _options: Options = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_algorithms", sorted(self.algorithms))
        options: Options = {"require": list(self.required)}
        object.__setattr__(self, "_options", options)


def header(token: bytes) -> tuple[str, str | None]:
    """The token's (alg, kid), unverified: enough to choose the key, or a refusal.

    A light parse of the first segment only, which saves a full decode: it may refuse a
    token, never accept one, since verify() has PyJWT parse and check all of it again."""
    segment = token.partition(b".")[0]
    try:
        fields = json.loads(base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4)))
    except (ValueError, binascii.Error, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Refused(INVALID_SIGNATURE, "not a JWT (no JSON header)") from None
    if not isinstance(fields, dict):
        raise Refused(INVALID_SIGNATURE, "not a JWT (no JSON header)")
    alg, kid = fields.get("alg"), fields.get("kid")
    if not isinstance(alg, str):
        raise Refused(INVALID_SIGNATURE, "the token names no algorithm")
    if kid is not None and not isinstance(kid, str):
        raise Refused(INVALID_SIGNATURE, "the token's kid is not a string")
    return alg, kid


def check_algorithm(alg: str, rules: Rules) -> None:
    """Only allowed algorithms are verified ("none" never is: it cannot be configured)."""
    if alg not in rules.algorithms:
        raise Refused(INVALID_SIGNATURE, f"algorithm {alg!r} is not allowed")


def verify(token: bytes, keys: Iterable[Any], rules: Rules) -> dict[str, Any]:
    """The verified claims of `token`, signed by one of `keys`, or Refused.

    A bad signature moves on to the next key (a key set without kids); any other failure
    (expired, not yet valid, wrong issuer or audience, a missing required claim) is final.
    """
    failure = "no key can verify the token"
    for key in keys:
        try:
            return jwt.decode(
                token,
                key,
                algorithms=rules._algorithms,
                options=rules._options,
                leeway=rules.leeway,
                issuer=rules.issuer,
                audience=rules.audience,
            )
        except jwt.InvalidSignatureError as exc:
            failure = str(exc)
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise Refused(INVALID_SIGNATURE, str(exc) or type(exc).__name__) from None
    raise Refused(INVALID_SIGNATURE, failure)


def check_username(claims: Mapping[str, Any], rules: Rules, username: str | None) -> None:
    """Courier's rule: the configured claim (default `rid`) equals the username exactly."""
    name = rules.username_claim
    if not name:
        return
    if name not in claims:
        raise Refused(MISSING_USERNAME_CLAIM, f"the token has no {name!r} claim")
    value = claims[name]
    if not isinstance(value, str) or value != username:
        raise Refused(USERNAME_MISMATCH, f"the {name!r} claim does not match the username")


def mountpoint_of(claims: Mapping[str, Any], rules: Rules) -> str | None:
    """The client's topic tree, from the configured claim (None when none is configured).
    A token without it is refused: with mountpoints per token, a missing claim must not
    put its client on the default tree, among every tenant's neighbours."""
    name = rules.mountpoint_claim
    if not name:
        return None
    if name not in claims:
        raise Refused(MISSING_MOUNTPOINT_CLAIM, f"the token has no {name!r} claim")
    value = claims[name]
    if not isinstance(value, str) or mountpoint_problem(value) is not None:
        raise Refused(INVALID_MOUNTPOINT, f"the {name!r} claim is not a mountpoint: {value!r}")
    return value
