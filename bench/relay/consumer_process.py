# The relay's consumers in the benchmarks, each in a process of its own.
#
# - `follow`: attached from "latest", reads every event with `batches()` until the relay
#   closes, counting into a Tally (the consumer beside a broker under load, run by
#   bench/relay/broker.py). If it falls out of the retained range it goes on from the
#   oldest event still there and counts what it missed as lost.
# - `python -m bench.relay.consumer_process --port P --events N --form raw|decoded`: reads N
#   events from "earliest" and prints {"start": t, "end": t} (CLOCK_MONOTONIC) as JSON.
#   It says "ready" once imported and starts reading on a line on its standard input, so
#   that several of them start at once (bench/relay/consumers.py).
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from event_relay.client import OutOfRange, RelayClient
from event_relay.schema import event_count

from ..brokers import HOST
from . import run
from .tally import Tally

NAME = "bench"


async def follow(host: str, port: int, tally: Tally) -> None:
    start: str | int = "latest"
    position: int | None = None  # the next event wanted
    while True:
        client = await RelayClient.connect(host, port, name=NAME, start=start)
        assert client.start is not None  # a streaming connection
        if position is not None:
            tally.lost += client.start - position
        position = client.start
        try:
            async for batch in client.batches():
                counts = list(map(event_count, batch))
                tally.count += sum(counts)  # a record may hold several events
                position = batch[-1][0] + counts[-1]
            return  # the relay closed the connection: the broker is stopping
        except OutOfRange:
            start = "earliest"
        finally:
            await client.close()


async def drain(port: int, events: int, decoded: bool) -> tuple[float, float]:
    """Read `events` events from the start of the log; (start, end) in monotonic seconds."""
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started = time.monotonic()
    count = 0
    async with await RelayClient.connect(HOST, port, name=NAME, start="earliest") as client:
        if decoded:
            async for _ in client:
                count += 1
                if count >= events:
                    break
        else:
            async for batch in client.batches():
                count += sum(map(event_count, batch))
                if count >= events:
                    break
    return started, time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay.consumer_process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--form", choices=("raw", "decoded"), default="raw")
    args = parser.parse_args(argv)
    started, ended = run(drain(args.port, args.events, args.form == "decoded"))
    print(json.dumps({"start": started, "end": ended}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
