"""auth_on_register with a JWT in the CONNECT password (Courier's vmq_enhanced_auth).

- NEXT when the CONNECT has no password: another plugin may authenticate the client (an
  exhausted chain refuses: CONNACK 5 / 0x87).
- Ok() when the token verifies; its claims go to `ctx.attributes["jwt_claims"]`, where
  the acl plugin finds them.
- Error("invalid_signature") for a token that does not verify: malformed, bad signature,
  an algorithm not allowed, expired, not yet valid, wrong issuer or audience, a missing
  required claim (CONNACK 4 / 0x86, bad credentials).
- Error("missing_rid") / Error("username_rid_mismatch") when the username claim is absent
  or differs from the MQTT username (CONNACK 5 / 0x87, not authorized).
- Error("jwks_unavailable", 0x88) when the keys come from a JWKS URL that has never been
  fetched successfully (CONNACK 3 / 0x88, server unavailable: the client should retry).

With a secret or a public key, verification is plain CPU work and the hook is a plain
method. With a JWKS URL the hook is `async`: it awaits only when a token names a kid the
cached set lacks and a refresh is due (see keys.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from broker.config import ConfigError, Duration
from hooks import NEXT, Error, Metric, Ok, RegisterContext, Result
from plugins.auth_jwt.claims import (
    HMAC,
    INVALID_SIGNATURE,
    KNOWN,
    Refused,
    Rules,
    check_algorithm,
    check_username,
    header,
    mountpoint_of,
    verify,
)
from plugins.auth_jwt.keys import ASYMMETRIC, JwksKeys, StaticKeys, key_algorithms, load_public_key

log = logging.getLogger("nautilus.plugins.auth_jwt")

WHERE = "plugins.auth_jwt"
SOURCES = ("secret", "public_key_file", "jwks_url")
OK = Ok()
JWKS_UNAVAILABLE = "jwks_unavailable"
SERVER_UNAVAILABLE = 0x88  # CONNACK 3 for MQTT 3: the client should retry later


@dataclass(slots=True)
class AuthJwtConfig:
    """The keys of [plugins.auth_jwt]; docs/plugins/auth_jwt.md explains each one."""

    # Exactly one key source.
    secret: str = ""  # HMAC secret: HS256, HS384, HS512
    public_key_file: str = ""  # PEM public key or certificate: RSA, EC, Ed25519/Ed448
    jwks_url: str = ""  # a JWK set over HTTP(S)
    # Allowed "alg" values; empty: every algorithm the key source can verify.
    algorithms: list[str] = field(default_factory=list)
    # Seconds of clock skew allowed when checking exp, nbf and iat.
    leeway: Duration = Duration(0)
    issuer: str = ""  # when set, "iss" must equal it
    audience: str = ""  # when set, "aud" must contain it
    username_claim: str = "rid"  # must equal the MQTT username; "" turns the rule off
    mountpoint_claim: str = ""  # its value is the client's mountpoint; "": no mountpoints
    required_claims: list[str] = field(default_factory=list)  # e.g. ["exp"]
    jwks_refresh_interval: Duration = Duration(900)  # 0: never periodically
    jwks_min_refresh_interval: Duration = Duration(30)  # for unknown kids
    jwks_timeout: Duration = Duration(10)


class NeedKeys(Refused):
    """The JWK set does not know the token's key (yet): a refresh may help."""

    def __init__(self, kid: str | None) -> None:
        detail = f"unknown kid {kid!r}" if kid is not None else "the JWK set has no key"
        super().__init__(INVALID_SIGNATURE, detail)


