# `python -m bench.auth_db`: CONNECTs per second and publish authorizations per second
# with each auth_db backend, against the password-file plugin (passwd).
#
# Strategy: for each mode a database of its own (PostgreSQL, Redis, MariaDB: testing/'s
# servers, which the tests use too, on ephemeral ports) holds `--users` users, each a default row
# (client_id `*`) whose ACLs allow `bench/#`; a fresh Nautilus process runs with
# `allow_anonymous = false` and the mode's plugin. Passwords are hashed as each mode's
# documented set-up does, at comparable cost: pgcrypto's `gen_salt('bf')` (bcrypt, cost
# 6) compared by PostgreSQL; bcrypt cost 6 checked by the broker (postgres-bcrypt, redis);
# MariaDB's PASSWORD() (one SHA-1 twice); the passwd plugin's own `$scrypt$` (its default,
# N=2^14) and VerneMQ's `$6$` (one SHA-512, as vmq_passwd writes). Connects: a round
# opens `--connections` connections, `--concurrency` CONNECTs in flight, users in turn
# (bench/jwt_connect.py's rounds); the median of `--repeats` rounds after a warm-up one.
# Publish authorizations: mqttgen floods QoS 0 over 4 publisher/subscriber pairs, every
# client logged in as one user, so every PUBLISH goes through auth_on_publish (auth_db:
# the connection's cached ACLs; passwd has no publish hook: the ceiling).
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import redis

from broker.protocol import Connect, encode
from plugins.passwd.hashes import make_hash
from testing.databases import MariaDbServer, PostgresServer
from testing.lifecycle import Missing, ServerError, ServerProcess
from testing.redis_server import RedisServer

from . import cgen
from .brokers import HOST, BrokerSpec, RunningBroker, raise_fd_limit
from .jwt_connect import _run, one_round
from .report import cpu_busy

MQTT_311 = 4
ACL = json.dumps([{"pattern": "bench/#"}])
TOML = """\
[broker]
allow_anonymous = false
max_client_id_size = 64
[[listeners]]
address = "{host}:{port}"
[store]
backend = "memory"
[log]
level = "warning"
"""


def password(i: int) -> str:
    return f"pw-{i}"


@dataclass
class Mode:
    name: str
    what: str
    # (a temporary directory, users) -> the plugin's TOML tables; starts what it needs.
    prepare: Callable[[Path, int], str]


def sha512_line(user: str, secret: str) -> str:
    """VerneMQ's vmq_passwd line: $6$<salt>$<sha512(password + salt)>, base64."""
    import base64
    import hashlib
    import os

    salt = os.urandom(12)
    digest = hashlib.sha512(secret.encode() + salt).digest()
    return f"{user}:$6${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def passwd_mode(kind: str, acl: bool = False) -> Callable[[Path, int], str]:
    def prepare(work: Path, users: int) -> str:
        lines = [
            sha512_line(f"user-{i}", password(i))
            if kind == "sha512"
            else f"user-{i}:{make_hash(password(i).encode())}"
            for i in range(users)
        ]
        path = work / "passwd"
        path.write_text("\n".join(lines) + "\n")
        section = f'[plugins.passwd]\nenabled = true\npassword_file = "{path}"\n'
        if acl:  # vmq_acl's file: every user may publish and subscribe under bench/
            (work / "acl").write_text("topic bench/#\n")
            section += f'[plugins.acl]\nenabled = true\nacl_file = "{work / "acl"}"\n'
        return section

    return prepare


SERVERS: list[ServerProcess] = []  # the databases started, stopped at the end


def postgres_mode(password_hash: str) -> Callable[[Path, int], str]:
    def prepare(work: Path, users: int) -> str:
        server = PostgresServer(work / "postgres").start()
        SERVERS.append(server)
        stored = "crypt('{p}', gen_salt('bf'))" if password_hash == "crypt" else "'{h}'"
        values = ",".join(
            f"('', '*', 'user-{i}', "
            + stored.format(p=password(i), h=_bcrypt(password(i)))
            + f", '{ACL}', '{ACL}')"
            for i in range(users)
        )
        server.sql(f"INSERT INTO vmq_auth_acl VALUES {values}")
        return _auth_db("postgres", server.url, password_hash)

    return prepare


def redis_mode(work: Path, users: int) -> str:
    server = RedisServer(work / "redis").start()
    SERVERS.append(server)
    store = redis.Redis.from_url(server.url)
    acl = json.loads(ACL)
    for i in range(users):
        entry = {"passhash": _bcrypt(password(i)), "publish_acl": acl, "subscribe_acl": acl}
        store.set(json.dumps(["", "*", f"user-{i}"], separators=(",", ":")), json.dumps(entry))
    store.close()
    return _auth_db("redis", server.url, "bcrypt")


