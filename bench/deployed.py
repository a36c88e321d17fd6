# The deployed configuration (issue #42): the brokers as the design card's users run
# them, for `bench.compare --brokers nautilus-deployed,mosquitto-deployed`.
#
# Strategy: every client logs in, and every topic it uses is allowed by a per-user ACL
# pattern (`%u/#`). The load's clients all log in as the user `bench`, so the scenarios'
# topics (`bench/<i>`, `$share/bench/bench/0`) are that user's own tree and stay exactly
# the topics of the no-plugin rows: the two tables differ only by configuration. The drop
# counter's client (bench/drops.py) is a user of its own, `bench-sys`, which may read
# $SYS and nothing else. Nautilus checks a JWT (HS256) on every CONNECT, Mosquitto a
# password file made by mosquitto_passwd (its default hash, PBKDF2-SHA512). The broker
# configurations themselves are in bench/brokers.py (`_nautilus_deployed`,
# `_mosquitto_deployed`); this module writes what they need besides.
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import jwt

from .scenarios import Credentials, Login

LOAD_USER = "bench"  # owns the scenarios' topics: bench/0 .. bench/3
SYS_USER = "bench-sys"  # the drop counter's client
JWT_SECRET = "bench-deployed-secret-" * 3  # 66 bytes, above RFC 7518's 32 for HS256
TOKEN_LIFETIME = 7 * 24 * 3600  # seconds: longer than any run
MOSQUITTO_PASSWORD = "bench-password"

# Nautilus's acl plugin checks a shared subscription as sent, `$share/<group>/<filter>`
# (docs/plugins/acl.md), so the user's tree needs a line of its own there.
NAUTILUS_ACL = f"""\
# bench/deployed.py: each user its own tree; the drop counter's user reads $SYS
pattern %u/#
pattern read $share/+/%u/#
user {SYS_USER}
topic read $SYS/#
"""
# Mosquitto checks the filter of a shared subscription without its `$share/<group>/`.
MOSQUITTO_ACL = f"""\
# bench/deployed.py: each user its own tree; the drop counter's user reads $SYS
pattern readwrite %u/#
user {SYS_USER}
topic read $SYS/#
"""


def token(username: str, secret: str = JWT_SECRET, algorithm: str = "HS256") -> str:
    """A JWT for `username` (auth_jwt's `rid` claim), valid for TOKEN_LIFETIME."""
    now = int(time.time())
    claims = {"rid": username, "iat": now, "exp": now + TOKEN_LIFETIME}
    return jwt.encode(claims, secret, algorithm=algorithm)


def nautilus_credentials() -> Credentials:
    """One HS256 token per user, signed with JWT_SECRET."""
    return Credentials(Login(LOAD_USER, token(LOAD_USER)), Login(SYS_USER, token(SYS_USER)))


def mosquitto_credentials() -> Credentials:
    return Credentials(Login(LOAD_USER, MOSQUITTO_PASSWORD), Login(SYS_USER, MOSQUITTO_PASSWORD))


def nautilus_plugins(workdir: Path) -> str:
    """The [plugins] tables: auth_jwt with the HS256 secret, the acl plugin with its
    file (written into `workdir`)."""
    acl = workdir / "nautilus.acl"
    acl.write_text(NAUTILUS_ACL)
    return (
        "[plugins.auth_jwt]\n"
        "enabled = true\n"
        f'secret = "{JWT_SECRET}"\n'
        'algorithms = ["HS256"]\n'
        "[plugins.acl]\n"
        "enabled = true\n"
        f'acl_file = "{acl}"\n'
    )


def password_file(path: Path, users: dict[str, str], hash_name: str | None = None) -> None:
    """A Mosquitto password file made by `mosquitto_passwd -b` (its default hash, or
    `hash_name`: sha512 or sha512-pbkdf2), one line per user."""
    path.unlink(missing_ok=True)
    for username, password in users.items():
        argv = ["mosquitto_passwd", "-b"] + (["-H", hash_name] if hash_name else [])
        if not path.exists():
            argv.append("-c")
        done = subprocess.run([*argv, str(path), username, password], capture_output=True)
        if done.returncode != 0:
            why = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise RuntimeError(f"mosquitto_passwd failed: {why}")
    path.chmod(0o600)


def mosquitto_security(workdir: Path) -> str:
    """The lines of mosquitto.conf that refuse anonymous clients and check the ACL (the
    files written into `workdir`)."""
    passwords, acl = workdir / "passwords", workdir / "mosquitto.acl"
    password_file(passwords, {LOAD_USER: MOSQUITTO_PASSWORD, SYS_USER: MOSQUITTO_PASSWORD})
    acl.write_text(MOSQUITTO_ACL)
    acl.chmod(0o600)
    return f"password_file {passwords}\nacl_file {acl}\n"
