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
