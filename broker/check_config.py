"""`nautilus check-config FILE`: what a start on FILE would do, without starting.

The config is read and checked as start-up checks it, and the plugins are built (their
files read, their settings checked; nothing of theirs starts), and the cluster channel's
TLS files loaded. Printed: the addresses a
start listens on, the plugins in call order, who decides a CONNECT, a PUBLISH and a
SUBSCRIBE (broker/deciders.py), and the warnings start-up would log. Exit status 0 when
the broker would start (warnings or not), 2 with one line naming the key when it would
not.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from broker import deciders
from broker.config import Config, ConfigError, load_config
from broker.plugins import configured_plugins

RELAY_ADDRESS = "127.0.0.1:7883"  # event_relay.address's default (event_relay/config.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nautilus check-config",
        description="Check a config file and say what a start on it would do.",
    )
    parser.add_argument("file", help="the TOML config file")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    path = parse_args(argv).file
    logged = Collected()  # what building the plugins logs (a table without `enabled`, ...)
    logging.getLogger("nautilus").addHandler(logged)
    try:
        config = load_config(path)
        plugins = configured_plugins(config)
        check_cluster_tls(config)
    except ConfigError as exc:
        print(f"nautilus check-config: {exc}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger("nautilus").removeHandler(logged)
    for line in report(config, plugins):
        print(line)
    found = logged.lines + deciders.warnings(config, plugins)
    for warning in found:
        print(f"WARNING: {warning}")
    said = f"{len(found)} warning{'s' if len(found) != 1 else ''}" if found else "no warnings"
    print(f"{path}: ok, {said}")
    return 0


def check_cluster_tls(config: Config) -> None:
    """The cluster channel's TLS files load, as at start (ConfigError naming the key)."""
    if config.cluster.address and config.cluster.tls_certfile:
        from broker.cluster.channel_tls import ChannelTls  # (only with [cluster])

        ChannelTls(config.cluster)


class Collected(logging.Handler):
    """The warnings and errors logged while the plugins are built, as lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def report(config: Config, plugins: list[tuple[str, Any]]) -> list[str]:
    lines = ["listens on:"]
    lines += [f"  {address:<24} {what}" for what, address in listening(config)]
    chain = ", ".join(deciders.table(name) for name, _ in plugins) or "none"
    lines.append(f"plugins, in call order: {chain}")
    lines.append("who decides:")
    for decision, sentence in deciders.explain(config, plugins).items():
        lines.append(f"  {decision:<10} {sentence}")
    return lines


def listening(config: Config) -> list[tuple[str, str]]:
    """(what, address) for each socket a start binds, named by the key that sets it."""
    found = [
        (f"MQTT {listener.type}, listeners[{i}].address", listener.address)
        for i, listener in enumerate(config.listeners)
    ]
    if config.http.enabled:
        found.append(("HTTP (/metrics, /health, the admin API), http.address", config.http.address))
    relay = config.event_relay
    if relay.get("enabled") is True:
        found.append(("event relay, event_relay.address", relay.get("address", RELAY_ADDRESS)))
    if config.cluster.address:
        found.append(("cluster channel, cluster.address", config.cluster.address))
    return found
