"""`nautilus events tail`: print a relay's events as JSON lines.

    nautilus events tail [--relay HOST:PORT] [--from earliest|latest|committed|SEQ]
                         [--type on_publish,...] [--count N] [--name NAME] [--secret S]

One JSON object per event per line, fields named as in docs/event-relay.md; a payload is
written as text when it is UTF-8, else as base64 under `payload_base64`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from typing import Any

from event_relay.client import RelayClient, RelayError
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
        default=os.environ.get("NAUTILUS_RELAY_SECRET"),
        help="the relay's shared secret (default: $NAUTILUS_RELAY_SECRET)",
    )
    return parser.parse_args(argv)


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
    async with await RelayClient.connect(
        host, port, name=args.name, start=start, types=types, secret=args.secret
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
