# `python -m bench.jwt_connect`: authenticated CONNECTs per second, Nautilus with JWTs or
# its passwd plugin, Mosquitto with a password file; also connect storms (10,000 clients
# reconnecting at once: `--connections 10000 --concurrency 10000`).
#
# Strategy: for each mode a fresh broker process runs with `allow_anonymous = false` and
# the mode's check (the `anonymous` modes are the baseline: the same CONNECT bytes, no
# check). Every token is signed and every password file written before the clock starts,
# one user per connection, so the broker verifies a distinct token (or looks up a
# distinct user) on each CONNECT and the generator spends its time only on sockets; the
# users of a password file share one password and so one hash line (its cost is the
# same as distinct ones', and 10,000 scrypt hashes would take the machine ~40 s to make).
# A round opens `--connections` connections with `--concurrency` CONNECTs in flight; the
# figures are CONNACKs per second from the first CONNECT to the last CONNACK, and the
# broker's CPU time per CONNECT over the same interval (a figure the other load on a
# shared machine distorts less). Connections stay open until the round ends, then are
# aborted; after a warm-up round the report gives the median of `--repeats` rounds. Each
# row also states what one check's hash costs, measured in this process: PyJWT's decode
# with the mode's key, or the password file's hash.
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import pwd
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from broker.protocol import Connect, encode
from hooks import Ok
from plugins.passwd import hashes

from .brokers import HOST, BrokerSpec, RunningBroker, mosquitto_path, raise_fd_limit
from .client import MqttClient
from .deployed import password_file
from .report import cpu_busy
from .scenarios import cpu_seconds

MQTT_311 = 4
SECRET = "bench-secret-" * 5  # 65 bytes
SETTLE = 1.0  # seconds between rounds, for the broker to drop the last round's clients
PASSWORD = b"bench-password"  # every user's, in the password file modes
HASH_ROUNDS = 200  # checks timed for a row's hash cost

NAUTILUS_TOML = """\
[broker]
allow_anonymous = {anonymous}
max_client_id_size = 64
[[listeners]]
type = "tcp"
address = "{host}:{port}"
[store]
backend = "memory"
[log]
level = "warning"
"""


class AllowAll:
    """A plugin that lets every client in: the broker's cost of an auth hook, minus JWT."""

    def auth_on_register(self, ctx):
        return Ok()


