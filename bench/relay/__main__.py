# `python -m bench.relay SUBCOMMAND [options]`: the event relay measured, one table per
# subcommand, each also written into the "## Event relay" section of docs/performance.md
# with `--write docs/performance.md`; `--quick` is a smoke run of about a minute.
#
#   consumers  events/s from the relay to 1 and to 4 consumer processes (bench/relay/consumers.py)
#   overhead   broker throughput, relay off vs on with a consumer, bounded and flood (overhead.py)
#   sinks      the same events via webhooks, the relay and the Courier sidecar push (sinks.py)
#   memory     broker RSS under a flood with a consumer that stops reading (memory.py)
#   spool      broker throughput with the relay's spool, by durability (spool.py)
#
# Every process started (brokers, the relay's log server, consumers, sinks) is stopped in
# `finally`, on Ctrl-C and SIGTERM too.
from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

from . import consumers, memory, overhead, page, sinks, spool

Command = Callable[[list[str]], tuple[str | None, str | None]]
COMMANDS: dict[str, tuple[Command, str]] = {
    "consumers": (consumers.main, consumers.HEADING),
    "overhead": (overhead.main, overhead.HEADING),
    "sinks": (sinks.main, sinks.HEADING),
    "memory": (memory.main, memory.HEADING),
    "spool": (spool.main, spool.HEADING),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python -m bench.relay {{{','.join(COMMANDS)}}} [--quick] [--write PATH] "
            "[options]\n(each subcommand's --help lists its options)",
            file=sys.stderr,
        )
        return 2
    command, heading = COMMANDS[argv[0]]
    # Ctrl-C and SIGTERM unwind the run, stopping what it started, also in the background
    # (where SIGINT is inherited as ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        text, write = command(argv[1:])
    except KeyboardInterrupt:
        print("interrupted: every process started has been stopped", file=sys.stderr)
        return 130
    if text is None:  # interrupted inside bench.compare, which has said so
        return 130
    print(text)
    if write:
        page.write(Path(write), heading, text)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
