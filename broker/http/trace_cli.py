"""`nautilus admin trace client CLIENT_ID ...`: the admin API's trace stream, read and
printed a line at a time until the trace ends (or Ctrl-C, which ends it: the broker
notices the connection closing).

A line prints as `HH:MM:SS.mmm node [mountpoint/]client KIND text`, or as the API's JSON
with --json.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import IO, Any

# The broker writes a comment every 10 s on a quiet stream (trace_stream.HEARTBEAT): a
# read waits longer than that before it gives up on the broker.
READ_TIMEOUT = 60.0


def follow(request: urllib.request.Request, as_json: bool) -> int:
    """Print the stream's lines; 0 once the trace ends."""
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT) as response:
            for event, line in events(response):
                print(json.dumps(line, ensure_ascii=False) if as_json else text(line), flush=True)
                if event == "end":
                    return 0
    except KeyboardInterrupt:
        return 0
    print("nautilus admin: the trace stream ended without its last line", file=sys.stderr)
    return 1


def events(response: IO[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event ("" for a plain line)."""
    name = ""
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n")
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            yield name, json.loads(line[len("data: ") :])
            name = ""


def text(line: dict[str, Any]) -> str:
    """One line as the terminal shows it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(line["time"]))
    millis = int(line["time"] * 1000) % 1000
    mountpoint, client = line["mountpoint"], line["client_id"]
    if mountpoint:
        client = f"{mountpoint}/{client}"
    return f"{stamp}.{millis:03d} {line['node']} {client} {line['kind'].upper()} {line['text']}"