class Mode:
    """One way of authenticating Nautilus with a JWT (or none): a config section and a
    token signer."""

    def __init__(self, name: str, alg: str | None, private_key=None) -> None:
        self.name, self.alg, self.private_key = name, alg, private_key

    def spec(self, users: int) -> BrokerSpec:
        def command(workdir: Path, port: int) -> list[str]:
            return _nautilus(workdir, port, self.alg is None, self.section(workdir))

        return BrokerSpec("nautilus", f"Nautilus ({self.name})", command, lambda: "")

    def hash_cost(self) -> str:
        """What one check's verification costs (PyJWT's decode with the key), or ''."""
        alg = self.alg
        if alg is None or alg == "allow-all":
            return ""
        token = self.sign("user-0").decode()
        key = SECRET.encode() if self.private_key is None else self.private_key.public_key()
        seconds = _timed(lambda: jwt.decode(token, key, algorithms=[alg]))
        return f"{alg} verify (PyJWT decode) {seconds * 1e6:.0f} us"

    def section(self, workdir: Path) -> str:
        if self.alg is None:
            return ""
        if self.alg == "allow-all":
            return '[plugins.allow_all]\nenabled = true\nmodule = "bench.jwt_connect:AllowAll"\n'
        if self.private_key is None:
            return f'[plugins.auth_jwt]\nenabled = true\nsecret = "{SECRET}"\n'
        path = workdir / "jwt.pub.pem"
        path.write_bytes(
            self.private_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return f'[plugins.auth_jwt]\nenabled = true\npublic_key_file = "{path}"\n'

    def sign(self, username: str) -> bytes:
        if self.alg in (None, "allow-all"):
            return b"anonymous"
        now = int(time.time())
        claims = {"rid": username, "iat": now, "exp": now + 3600}
        key = SECRET.encode() if self.private_key is None else self.private_key
        return jwt.encode(claims, key, algorithm=self.alg).encode()


MODES: dict[str, Callable[[], Mode | PasswordFileMode]] = {
    "anonymous": lambda: Mode("anonymous", None),
    "allow-all": lambda: Mode("allow-all", "allow-all"),
    "hs256": lambda: Mode("hs256", "HS256"),
    "rs256": lambda: Mode("rs256", "RS256", rsa.generate_private_key(65537, 2048)),
    "es256": lambda: Mode("es256", "ES256", ec.generate_private_key(ec.SECP256R1())),
    "eddsa": lambda: Mode("eddsa", "EdDSA", ed25519.Ed25519PrivateKey.generate()),
    "passwd": lambda: PasswordFileMode("passwd", "nautilus", "scrypt"),
    "passwd-sha512": lambda: PasswordFileMode("passwd-sha512", "nautilus", "sha512"),
    "mosquitto-anonymous": lambda: PasswordFileMode("mosquitto-anonymous", "mosquitto", None),
    "mosquitto-passwd": lambda: PasswordFileMode("mosquitto-passwd", "mosquitto", "sha512-pbkdf2"),
    "mosquitto-sha512": lambda: PasswordFileMode("mosquitto-sha512", "mosquitto", "sha512"),
}


class PasswordFileMode:
    """A password file: Nautilus's passwd plugin (`scheme` scrypt, what `nautilus passwd`
    writes, or sha512, VerneMQ's `$6$`), or Mosquitto's `password_file` (pbkdf2, what
    mosquitto_passwd writes, or sha512, Mosquitto 1.6's); every user's password is
    PASSWORD. `scheme` None: the broker lets anonymous clients in (the baseline)."""

    def __init__(self, name: str, broker: str, scheme: str | None) -> None:
        self.name, self.broker, self.scheme = name, broker, scheme

    def sign(self, username: str) -> bytes:
        return PASSWORD

    def spec(self, users: int) -> BrokerSpec:
        def command(workdir: Path, port: int) -> list[str]:
            path = workdir / "passwords"
            if self.broker == "mosquitto":
                return _mosquitto(workdir, port, self._mosquitto_file(path, users))
            section = ""
            if self.scheme is not None:
                line = _nautilus_hash(self.scheme)
                path.write_text("".join(f"user-{i}:{line}\n" for i in range(users)))
                section = f'[plugins.passwd]\nenabled = true\npassword_file = "{path}"\n'
            return _nautilus(workdir, port, self.scheme is None, section)

        label = "Mosquitto" if self.broker == "mosquitto" else "Nautilus"
        return BrokerSpec(self.broker, f"{label} ({self.name})", command, lambda: "")

    def _mosquitto_file(self, path: Path, users: int) -> Path | None:
        """mosquitto_passwd's line for one user, copied to every user (None: anonymous)."""
        if self.scheme is None:
            return None
        password_file(path, {"user-0": PASSWORD.decode()}, self.scheme)
        line = path.read_text().strip().partition(":")[2]
        path.write_text("".join(f"user-{i}:{line}\n" for i in range(users)))
        return path

    def hash_cost(self) -> str:
        """What one check's hash costs: Nautilus's own verify, or the computation
        Mosquitto makes (PBKDF2-HMAC-SHA512, 101 iterations, 12-byte salt; or one
        SHA-512 of password and salt), with hashlib's OpenSSL as Mosquitto's."""
        salt = os.urandom(12)
        if self.scheme is None:
            return ""
        if self.broker == "nautilus":
            check = hashes.parse_hash(_nautilus_hash(self.scheme))
            seconds = _timed(lambda: check.verify(PASSWORD))
            name = "scrypt n=2048 r=8 p=1" if self.scheme == "scrypt" else "$6$ SHA-512"
        elif self.scheme == "sha512-pbkdf2":
            seconds = _timed(lambda: hashlib.pbkdf2_hmac("sha512", PASSWORD, salt, 101))
            name = "PBKDF2-SHA512 x101"
        else:
            seconds = _timed(lambda: hashlib.sha512(PASSWORD + salt).digest())
            name = "SHA-512"
        return f"{name} {seconds * 1e6:.1f} us"


def _nautilus_hash(scheme: str) -> str:
    """A passwd line's hash of PASSWORD: scrypt as `nautilus passwd` writes it, or
    VerneMQ's `$6$` (one SHA-512 of password and salt, 12 salt bytes as vmq-passwd)."""
    if scheme == "scrypt":
        return hashes.make_hash(PASSWORD)
    salt = os.urandom(12)
    digest = hashlib.sha512(PASSWORD + salt).digest()
    return f"$6${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _timed(check: Callable[[], object]) -> float:
    """CPU seconds one call of `check` takes, on average over HASH_ROUNDS (CPU time, not
    wall-clock time, which other processes on a shared machine stretch)."""
    check()
    started = time.process_time()
    for _ in range(HASH_ROUNDS):
        check()
    return (time.process_time() - started) / HASH_ROUNDS


def _nautilus(workdir: Path, port: int, anonymous: bool, section: str) -> list[str]:
    config = workdir / "nautilus.toml"
    text = NAUTILUS_TOML.format(anonymous=str(anonymous).lower(), host=HOST, port=port)
    config.write_text(text + section)
    return [sys.executable, "-m", "broker", "--config", str(config)]


def _mosquitto(workdir: Path, port: int, passwords: Path | None) -> list[str]:
    """Mosquitto as compare runs it (TCP_NODELAY), with `passwords` (None: anonymous)."""
    lines = [f"listener {port} {HOST}", "set_tcp_nodelay true", "log_dest stderr"]
    lines += ["log_type error", "log_type warning", "max_connections -1"]
    # Started as root, Mosquitto runs as user `mosquitto`, which may not read our files.
    lines.append(f"user {pwd.getpwuid(os.getuid()).pw_name}")
    if passwords is None:
        lines.append("allow_anonymous true")
    else:
        lines += ["allow_anonymous false", f"password_file {passwords}"]
    config = workdir / "mosquitto.conf"
    config.write_text("\n".join(lines) + "\n")
    return [mosquitto_path(), "-c", str(config)]


async def one_round(
    host: str, port: int, connects: list[bytes], concurrency: int, timeout: float
) -> float:
    """Open a connection per pre-encoded CONNECT; CONNACKs per second. Raises
    ConnectionError when one of them fails."""
    storm = await timed_round(host, port, connects, concurrency, timeout)
    if storm.failed:
        raise ConnectionError(storm.failed[0])
    return storm.rate


@dataclass(frozen=True, slots=True)
class Storm:
    """One round: CONNACKs received per second, the broker's CPU seconds over it (None:
    not known) and why each CONNECT that got no successful CONNACK failed."""

    rate: float
    cpu: float | None
    failed: list[str]


async def timed_round(
    host: str,
    port: int,
    connects: list[bytes],
    concurrency: int,
    timeout: float,
    pid: int | None = None,
) -> Storm:
    """As `one_round`, and the CPU seconds process `pid` (the broker) used from the first
    CONNECT to the last CONNACK. A CONNECT that fails (refused, or closed by a broker
    that did not read it within its connect timeout, as in a storm) is counted, not
    raised."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    clients: list[MqttClient] = []
    failed: list[str] = []

    async def connect(packet: bytes) -> None:
        async with gate:
            try:
                _, client = await loop.create_connection(MqttClient, host, port)
            except OSError as exc:
                failed.append(f"connect: {exc}")
                return
            clients.append(client)
            client.transport.write(packet)
            code = await client.connack
            if code is None:
                failed.append("connection closed before CONNACK")
            elif code != 0:
                failed.append(f"CONNACK {code}")

    cpu0 = cpu_seconds(pid)
    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(connect(p) for p in connects)), timeout)
        elapsed = time.perf_counter() - started
        cpu1 = cpu_seconds(pid)
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        return Storm((len(connects) - len(failed)) / elapsed, cpu, failed)
    finally:
        for client in clients:
            if client.transport is not None:
                client.transport.abort()
        await asyncio.sleep(SETTLE)


@dataclass(frozen=True, slots=True)
class Round:
    rate: float  # CONNACKs per second
    cpu_us: float | None  # the broker's CPU time per successful CONNECT, in microseconds
    failed: list[str]  # why each CONNECT without a successful CONNACK failed


async def measure(mode: Mode | PasswordFileMode, args: argparse.Namespace) -> list[Round]:
    tokens = [(f"user-{i}", mode.sign(f"user-{i}")) for i in range(args.connections)]
    rounds = []
    with RunningBroker(mode.spec(args.connections)) as broker:
        target = broker.target
        for repeat in range(-args.warmup, args.repeats):  # rounds below 0 warm up
            connects = [
                encode(
                    Connect(
                        f"{mode.name}-{repeat}-{i}",
                        MQTT_311,
                        keepalive=0,
                        username=user,
                        password=token,
                    ),
                    MQTT_311,
                )
                for i, (user, token) in enumerate(tokens)
            ]
            storm = await timed_round(
                target.host, target.port, connects, args.concurrency, args.timeout, target.pid
            )
            connected = len(connects) - len(storm.failed)
            if repeat >= 0:
                cpu = None if storm.cpu is None or not connected else storm.cpu / connected
                rounds.append(Round(storm.rate, None if cpu is None else cpu * 1e6, storm.failed))
            if broker.exit_code() is not None:
                raise RuntimeError(f"broker died:\n{broker.log_tail()}")
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.jwt_connect",
        description="Authenticated CONNECTs per second: Nautilus with JWTs or its passwd "
        "plugin, Mosquitto with a password file.",
    )
    parser.add_argument("--modes", default="anonymous,allow-all,hs256,rs256", help=", ".join(MODES))
    parser.add_argument("--connections", type=int, default=5000, help="CONNECTs per round")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=100,
        help="CONNECTs in flight (a storm: as many as --connections)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for one round")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {', '.join(sorted(unknown))} (from {', '.join(MODES)})")
    raise_fd_limit()
    print(f"CPU busy before the run: {cpu_busy():.0%}")
    print(
        f"{args.connections} CONNECTs per round, {args.concurrency} in flight, "
        f"median of {args.repeats} rounds (MQTT 3.1.1, one fresh broker per mode)"
    )
    for name in args.modes.split(","):
        mode = MODES[name]()
        rounds = _run(measure(mode, args))
        rate = statistics.median(r.rate for r in rounds)
        cpus = [r.cpu_us for r in rounds if r.cpu_us is not None]
        cpu = f"{statistics.median(cpus):6.0f} us CPU/connect" if cpus else "CPU n/a"
        each = ", ".join(f"{r.rate:.0f}" for r in rounds)
        failures = [reason for r in rounds for reason in r.failed]
        if failures:
            common = max(set(failures), key=failures.count)
            each += f"; {len(failures)} CONNECTs failed ({failures.count(common)}: {common})"
        load = os.getloadavg()[0]
        cost = mode.hash_cost()
        print(
            f"{name:>19}: {rate:8.0f} connects/s  broker {cpu}  load {load:.1f}"
            + (f"  [{cost}]" if cost else "")
            + f"   rounds: {each}"
        )
    return 0


def _run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
