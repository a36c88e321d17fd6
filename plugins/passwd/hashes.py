"""Password hashes: VerneMQ's `$6$` (read only) and salted scrypt (read and written).

Pure functions, no I/O. A hash is the text after `username:` in a password file:

- `$6$<base64(salt)>$<base64(SHA-512(password ‖ salt))>`: VerneMQ's vmq.passwd format, a
  single SHA-512 digest (not crypt(3)). Verified so that a vmq.passwd file works as it is;
  never written, because one fast digest is cheap to brute-force.
- `$scrypt$n=N,r=R,p=P$<base64(salt)>$<base64(key)>`: hashlib.scrypt with the parameters
  recorded in the line, so stronger parameters can be adopted later without breaking old
  lines. `make_hash` writes N=2048, r=8, p=1 (2 MiB, about 4 ms on one core; see
  docs/plugins/passwd.md for the measurements).

Base64 is the standard alphabet with padding (what VerneMQ's `base64:encode` writes).
Comparisons use hmac.compare_digest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2048, 8, 1
SALT_BYTES = 16
KEY_BYTES = 32
# Bounds on parameters read from a file, so a mistyped line cannot make every CONNECT of
# that user allocate gigabytes or spin for seconds (scrypt needs 128 * r * n bytes).
MAX_SCRYPT_MEMORY = 64 * 1024 * 1024  # n=65536, r=8 at most
MAX_SCRYPT_P = 16
SHA512_BYTES = 64


class HashError(ValueError):
    """A hash that cannot be read; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Sha512Hash:
    """VerneMQ's `$6$`: SHA-512 of the password bytes followed by the salt bytes."""

    salt: bytes
    digest: bytes
    cheap = True  # about a microsecond: verify on the event loop

    def verify(self, password: bytes) -> bool:
        attempt = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(attempt, self.digest)


@dataclass(frozen=True, slots=True)
class ScryptHash:
    n: int
    r: int
    p: int
    salt: bytes
    key: bytes
    cheap = False  # milliseconds of CPU: verify off the event loop

    def verify(self, password: bytes) -> bool:
        attempt = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.key))
        return hmac.compare_digest(attempt, self.key)

    def encode(self) -> str:
        return f"$scrypt$n={self.n},r={self.r},p={self.p}${_b64(self.salt)}${_b64(self.key)}"


Hash = Sha512Hash | ScryptHash


def make_hash(password: bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new `$scrypt$` hash of `password` with a random salt."""
    _check_scrypt_parameters(n, r, p)
    salt = os.urandom(SALT_BYTES)
    return ScryptHash(n, r, p, salt, _scrypt(password, salt, n, r, p, KEY_BYTES)).encode()


def parse_hash(text: str) -> Hash:
    """Read one hash; raises HashError naming what is wrong."""
    if text.startswith("$6$"):
        return _parse_sha512(text)
    if text.startswith("$scrypt$"):
        return _parse_scrypt(text)
    scheme = text.split("$")[1] if text.startswith("$") and text.count("$") > 1 else ""
    if scheme:
        raise HashError(f"unknown hash scheme ${scheme}$ (expected $6$ or $scrypt$)")
    raise HashError("expected a hash starting with $6$ or $scrypt$")


def _parse_sha512(text: str) -> Sha512Hash:
    parts = text.split("$")  # ["", "6", salt, digest]
    if len(parts) != 4:
        raise HashError("expected $6$<base64 salt>$<base64 SHA-512 digest>")
    salt = _unb64(parts[2], "salt")
    digest = _unb64(parts[3], "digest")
    if not salt:
        raise HashError("empty salt")
    if len(digest) != SHA512_BYTES:
        raise HashError(f"SHA-512 digest is {len(digest)} bytes, expected {SHA512_BYTES}")
    return Sha512Hash(salt, digest)


def _parse_scrypt(text: str) -> ScryptHash:
    parts = text.split("$")  # ["", "scrypt", "n=..,r=..,p=..", salt, key]
    if len(parts) != 5:
        raise HashError("expected $scrypt$n=N,r=R,p=P$<base64 salt>$<base64 key>")
    params: dict[str, int] = {}
    for item in parts[2].split(","):
        name, _, value = item.partition("=")
        if name not in ("n", "r", "p") or name in params or not value.isdigit():
            raise HashError(f"bad scrypt parameters {parts[2]!r} (expected n=N,r=R,p=P)")
        params[name] = int(value)
    if len(params) != 3:
        raise HashError(f"bad scrypt parameters {parts[2]!r} (expected n=N,r=R,p=P)")
    n, r, p = params["n"], params["r"], params["p"]
    _check_scrypt_parameters(n, r, p)
    salt = _unb64(parts[3], "salt")
    key = _unb64(parts[4], "key")
    if not salt:
        raise HashError("empty salt")
    if not 16 <= len(key) <= 64:
        raise HashError(f"scrypt key is {len(key)} bytes, expected 16 to 64")
    return ScryptHash(n, r, p, salt, key)


def _check_scrypt_parameters(n: int, r: int, p: int) -> None:
    if n < 2 or n & (n - 1):
        raise HashError(f"scrypt n={n} must be a power of 2 above 1")
    if r < 1 or not 1 <= p <= MAX_SCRYPT_P:
        raise HashError(f"scrypt r={r}, p={p}: need r >= 1 and 1 <= p <= {MAX_SCRYPT_P}")
    if 128 * r * n > MAX_SCRYPT_MEMORY:
        limit = MAX_SCRYPT_MEMORY // (1024 * 1024)
        raise HashError(f"scrypt n={n}, r={r} needs more than {limit} MiB")


def _scrypt_memory(n: int, r: int, p: int) -> int:
    return 128 * r * (n + p + 2)  # what OpenSSL allocates (V and B)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    maxmem = _scrypt_memory(n, r, p) + 1024 * 1024
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=length)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise HashError(f"{what} is not valid base64") from None
