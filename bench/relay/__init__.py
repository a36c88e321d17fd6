"""`python -m bench.relay`: the event relay measured (bench/relay/__main__.py says how)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh event loop, uvloop when installed (as the broker does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def parse(
    argv: list[str],
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    quick: list[str],
) -> argparse.Namespace:
    """A subcommand's options, with --quick (its `quick` options, before the caller's, so
    those still win) and --write."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {' '.join(quick)}")
    parser.add_argument(
        "--write",
        metavar="PATH",
        help="regenerate this table's subsection in the Event relay section of this page",
    )
    args = parser.parse_args(argv)
    return parser.parse_args([*quick, *argv]) if args.quick else args


def compare_args(
    argv: list[str],
    prog: str,
    description: str,
    brokers: str,
    scenarios: str,
    defaults: dict[str, str],
    quick: dict[str, str],
) -> argparse.Namespace:
    """bench.compare's options for a subcommand that measures with it: `defaults` (or
    with --quick, `quick`) unless the caller gives them, and --write."""
    from .. import compare  # bench.compare is heavy; the other subcommands do without it

    chosen = quick if "--quick" in argv else defaults
    argv = [a for a in argv if a != "--quick"]
    given = {a.partition("=")[0] for a in argv}
    argv = [*(x for k, v in chosen.items() if k not in given for x in (k, v)), *argv]
    return compare.parse_args(
        argv,
        prog=prog,
        description=f"{description} (--quick: a smoke run).",
        brokers=brokers,
        scenarios=scenarios,
        calibrate=False,
        write_help="regenerate this table's subsection in the Event relay section of this page",
        modes="bounded,flood",
    )
