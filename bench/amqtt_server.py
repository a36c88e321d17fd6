# amqtt as the benchmark runs it: `NAUTILUS_AMQTT_PYTHON bench/amqtt_server.py --port N`.
#
# amqtt pins websockets==15.0.1, so it is not installed beside Nautilus: it has a venv of
# its own, .venv-amqtt (`make .venv-amqtt/.installed`, from requirements/amqtt.txt), and
# bench/brokers.py runs this file, by its path, with that venv's interpreter. So it
# imports amqtt, uvloop and the standard library only, nothing from the project.
#
# The same broker as the `amqtt` command, minus what a benchmark should not pay for:
# logging at WARNING instead of INFO and only the anonymous-auth plugin (no packet logger,
# no $SYS publisher). It runs on uvloop (in amqtt's venv too), like Nautilus, so the
# comparison is between brokers and not between event loops.
from __future__ import annotations

import argparse
import asyncio
import logging

from amqtt.broker import Broker


def _config(host: str, port: int) -> dict:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {
            "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
        },
    }


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main() -> None:
    parser = argparse.ArgumentParser(description="amqtt, configured for the benchmarks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    broker = Broker(_config(args.host, args.port), loop=loop)
    loop.run_until_complete(broker.start())
    loop.run_forever()


if __name__ == "__main__":
    main()
