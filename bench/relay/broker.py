# `python -m bench.relay.broker --relay HOST:PORT --tally PATH -- BROKER ARGV...`: a broker
# with one relay consumer attached, as one command for bench/brokers.py, so that
# bench.compare's machinery (a fresh broker per measurement, stopped in `finally`) runs
# "the broker with its relay read" like any other broker.
#
# Strategy: the broker is a child process; this process is the consumer (`follow`: from
# "latest", every event through `batches()`), counting into a Tally file. It attaches as
# soon as the relay listens, which the broker does just before its MQTT listener, so as a
# rule before the load starts; a consumer that attaches late only misses events that
# nobody counts (its rate is taken while events flow, bench/relay/tally.py). SIGTERM or
# SIGINT stops the consumer and then the broker; the broker also gets SIGTERM if this
# process dies without cleaning up (PR_SET_PDEATHSIG). The exit code is the broker's.
from __future__ import annotations

import argparse
import asyncio
import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path

from event_relay.config import host_port

from . import run
from .consumer_process import follow
from .tally import Tally

_READY_TIMEOUT = 20.0  # seconds for the relay's port to accept
_STOP_TIMEOUT = 4.0  # within bench/brokers.py's 5 s before it kills this process
_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay.broker")
    parser.add_argument("--relay", required=True, metavar="HOST:PORT")
    parser.add_argument("--tally", required=True, type=Path)
    parser.add_argument("command", nargs="+", help="the broker's argv, after --")
    args = parser.parse_args(argv)
    host, port = host_port(args.relay, "--relay")
    tally = Tally(args.tally)  # the file exists from the start: one per broker started
    signal.signal(signal.SIGTERM, _interrupt)
    broker = subprocess.Popen(args.command, preexec_fn=_die_with_parent)
    try:
        run(_consume(host, port, tally, broker))
    except KeyboardInterrupt:
        pass
    finally:
        _stop(broker)
    return broker.returncode


async def _consume(host: str, port: int, tally: Tally, broker: subprocess.Popen[bytes]) -> None:
    writer = asyncio.ensure_future(tally.run())
    try:
        await _wait_listening(host, port, broker)
        await follow(host, port, tally)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def _wait_listening(host: str, port: int, broker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while broker.poll() is None and time.monotonic() < deadline:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 0.5)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.05)  # poll interval, bounded by the deadline
        else:
            writer.close()
            return
    raise RuntimeError(f"the relay at {host}:{port} did not listen (broker: {broker.poll()})")


def _stop(broker: subprocess.Popen[bytes]) -> None:
    if broker.poll() is None:
        broker.terminate()
        try:
            broker.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()


def _interrupt(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)  # the runner cancels the consumer


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