class AuthJwtPlugin:
    Config = AuthJwtConfig

    def __init__(self, config: AuthJwtConfig) -> None:
        self.config = config
        self.failures: dict[str, int] = {}  # refused tokens by reason
        self.accepted = 0
        chosen = [name for name in SOURCES if getattr(config, name)]
        if len(chosen) != 1:
            got = " and ".join(chosen) if chosen else "none"
            raise ConfigError(f"{WHERE}: set exactly one of {', '.join(SOURCES)} (got {got})")
        self.keys: StaticKeys | JwksKeys
        if config.secret:
            self.keys = StaticKeys(config.secret.encode())
            usable = HMAC
        elif config.public_key_file:
            key = load_public_key(config.public_key_file, f"{WHERE}.public_key_file")
            self.keys = StaticKeys(key)
            usable = key_algorithms(key, f"{WHERE}.public_key_file")
        else:
            if not config.jwks_url.startswith(("https://", "http://")):
                raise ConfigError(f"{WHERE}.jwks_url: expected an http(s) URL")
            self.keys = JwksKeys(
                config.jwks_url,
                refresh_interval=config.jwks_refresh_interval,
                min_refresh_interval=config.jwks_min_refresh_interval,
                timeout=config.jwks_timeout,
            )
            usable = ASYMMETRIC
            # Only this source may have to wait for I/O, so only here is the hook async: the
            # instance attribute shadows the plain method (hooks take either kind).
            self.auth_on_register = self._auth_on_register_jwks  # type: ignore[method-assign,assignment]
        allowed = _allowed_algorithms(config.algorithms, usable, chosen[0])
        if config.secret:
            _check_secret_length(config.secret.encode(), allowed)
        self.rules = Rules(
            algorithms=allowed,
            leeway=config.leeway,
            issuer=config.issuer or None,
            audience=config.audience or None,
            required=tuple(config.required_claims),
            username_claim=config.username_claim,
            mountpoint_claim=config.mountpoint_claim,
        )

    async def start(self) -> None:
        if isinstance(self.keys, JwksKeys):
            await self.keys.start()

    async def stop(self) -> None:
        if isinstance(self.keys, JwksKeys):
            await self.keys.stop()

    # -- the hook

    def auth_on_register(self, ctx: RegisterContext) -> Result:
        if not ctx.password:
            return NEXT
        try:
            claims = self._verify(ctx.password, ctx.username)
        except Refused as refused:
            return self._refuse(ctx, refused)
        return self._accepted(ctx, claims)

    async def _auth_on_register_jwks(self, ctx: RegisterContext) -> Result:
        if not ctx.password:
            return NEXT
        try:
            try:
                claims = self._verify(ctx.password, ctx.username)
            except NeedKeys:
                keys = self.keys
                assert isinstance(keys, JwksKeys)  # this hook serves a JWKS URL only
                refreshed = await keys.refresh_for_unknown_key()
                if not keys.loaded:
                    raise Refused(JWKS_UNAVAILABLE, "no JWK set fetched yet") from None
                if not refreshed:
                    raise  # too soon after the last fetch: the kid stays unknown
                claims = self._verify(ctx.password, ctx.username)  # NeedKeys is final now
        except Refused as refused:
            return self._refuse(ctx, refused)
        return self._accepted(ctx, claims)

    def _accepted(self, ctx: RegisterContext, claims: dict[str, Any]) -> Result:
        try:
            mountpoint = mountpoint_of(claims, self.rules)
        except Refused as refused:
            return self._refuse(ctx, refused)
        ctx.attributes["jwt_claims"] = claims
        self.accepted += 1
        return OK if mountpoint is None else Ok({"mountpoint": mountpoint})

    def _verify(self, token: bytes, username: str | None) -> dict[str, Any]:
        alg, kid = header(token)
        check_algorithm(alg, self.rules)
        keys = self.keys.candidates(alg, kid)
        if keys is None:
            raise NeedKeys(kid)
        if not keys:
            which = f"kid {kid!r}" if kid is not None else "the token"
            raise Refused(INVALID_SIGNATURE, f"no key in the set can verify {alg} for {which}")
        claims = verify(token, keys, self.rules)
        check_username(claims, self.rules, username)
        return claims

    def metrics(self) -> list[Metric]:
        """For /metrics (hooks.Metric): refusals by reason, key set fetches."""
        found = [
            Metric("auth_jwt_failures", count, labels=(("reason", reason),))
            for reason, count in sorted(self.failures.items())
        ]
        found.append(Metric("auth_jwt_accepted", self.accepted))
        if isinstance(self.keys, JwksKeys):
            found.append(Metric("auth_jwt_jwks_fetches", self.keys.fetches))
        return found

    def _refuse(self, ctx: RegisterContext, refused: Refused) -> Error:
        self.failures[refused.reason] = self.failures.get(refused.reason, 0) + 1
        log.info(
            "client %r (username %r): %s: %s",
            ctx.client_id,
            ctx.username,
            refused.reason,
            refused.detail,
        )
        if refused.reason == JWKS_UNAVAILABLE:
            return Error(refused.reason, SERVER_UNAVAILABLE)
        return Error(refused.reason)


def _allowed_algorithms(names: list[str], usable: frozenset[str], source: str) -> frozenset[str]:
    """The configured allow-list, checked against what the key source can verify."""
    where = f"{WHERE}.algorithms"
    for name in names:
        if name.lower() == "none":
            raise ConfigError(f"{where}: 'none' is never allowed (unsigned tokens)")
        if name not in KNOWN:
            raise ConfigError(f"{where}: unknown algorithm {name!r} (known: {_list(KNOWN)})")
    wrong = [name for name in names if name not in usable]
    if source != "secret" and any(name in HMAC for name in wrong):
        raise ConfigError(
            f"{where}: HS* with {source} is refused (algorithm confusion: the public key "
            "would serve as an HMAC secret anyone can use)"
        )
    if wrong:
        raise ConfigError(
            f"{where}: {_list(wrong)} cannot be verified with {source} (usable: {_list(usable)})"
        )
    return frozenset(names) if names else usable


def _check_secret_length(secret: bytes, allowed: frozenset[str]) -> None:
    """RFC 7518 section 3.2: an HMAC key at least as long as the hash output."""
    short = sorted(alg for alg in allowed & HMAC if len(secret) < int(alg[2:]) // 8)
    if short:
        log.warning(
            "%s.secret: %d bytes is shorter than RFC 7518 asks for %s (32 for HS256, 48 "
            "for HS384, 64 for HS512); a short secret can be brute-forced",
            WHERE,
            len(secret),
            ", ".join(short),
        )


def _list(names) -> str:
    return ", ".join(sorted(names))
