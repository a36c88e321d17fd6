# `python -m bench.jwt_connect`: JWT-authenticated CONNECTs per second against Nautilus.
#
# Strategy: for each mode a fresh Nautilus process runs with `allow_anonymous = false` and
# auth_jwt keyed for that mode (the `anonymous` mode is the baseline: the same CONNECT
# bytes, no auth hook). Every token is signed before the clock starts, one per username,
# so the broker verifies a distinct token on each CONNECT and the generator spends its
# time only on sockets. A round opens `--connections` connections with `--concurrency`
# CONNECTs in flight; the figure is CONNACKs per second from the first CONNECT to the last
# CONNACK. Connections stay open until the round ends, then are aborted; after a warm-up
# round the report gives the median of `--repeats` rounds.
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from broker.protocol import Connect, encode
from hooks import Ok

from .brokers import HOST, BrokerSpec, RunningBroker, raise_fd_limit
from .client import MqttClient
from .report import cpu_busy

MQTT_311 = 4
SECRET = "bench-secret-" * 5  # 65 bytes
SETTLE = 1.0  # seconds between rounds, for the broker to drop the last round's clients

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
    """One way of authenticating: a config section and a token signer."""

    def __init__(self, name: str, alg: str | None, private_key=None) -> None:
        self.name, self.alg, self.private_key = name, alg, private_key

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


MODES: dict[str, Callable[[], Mode]] = {
    "anonymous": lambda: Mode("anonymous", None),
    "allow-all": lambda: Mode("allow-all", "allow-all"),
    "hs256": lambda: Mode("hs256", "HS256"),
    "rs256": lambda: Mode("rs256", "RS256", rsa.generate_private_key(65537, 2048)),
    "es256": lambda: Mode("es256", "ES256", ec.generate_private_key(ec.SECP256R1())),
    "eddsa": lambda: Mode("eddsa", "EdDSA", ed25519.Ed25519PrivateKey.generate()),
}


def spec_for(mode: Mode) -> BrokerSpec:
    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        anonymous = "true" if mode.alg is None else "false"
        text = NAUTILUS_TOML.format(anonymous=anonymous, host=HOST, port=port)
        config.write_text(text + mode.section(workdir))
        return [sys.executable, "-m", "broker", "--config", str(config)]

    return BrokerSpec("nautilus", f"Nautilus ({mode.name})", command, lambda: "")


async def one_round(
    host: str, port: int, connects: list[bytes], concurrency: int, timeout: float
) -> float:
    """Open a connection per pre-encoded CONNECT; CONNACKs per second."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    clients: list[MqttClient] = []

    async def connect(packet: bytes) -> None:
        async with gate:
            _, client = await loop.create_connection(MqttClient, host, port)
            clients.append(client)
            client.transport.write(packet)
            code = await client.connack
            if code != 0:
                raise ConnectionError(f"CONNACK {code}")

    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(connect(p) for p in connects)), timeout)
        return len(connects) / (time.perf_counter() - started)
    finally:
        for client in clients:
            if client.transport is not None:
                client.transport.abort()
        await asyncio.sleep(SETTLE)


async def measure(mode: Mode, args: argparse.Namespace) -> list[float]:
    tokens = [(f"user-{i}", mode.sign(f"user-{i}")) for i in range(args.connections)]
    rates = []
    with RunningBroker(spec_for(mode)) as broker:
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
            rate = await one_round(target.host, target.port, connects, args.concurrency, 60)
            if repeat >= 0:
                rates.append(rate)
            if broker.exit_code() is not None:
                raise RuntimeError(f"broker died:\n{broker.log_tail()}")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.jwt_connect",
        description="JWT-authenticated CONNECTs per second against Nautilus.",
    )
    parser.add_argument("--modes", default="anonymous,allow-all,hs256,rs256", help=", ".join(MODES))
    parser.add_argument("--connections", type=int, default=5000, help="CONNECTs per round")
    parser.add_argument("--concurrency", type=int, default=100, help="CONNECTs in flight")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    args = parser.parse_args(argv)
    raise_fd_limit()
    print(f"CPU busy before the run: {cpu_busy():.0%}")
    print(
        f"{args.connections} CONNECTs per round, {args.concurrency} in flight, "
        f"median of {args.repeats} rounds (MQTT 3.1.1, one fresh broker per mode)"
    )
    results: dict[str, float] = {}
    for name in args.modes.split(","):
        mode = MODES[name]()
        rates = _run(measure(mode, args))
        median = statistics.median(rates)
        results[name] = median
        line = f"{name:>10}: {median:8.0f} connects/s  ({1e6 / median:6.0f} us/connect)"
        extra = ""
        if name != "anonymous" and "anonymous" in results:
            extra = f"  +{1e6 / median - 1e6 / results['anonymous']:.0f} us vs anonymous"
        print(line + extra + f"   rounds: {', '.join(f'{r:.0f}' for r in rates)}")
    return 0


def _run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
