# `python -m bench.auth_db_drivers`: the two asyncio MySQL drivers, aiomysql and asyncmy,
# side by side on auth_db's CONNECT query, against a real MariaDB.
#
# Strategy: a MariaDB of its own (testing/databases.py, which the tests use too) in a
# temporary directory, vmq_auth_acl filled with `--rows` rows whose passwords are
# MariaDB's PASSWORD() (VerneMQ's default hash for MySQL); then, for each driver, a pool of
# `--pool` connections (autocommit, as the backend opens them) and two measurements, on
# uvloop as the broker runs:
# - throughput: `--concurrency` tasks each sending auth_on_register's SELECT for a random
#   row in a loop for `--duration` seconds: queries per second;
# - latency: `--single` queries one after the other: the median time of one.
# Each query's answer is checked (one row). The drivers alternate in order from round to
# round; the table gives the medians of `--repeats` rounds. aiomysql is not a dependency
# of the project (asyncmy was chosen): `pip install aiomysql` first.
from __future__ import annotations

import argparse
import asyncio
import importlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.auth_db.backends import prepare
from plugins.auth_db.mysql_backend import QUERIES, connect_args
from testing.databases import MariaDbServer
from testing.lifecycle import Missing, ServerError

DRIVERS = ("aiomysql", "asyncmy")
QUERY = prepare(QUERIES["password"], lambda _: "%s", "bench").text  # auth_on_register's
ACL = '[{"pattern":"a/#"},{"pattern":"%u/%c/#"}]'


@dataclass(slots=True)
class Result:
    queries_per_s: float
    p50_ms: float


async def _pool(driver: str, url: str, size: int) -> Any:
    where = connect_args(url)  # asyncmy's names; aiomysql calls the database `db`
    if driver == "aiomysql":
        where["db"] = where.pop("database")
    create_pool = importlib.import_module(driver).create_pool
    return await create_pool(minsize=0, maxsize=size, autocommit=True, **where)


async def _query(pool: Any, row: int) -> None:
    async with pool.acquire() as conn, conn.cursor() as cursor:
        await cursor.execute(QUERY, ("", f"dev-{row}", f"user-{row}", "secret"))
        found = await cursor.fetchall()
    assert len(found) == 1 and found[0][0] == f"dev-{row}", found


async def measure(driver: str, url: str, args: argparse.Namespace) -> Result:
    pool = await _pool(driver, url, args.pool)
    pick = random.Random(1).randrange
    try:
        done = 0
        stop = time.monotonic() + args.warmup

        async def caller() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await _query(pool, pick(args.rows))
                done += 1

        await asyncio.gather(*(caller() for _ in range(args.concurrency)))  # warm: all open
        done = 0
        started = time.monotonic()
        stop = started + args.duration
        await asyncio.gather(*(caller() for _ in range(args.concurrency)))
        rate = done / (time.monotonic() - started)
        times = []
        for _ in range(args.single):
            begun = time.perf_counter()
            await _query(pool, pick(args.rows))
            times.append(time.perf_counter() - begun)
        return Result(rate, statistics.median(times) * 1000)
    finally:
        pool.close()
        await pool.wait_closed()


def _run(coro: Coroutine[Any, Any, Result]) -> Result:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _fill(server: MariaDbServer, rows: int) -> None:
    values = ", ".join(
        f"('', 'dev-{i}', 'user-{i}', PASSWORD('secret'), '{ACL}', '{ACL}')" for i in range(rows)
    )
    server.sql(f"INSERT INTO vmq_auth_acl VALUES {values}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.auth_db_drivers",
        description="aiomysql against asyncmy on auth_db's CONNECT query (medians).",
    )
    parser.add_argument("--rows", type=int, default=1000, help="rows in vmq_auth_acl")
    parser.add_argument("--pool", type=int, default=5, help="connections per pool")
    parser.add_argument("--concurrency", type=int, default=50, help="tasks querying at once")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--single", type=int, default=1000, help="queries timed one by one")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    results: dict[str, list[Result]] = {driver: [] for driver in DRIVERS}
    with tempfile.TemporaryDirectory(prefix="auth-db-drivers-") as directory:
        try:
            server = MariaDbServer(Path(directory)).start()
        except (Missing, ServerError) as exc:  # not installed, or not starting
            print(f"python -m bench.auth_db_drivers: {exc}", file=sys.stderr)
            return 1
        try:
            _fill(server, args.rows)
            version = server.sql("SELECT VERSION()").strip()
            for repeat in range(args.repeats):
                order = DRIVERS if repeat % 2 == 0 else DRIVERS[::-1]
                for driver in order:
                    result = _run(measure(driver, server.url, args))
                    results[driver].append(result)
                    print(
                        f"  {driver:<9} run {repeat + 1}: {result.queries_per_s:8,.0f} queries/s"
                        f"  one query {result.p50_ms:.3f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            server.close()
    print(
        f"\nMariaDB {version}, {args.rows} rows, pool {args.pool}: medians of {args.repeats}"
        f" rounds ({args.concurrency} tasks for {args.duration:g} s; {args.single} single"
        " queries)\n"
    )
    print(f"| driver | queries/s, {args.concurrency} tasks | one query alone, median ms |")
    print("|---|---:|---:|")
    for driver, runs in results.items():
        rate = statistics.median(r.queries_per_s for r in runs)
        p50 = statistics.median(r.p50_ms for r in runs)
        print(f"| {driver} {_version(driver)} | {rate:,.0f} | {p50:.3f} |")
    return 0


def _version(driver: str) -> str:
    from importlib import metadata

    return metadata.version(driver)


if __name__ == "__main__":
    sys.exit(main())
