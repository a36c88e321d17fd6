"""The `nautilus` command (also `python -m broker`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from importlib.metadata import entry_points

from broker import __version__, logs
from broker.binding import BindError
from broker.config import ConfigError, load_config
from broker.peers import MetadataUnavailable
from broker.plugins import configured_plugins
from broker.protocol import use_compiled
from broker.store import StoreError

log = logging.getLogger("nautilus")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nautilus",
        description="Nautilus, an MQTT 3.1 / 3.1.1 / 5.0 broker.",
        epilog="nautilus passwd [-c | -D] FILE USER: manage a password file "
        "(see nautilus passwd --help). nautilus check-config FILE: check a config file "
        "and say what a start on it would do. nautilus store stats|check|compact --path DIR: "
        "look into a LevelDB store. nautilus events tail [--relay HOST:PORT]: print an "
        "event relay's events (see nautilus events tail --help). nautilus api-key "
        "add|list|delete: the admin API's keys. nautilus admin COMMAND: ask a running "
        "broker (see nautilus admin --help). nautilus cluster status [--url URL] [--key "
        "KEY]: the cluster's nodes, links and routing score.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: built-in)")
    parser.add_argument("--version", action="version", version=f"nautilus {__version__}")
    return parser.parse_args(argv)


async def serve(config, plugins) -> None:
    from broker.server import Broker

    broker = Broker(config, plugins=plugins)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, broker.shutdown_requested.set)
    loop.add_signal_handler(signal.SIGHUP, broker.reload_tls)
    # A start waiting on something that does not answer still stops on a signal.
    starting = asyncio.ensure_future(broker.start())  # a failed start releases what it took
    asked = asyncio.ensure_future(broker.shutdown_requested.wait())
    await asyncio.wait((starting, asked), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("shutting down before the start completed")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    asked.cancel()
    starting.result()
    try:
        await broker.shutdown_requested.wait()
        log.info("shutting down")
    finally:
        await broker.stop()


_ADMIN_VALUED = ("--url", "--key")  # the admin tool's options that take a value


def _split_admin_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """The admin tool's options among `argv` (they go before its command), and the
    command's operands."""
    options: list[str] = []
    operands: list[str] = []
    items = iter(argv)
    for item in items:
        if item in _ADMIN_VALUED:
            options += [item, next(items, "")]
        elif item.startswith(tuple(f"{o}=" for o in _ADMIN_VALUED)) or item == "--json":
            options.append(item)
        else:
            operands.append(item)
    return options, operands


def _subcommand(name: str):
    """A tool a plugin ships (`nautilus passwd ...`), declared as a `nautilus.commands`
    entry point, so the broker itself names no plugin."""
    for entry in entry_points(group="nautilus.commands"):
        if entry.name == name:
            return entry.load()
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "store":  # nautilus store stats|check|compact --path DIR
        from broker.store.tool import main as store_tool

        return store_tool(argv[1:])
    if argv and argv[0] == "check-config":  # nautilus check-config FILE
        from broker.check_config import main as check_config

        return check_config(argv[1:])
    if argv and argv[0] == "api-key":  # nautilus api-key add|list|delete
        from broker.http.api_keys import main as api_key_tool

        return api_key_tool(argv[1:])
    if argv[:2] == ["cluster", "status"]:  # nautilus cluster status [--url ...]
        from broker.http.admin_cli import main as admin_tool

        return admin_tool([*argv[2:], "cluster"])
    if argv[:1] == ["cluster"] and argv[1:2] in (["show"], ["join"], ["leave"]):
        # nautilus cluster show | join ADDRESS | leave [NODE] [--url ... --key ...]
        from broker.http.admin_cli import main as admin_tool

        options, operands = _split_admin_options(argv[2:])
        return admin_tool([*options, f"cluster-{argv[1]}", *operands])
    if argv and argv[0] == "admin":  # nautilus admin sessions|client|disconnect|...
        from broker.http.admin_cli import main as admin_tool

        return admin_tool(argv[1:])
    command = _subcommand(argv[0]) if argv and not argv[0].startswith("-") else None
    if command is not None:
        return command(argv[1:])
    args = parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"nautilus: {exc}", file=sys.stderr)
        return 2
    try:
        logs.configure(config.log)
        plugins = configured_plugins(config)
    except ConfigError as exc:
        print(f"nautilus: {exc}", file=sys.stderr)
        return 2
    if os.environ.get("NAUTILUS_NO_SPEEDUPS"):  # the pure-Python decoder, as without a compiler
        use_compiled(False)
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, only slower
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(config, plugins))
    except ConfigError as exc:  # e.g. a TLS listener's certificate that will not load
        print(f"nautilus: {exc}", file=sys.stderr)
        return 2
    except (StoreError, BindError) as exc:  # a store locked, corrupt, ...; a port taken
        print(f"nautilus: {exc}", file=sys.stderr)
        return 1
    except MetadataUnavailable as exc:  # the cluster's Redis down, or not answering
        print(f"nautilus: the cluster's metadata cannot be reached: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a store directory that cannot be made
        print(f"nautilus: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
