"""Where the verifying keys come from: a static secret or PEM public key, or a JWKS URL.

A key source answers `candidates(alg, kid)`: the keys that may have signed a token with
this header, or None when the source does not know the key *yet* (a JWKS whose kid is
new, or that could not be fetched so far). Only `JwksKeys` ever answers None; the plugin
then asks it to refresh, which is the only time a CONNECT waits for I/O.

JWKS behaviour:
- fetched with aiohttp in start(); a failure there is logged and the broker starts anyway
  (JWT clients are refused with "server unavailable" until a fetch succeeds);
- refreshed every `refresh_interval` seconds (a failed fetch keeps the keys we have and is
  retried sooner), and on a token whose kid we do not know, at most once per
  `min_refresh_interval` seconds;
- one fetch at a time: CONNECTs that need a refresh while one is running wait for it;
- symmetric ("oct") and encryption ("use": "enc") keys in the set are ignored: an HMAC
  secret published over HTTP would let anyone sign tokens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from broker.config import ConfigError
from plugins.auth_jwt.claims import EC, KEY_TYPE, OKP, RSA

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

log = logging.getLogger("nautilus.plugins.auth_jwt")

MAX_JWKS_BYTES = 1 << 20
_CURVE_ALGORITHM = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


# -- static keys ------------------------------------------------------------------------


class StaticKeys:
    """One key for every token: an HMAC secret or a public key."""

    __slots__ = ("_keys",)

    def __init__(self, key: Any) -> None:
        self._keys = (key,)

    def candidates(self, alg: str, kid: str | None) -> Sequence[Any]:
        return self._keys


def load_public_key(path: str, where: str) -> Any:
    """The public key in a PEM file (a public key or a certificate), or ConfigError."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if b"PRIVATE KEY-----" in data:
        raise ConfigError(f"{where}: {path} holds a private key; give the broker the public key")
    key: PublicKeyTypes
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ConfigError(f"{where}: {path} is not a PEM public key or certificate") from None
    key_algorithms(key, where)  # refuses key types no JWT algorithm uses
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        log.warning("%s: a %d-bit RSA key is weak (NIST: 2048 or more)", where, key.key_size)
    return key


def key_algorithms(key: Any, where: str) -> frozenset[str]:
    """Every algorithm that can verify with this public key."""
    if isinstance(key, rsa.RSAPublicKey):
        return RSA
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _CURVE_ALGORITHM.get(key.curve.name)
        if alg is None:
            raise ConfigError(f"{where}: EC curve {key.curve.name} is not supported")
        return frozenset({alg})
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return OKP
    raise ConfigError(f"{where}: a {type(key).__name__} cannot verify JWTs")


# -- JWKS -------------------------------------------------------------------------------

ASYMMETRIC = RSA | EC | OKP


class JwksError(Exception):
    """A JWKS document we cannot use."""


@dataclass(frozen=True, slots=True)
class Jwk:
    kid: str | None
    kty: str
    alg: str | None  # the key's own "alg", when the set names one
    key: Any  # a cryptography public key


