"""A dashboard: logs in as `reader` (tokens/reader.jwt) and prints the live analytics the
Spark job publishes under $analytics/, as they change.

    python watch.py [--count N] [--broker 127.0.0.1:1883]
"""

from __future__ import annotations

import argparse
import queue
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, help="stop after this many messages")
    parser.add_argument("--topic", default="$analytics/#")
    parser.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.broker.rpartition(":")
    received: queue.Queue[mqtt.MQTTMessage | str] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="reader", protocol=mqtt.MQTTv5)
    client.username_pw_set("reader", (HERE / "tokens" / "reader.jwt").read_text().strip())

    def on_connect(client: mqtt.Client, _u, _flags, reason, _p) -> None:
        if reason.is_failure:
            received.put(f"not connected: {reason}")
        else:
            client.subscribe(args.topic, qos=1)

    def on_subscribe(_c, _u, _mid, reasons, _p) -> None:
        if reasons[0].is_failure:
            received.put(f"subscription to {args.topic} refused: {reasons[0]}")

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = lambda _c, _u, message: received.put(message)
    client.connect(host, int(port))
    client.loop_start()
    shown = 0
    while args.count is None or shown < args.count:
        message = received.get()
        if isinstance(message, str):
            sys.exit(message)
        print(message.topic, message.payload.decode(), flush=True)
        shown += 1
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    main()