def mysql_mode(work: Path, users: int) -> str:
    server = MariaDbServer(work / "mariadb").start()
    SERVERS.append(server)
    values = ",".join(
        f"('', '*', 'user-{i}', PASSWORD('{password(i)}'), '{ACL}', '{ACL}')" for i in range(users)
    )
    server.sql(f"INSERT INTO vmq_auth_acl VALUES {values}")
    return _auth_db("mysql", server.url, "password")


def _bcrypt(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(6)).decode()


def _auth_db(backend: str, url: str, password_hash: str) -> str:
    return (
        f'[plugins.auth_db]\nenabled = true\nbackend = "{backend}"\nurl = "{url}"\n'
        f'password_hash = "{password_hash}"\n'
    )


MODES = {
    mode.name: mode
    for mode in [
        Mode("passwd-sha512", "passwd, VerneMQ's $6$ (one SHA-512)", passwd_mode("sha512")),
        Mode("passwd-scrypt", "passwd, its default $scrypt$ (N=2^14)", passwd_mode("scrypt")),
        Mode("passwd-acl", "passwd $6$ and the acl plugin's file", passwd_mode("sha512", True)),
        Mode(
            "postgres",
            "auth_db postgres, crypt (bcrypt cost 6, in PostgreSQL)",
            postgres_mode("crypt"),
        ),
        Mode(
            "postgres-bcrypt",
            "auth_db postgres, bcrypt cost 6 in the broker",
            postgres_mode("bcrypt"),
        ),
        Mode("redis", "auth_db redis, bcrypt cost 6 in the broker", redis_mode),
        Mode("mysql", "auth_db mysql (MariaDB), PASSWORD()", mysql_mode),
    ]
}


async def connects(port: int, args: argparse.Namespace) -> list[float]:
    rates = []
    for repeat in range(-1, args.repeats):  # round -1 warms up
        packets = [
            encode(
                Connect(
                    f"c{repeat}-{i}",
                    MQTT_311,
                    keepalive=0,
                    username=f"user-{i % args.users}",
                    password=password(i % args.users).encode(),
                ),
                MQTT_311,
            )
            for i in range(args.connections)
        ]
        rate = await one_round(HOST, port, packets, args.concurrency, 120)
        if repeat >= 0:
            rates.append(rate)
    return rates


async def publishes(port: int, args: argparse.Namespace) -> float:
    load = cgen.Load(
        publishers=4,
        subscribers=4,
        duration=args.duration,
        username="user-0",
        password=password(0),
    )
    result = await cgen.run(HOST, port, load)
    return float(result["accepted_per_s"])


def measure(mode: Mode, args: argparse.Namespace) -> tuple[float, list[float], float]:
    with tempfile.TemporaryDirectory(prefix="bench-auth-db-") as tmp:
        work = Path(tmp)

        def command(workdir: Path, port: int) -> list[str]:
            config = workdir / "nautilus.toml"
            config.write_text(TOML.format(host=HOST, port=port) + section)
            return [sys.executable, "-m", "broker", "--config", str(config)]

        try:
            section = mode.prepare(work, args.users)
            with RunningBroker(BrokerSpec("nautilus", mode.name, command, lambda: "")) as broker:
                try:
                    rates = _run(connects(broker.target.port, args))
                    published = _run(publishes(broker.target.port, args))
                except (ConnectionError, cgen.GeneratorError) as exc:
                    tail = broker.log_tail()
                    raise RuntimeError(f"{mode.name}: {exc}; the broker:\n{tail}") from None
                if broker.exit_code() is not None:
                    raise RuntimeError(f"broker died:\n{broker.log_tail()}")
        finally:
            while SERVERS:
                SERVERS.pop().kill()
    return statistics.median(rates), rates, published


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.auth_db", description=__doc__)
    parser.add_argument("--modes", default=",".join(MODES), help=", ".join(MODES))
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--connections", type=int, default=2000, help="CONNECTs per round")
    parser.add_argument("--concurrency", type=int, default=100, help="CONNECTs in flight")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the median is shown")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of publishing")
    args = parser.parse_args(argv)
    raise_fd_limit()
    print(f"CPU busy before the run: {cpu_busy():.0%}")
    print(
        f"{args.connections} CONNECTs per round over {args.users} users, {args.concurrency} "
        f"in flight, median of {args.repeats} rounds; publishes: mqttgen, QoS 0, 4 pairs, "
        f"{args.duration:g} s"
    )
    print("| Mode | Connects/s (median) | Rounds | Publishes authorized/s |")
    print("|---|---|---|---|")
    for name in args.modes.split(","):
        mode = MODES[name]
        try:
            median, rates, published = measure(mode, args)
        except (Missing, ServerError) as exc:  # a database not installed, or not starting
            print(f"python -m bench.auth_db: {mode.name}: {exc}", file=sys.stderr)
            return 1
        rounds = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| {mode.what} | {median:,.0f} | {rounds} | {published:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