def parse_jwks(body: bytes) -> tuple[list[Jwk], int]:
    """The usable signature keys of a JWKS document, and how many keys were skipped."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JwksError(f"not JSON: {exc}") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise JwksError('not a JWK set (no "keys" array)')
    keys, skipped = [], 0
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or entry.get("kty") not in ("RSA", "EC", "OKP")
            or entry.get("use", "sig") != "sig"
            or (entry.get("alg") is not None and entry.get("alg") not in ASYMMETRIC)
        ):
            skipped += 1
            continue
        try:
            key = jwt.PyJWK(entry).key
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            skipped += 1
            continue
        kid = entry.get("kid")
        keys.append(Jwk(kid if isinstance(kid, str) else None, entry["kty"], entry.get("alg"), key))
    if not keys:
        raise JwksError(f"no usable signature key ({skipped} skipped)")
    return keys, skipped


class JwksKeys:
    """Keys from a JWKS URL, cached, refreshed periodically and on an unknown kid."""

    def __init__(
        self, url: str, *, refresh_interval: int, min_refresh_interval: int, timeout: int
    ) -> None:
        self.url = url
        self.refresh_interval = refresh_interval
        self.min_refresh_interval = min_refresh_interval
        self.timeout = timeout
        self.loaded = False  # a fetch has succeeded at least once
        self.fetches = 0  # attempts, successful or not
        self._by_kid: dict[str, tuple[Jwk, ...]] = {}
        self._all: tuple[Jwk, ...] = ()
        self._last_attempt = -math.inf
        self._last_ok = False
        self._session: aiohttp.ClientSession | None = None
        self._inflight: asyncio.Future[bool] | None = None
        self._periodic: asyncio.Task | None = None

    def candidates(self, alg: str, kid: str | None) -> Sequence[Any] | None:
        found = self._by_kid.get(kid) if kid is not None else (self._all or None)
        if found is None:
            return None
        kty = KEY_TYPE[alg]
        return [jwk.key for jwk in found if jwk.kty == kty and jwk.alg in (None, alg)]

    # -- life cycle

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        await self.refresh()
        if self.refresh_interval:
            self._periodic = asyncio.ensure_future(self._refresh_periodically())

    async def stop(self) -> None:
        for task in (self._periodic, self._inflight):
            if task is not None:
                task.cancel()
        self._periodic = self._inflight = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- refreshing

    async def refresh(self) -> bool:
        """Fetch the set now, or join the fetch already running; True if it succeeded."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch())
            self._inflight.add_done_callback(self._fetched)
        return await asyncio.shield(self._inflight)

    async def refresh_for_unknown_key(self) -> bool:
        """refresh(), unless the last attempt was less than min_refresh_interval ago."""
        loop = asyncio.get_running_loop()
        if self._inflight is None and loop.time() - self._last_attempt < self.min_refresh_interval:
            return False
        return await self.refresh()

    def _fetched(self, future: asyncio.Future) -> None:
        if future is self._inflight:
            self._inflight = None

    async def _refresh_periodically(self) -> None:
        while True:
            delay = self.refresh_interval
            if not self._last_ok:  # retry a failed fetch sooner
                delay = min(delay, max(self.min_refresh_interval, 1))
            await asyncio.sleep(delay)
            await self.refresh()

    async def _fetch(self) -> bool:
        assert self._session is not None, "JwksKeys.start() was not called"
        self._last_attempt = asyncio.get_running_loop().time()
        self.fetches += 1
        try:
            async with self._session.get(self.url) as response:
                if response.status != 200:
                    raise JwksError(f"HTTP {response.status}")
                body = bytearray()
                async for chunk in response.content.iter_chunked(65536):
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise JwksError(f"larger than {MAX_JWKS_BYTES} bytes")
            keys, skipped = parse_jwks(bytes(body))
        except (aiohttp.ClientError, TimeoutError, JwksError) as exc:
            self._last_ok = False
            kept = f"keeping {len(self._all)} keys" if self.loaded else "no keys yet"
            log.warning("JWKS %s: fetch failed (%s); %s", self.url, exc or type(exc).__name__, kept)
            return False
        self._install(keys)
        self._last_ok = True
        log.info(
            "JWKS %s: %d keys (kids %s)%s",
            self.url,
            len(keys),
            ", ".join(sorted({jwk.kid or "-" for jwk in keys})),
            f", {skipped} skipped" if skipped else "",
        )
        return True

    def _install(self, keys: list[Jwk]) -> None:
        by_kid: dict[str, list[Jwk]] = {}
        for jwk in keys:
            if jwk.kid is not None:
                by_kid.setdefault(jwk.kid, []).append(jwk)
        # Two assignments, no await between them: a CONNECT sees the old set or the new.
        self._by_kid = {kid: tuple(found) for kid, found in by_kid.items()}
        self._all = tuple(keys)
        self.loaded = True
