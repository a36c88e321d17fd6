# `python -m bench.relay.sinkserver http|courier --port P --tally PATH`: where the broker
# sends its events in `bench.relay sinks`, counting them into a Tally.
#
# - http: an aiohttp server answering every POST with 200 and an empty body, as a webhook
#   endpoint of event hooks does (the webhooks plugin ignores the body of event answers).
# - courier: a TCP server reading Courier's sidecar frames (a 4-byte big-endian length,
#   then a google.protobuf.Any) from any number of connections; frames are counted, not
#   decoded, as the cheapest sidecar could.
# Each runs in a process of its own, so it does not share an event loop with the broker.
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from ..brokers import HOST
from . import run
from .tally import Tally


class _CourierFrames(asyncio.Protocol):
    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start, frames = 0, 0
        while len(buffer) - start >= 4:
            end = start + 4 + int.from_bytes(buffer[start : start + 4], "big")
            if end > len(buffer):
                break
            start = end
            frames += 1
        del buffer[:start]
        self.tally.count += frames


async def _serve_courier(port: int, tally: Tally) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _CourierFrames(tally), HOST, port)
    async with server:
        await _until_stopped(tally)


async def _serve_http(port: int, tally: Tally) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        tally.count += 1
        return web.Response()

    app = web.Application()
    app.router.add_post("/{hook}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    try:
        await _until_stopped(tally)
    finally:
        await runner.cleanup()


async def _until_stopped(tally: Tally) -> None:
    """Keep the tally written until SIGTERM or SIGINT."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    writer = asyncio.ensure_future(tally.run())
    await stopped.wait()
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


SERVERS = {"http": _serve_http, "courier": _serve_courier}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay.sinkserver")
    parser.add_argument("kind", choices=SERVERS)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tally", type=Path, required=True)
    args = parser.parse_args(argv)
    run(SERVERS[args.kind](args.port, Tally(args.tally)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
