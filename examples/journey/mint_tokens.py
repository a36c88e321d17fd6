"""Mint the journey's credentials: an RSA key pair for auth_jwt (keys/), a JWT for each
device, for the Spark job and for a dashboard (tokens/NAME.jwt), and the relay's shared
secret (relay.secret). Files are readable by their owner only; run again, it keeps the
key pair and the secret and mints new tokens.

    python mint_tokens.py [--devices 3] [--days 30]
"""

from __future__ import annotations

import argparse
import datetime
import os
import secrets
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

HERE = Path(__file__).resolve().parent


def private_key(keys: Path) -> rsa.RSAPrivateKey:
    """The signing key, made (with its public half for the broker) on the first run."""
    path = keys / "jwt.key.pem"
    if path.exists():
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(loaded, rsa.RSAPrivateKey)
        return loaded
    keys.mkdir(exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(path, pem)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (keys / "jwt.pub.pem").write_bytes(public)
    return key


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=3, help="device-1 .. device-N")
    parser.add_argument("--days", type=int, default=30, help="how long the tokens are valid")
    parser.add_argument("--dir", type=Path, default=HERE, help="where to write (this folder)")
    args = parser.parse_args()
    key = private_key(args.dir / "keys")
    tokens = args.dir / "tokens"
    tokens.mkdir(exist_ok=True)
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=args.days)
    names = [f"device-{n}" for n in range(1, args.devices + 1)] + ["spark", "reader"]
    for name in names:  # the `rid` claim is the username the client logs in with
        token = jwt.encode({"rid": name, "exp": expires}, key, algorithm="RS256")
        _write_private(tokens / f"{name}.jwt", token.encode())
    secret = args.dir / "relay.secret"
    if not secret.exists():
        _write_private(secret, secrets.token_urlsafe(32).encode())
    print(f"tokens for {', '.join(names)} in {tokens}; the relay's secret in {secret}")


if __name__ == "__main__":
    main()
