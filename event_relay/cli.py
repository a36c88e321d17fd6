"""`nautilus events tail`: print a relay's events as JSON lines.

    nautilus events tail [--relay HOST:PORT] [--from earliest|latest|committed|SEQ]
                         [--type on_publish,...] [--count N] [--name NAME]
                         [--relay-tls] [--relay-cafile FILE]
                         [--relay-certfile FILE [--relay-keyfile FILE]]
                         [--relay-secret-file FILE | --secret S]

One JSON object per event per line, fields named as in docs/event-relay.md; a payload is
written as text when it is UTF-8, else as base64 under `payload_base64`. The secret comes
from --relay-secret-file, else $NAUTILUS_RELAY_SECRET (`--secret` works too, but shows in
`ps`). `relay_arguments` are nautilus-spark's options too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from event_relay.client import RelayClient, RelayError, tls_context
from event_relay.config import host_port
from event_relay.schema import CODES, HOOK_NAMES

DEFAULT_RELAY = "127.0.0.1:7883"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nautilus events", description="Read a Nautilus event relay."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    tail = commands.add_parser("tail", help="print events as JSON lines")
    tail.add_argument("--relay", default=DEFAULT_RELAY, metavar="HOST:PORT")
    tail.add_argument(
        "--from",
        dest="start",
        default="latest",
        metavar="earliest|latest|committed|SEQ",
        help="where to start (default: latest, only new events)",
    )
    tail.add_argument(
        "--type",
        dest="types",
        metavar="TYPE,...",
        help="only these event types (default: every hook's; heartbeat only when named)",
    )
    tail.add_argument("--count", type=int, metavar="N", help="stop after N events")
    tail.add_argument("--name", default="nautilus-events-tail", help="the consumer's name")
    tail.add_argument(
        "--secret",
        help="the relay's shared secret (shows in `ps`: prefer --relay-secret-file or "
        "$NAUTILUS_RELAY_SECRET)",
    )
    relay_arguments(tail)
    return parser.parse_args(argv)


def relay_arguments(parser: argparse.ArgumentParser) -> None:
    """How to reach a relay with TLS and a secret (events tail's and nautilus-spark's)."""
    group = parser.add_argument_group("relay TLS and secret")
    group.add_argument(
        "--relay-tls",
        action="store_true",
        help="connect with TLS (a relay with certfile set); implied by --relay-cafile, "
        "--relay-certfile and --relay-keyfile",
    )
    group.add_argument(
        "--relay-cafile",
        metavar="FILE",
        help="the CA the relay's certificate must chain to (default: the system's)",
    )
    group.add_argument("--relay-certfile", metavar="FILE", help="this consumer's certificate (PEM)")
    group.add_argument(
        "--relay-keyfile", metavar="FILE", help="its key, unless --relay-certfile holds it"
    )
    group.add_argument(
        "--relay-secret-file",
        metavar="FILE",
        help="a file holding the relay's secret (default: $NAUTILUS_RELAY_SECRET)",
    )


def relay_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context relay_arguments ask for (ValueError naming the option of a file
    that will not load), or None: no TLS."""
    files = (args.relay_cafile, args.relay_certfile, args.relay_keyfile)
    if not args.relay_tls and not any(files):
        return None
    return tls_context(*files, option="--relay-")


def relay_secret(args: argparse.Namespace) -> str | None:
    """The secret from --relay-secret-file (its first line), else $NAUTILUS_RELAY_SECRET."""
    path = args.relay_secret_file
    if path is None:
        return os.environ.get("NAUTILUS_RELAY_SECRET") or None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise ValueError(f"--relay-secret-file: cannot read {path}: {why}") from None
    secret = text.splitlines()[0] if text else ""
    if not secret:
        raise ValueError(f"--relay-secret-file: {path} holds no secret (its first line is empty)")
    return secret


def _start(value: str) -> str | int:
    if value in ("earliest", "latest", "committed"):
        return value
    if value.isdigit():
        return int(value)
    raise ValueError(
        f"--from: expected earliest, latest, committed or a sequence number, got {value!r}"
    )


def _types(value: str | None) -> list[str]:
    """The types asked for; by default the hooks' events (heartbeats only when named)."""
    if value is None:
        return list(HOOK_NAMES)
    types = [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in types if t not in CODES]
    if unknown:
        known = ", ".join(CODES)
        raise ValueError(f"--type: unknown event types {', '.join(unknown)} (known: {known})")
    return types


def as_json(event: dict[str, Any]) -> str:
    """One event as a JSON line (bytes as text when they are UTF-8, else base64)."""
    payload = event.get("payload")
    if isinstance(payload, bytes):
        try:
            event["payload"] = payload.decode("utf-8")
        except UnicodeDecodeError:
            del event["payload"]
            event["payload_base64"] = base64.b64encode(payload).decode("ascii")
    return json.dumps(event, ensure_ascii=False)


async def tail(args: argparse.Namespace) -> int:
    host, port = host_port(args.relay, "--relay")
    count = 0
    start, types = _start(args.start), _types(args.types)
    if args.secret is not None and args.relay_secret_file is not None:
        raise ValueError("--secret: give the secret once (--relay-secret-file is given)")
    secret = relay_secret(args) if args.secret is None else args.secret
    tls = relay_tls(args)
    async with await RelayClient.connect(
        host, port, name=args.name, start=start, types=types, secret=secret, tls=tls
    ) as relay:
        if args.count == 0:
            return 0
        async for event in relay:
            print(as_json(event), flush=True)
            count += 1
            if args.count is not None and count >= args.count:
                break
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(tail(args))
    except (ValueError, RelayError) as exc:
        print(f"nautilus events: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except OSError as exc:
        reason = exc.strerror or exc
        print(f"nautilus events: cannot reach the relay at {args.relay}: {reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
