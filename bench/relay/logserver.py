# `python -m bench.relay.logserver --port P --events N`: the relay's own log and server,
# without a broker, holding N events, for measuring what consumers can read.
#
# Strategy: the log is filled before the server listens (the parent waits for the port),
# with events as the broker's hooks make them (event_relay/plugin.py): on_publish and
# on_deliver in turn, 64-byte payloads, 1,000 clients with their UUID session ids, so the
# bytes per event are those of a real relay. Without a broker, the server has a core to
# itself: the figures are the relay's and the consumers', not the broker's.
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
import uuid
from typing import Any

from event_relay.config import RelayConfig
from event_relay.log import SEGMENT, EventLog
from event_relay.schema import CODES, HEARTBEAT
from event_relay.server import RelayServer

from ..brokers import HOST
from . import run

PAYLOAD = bytes(range(64))
CLIENTS = 1000


def events(count: int) -> list[tuple[int, list[Any]]]:
    """(type code, fields) of `count` events, as the relay plugin would append them."""
    publish, deliver = CODES["on_publish"], CODES["on_deliver"]
    clients = [(f"sensor-{i:04d}", str(uuid.uuid4())) for i in range(CLIENTS)]
    out = []
    for i in range(count):
        client_id, session_id = clients[i // 2 % CLIENTS]
        topic = f"fleet/{client_id}/temperature"
        common = [0, time.time_ns(), 0, client_id, "", "fleet", session_id, topic, 1, False, 64]
        if i % 2 == 0:
            out.append((publish, [*common, PAYLOAD, "telemetry", "fleet/+/temperature"]))
        else:
            out.append((deliver, [*common, PAYLOAD, "telemetry", False]))
    return out


def filled(count: int) -> EventLog:
    log = EventLog(memory_events=count + SEGMENT, memory_bytes=2**40)
    kinds = events(min(count, 2 * CLIENTS))  # fields repeat: the log stamps seq and type
    for i in range(count):
        code, values = kinds[i % len(kinds)]
        log.append(code, values)
    return log


def heartbeat(log: EventLog) -> None:
    log.append(HEARTBEAT, [0, time.time_ns(), 0, None, "", None, None])


async def serve(port: int, count: int) -> None:
    log = filled(count)
    config = RelayConfig(serve=True, address=f"{HOST}:{port}", node_name="bench")
    server = RelayServer(log, config, uuid.uuid4().hex, lambda: heartbeat(log))
    await server.start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay.logserver")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    args = parser.parse_args(argv)
    run(serve(args.port, args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
