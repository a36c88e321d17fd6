"""Devices publishing telemetry: device-1 .. device-N log in with their JWT
(tokens/device-N.jwt) and each publishes `--messages` QoS 1 messages to
devices/<name>/telemetry, waiting for every PUBACK.

    python devices.py [--devices 3] [--messages 10] [--interval 0.1] [--broker 127.0.0.1:1883]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

HERE = Path(__file__).resolve().parent


def connect(name: str, host: str, port: int) -> mqtt.Client:
    """A logged-in MQTT 5 client; a refusal says why and stops the script."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    client.username_pw_set(name, (HERE / "tokens" / f"{name}.jwt").read_text().strip())
    answered = threading.Event()
    refusals: list[ReasonCode] = []

    def on_connect(_c, _u, _flags, reason: ReasonCode, _p) -> None:
        if reason.is_failure:
            refusals.append(reason)
        answered.set()

    client.on_connect = on_connect
    client.connect(host, port)
    client.loop_start()
    if not answered.wait(10) or refusals:
        sys.exit(f"{name}: not connected: {refusals[0] if refusals else 'no CONNACK in 10 s'}")
    return client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--messages", type=int, default=10, help="per device")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between rounds")
    parser.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.broker.rpartition(":")
    names = [f"device-{n}" for n in range(1, args.devices + 1)]
    clients = {name: connect(name, host, int(port)) for name in names}
    refused: list[ReasonCode] = []

    def on_publish(_c, _u, _mid, reason: ReasonCode, _p: Properties) -> None:
        if reason.is_failure:
            refused.append(reason)

    for client in clients.values():
        client.on_publish = on_publish
    for n in range(args.messages):
        for name, client in clients.items():
            payload = json.dumps({"n": n, "temperature": 20 + n % 5})
            client.publish(f"devices/{name}/telemetry", payload, qos=1).wait_for_publish(10)
        time.sleep(args.interval)
    for client in clients.values():
        client.disconnect()
        client.loop_stop()
    if refused:
        sys.exit(f"{len(refused)} publishes refused: {refused[0]}")
    print(f"{len(names)} devices published {args.messages} messages each")


if __name__ == "__main__":
    main()
