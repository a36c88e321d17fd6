"""amqtt's asyncio MQTTClient as a peer of the interop tests (test_amqtt_interop.py).

amqtt pins websockets==15.0.1, so it lives in a venv of its own (.venv-amqtt) and this
file is run by that venv's interpreter, as a file, importing only amqtt and the standard
library (nothing from the project):

    .venv-amqtt/bin/python -I tests/broker/amqtt_peer.py URL STEPS [--timeout SECONDS]

STEPS is a JSON list of steps, run in order, each an object with "op" and "client" (a
name; `connect` makes a new MQTTClient under it):

    {"op": "connect", "client": "sub", "client_id": "...", "clean": true}
    {"op": "subscribe", "client": "sub", "topics": [["a/#", 1]]}
    {"op": "unsubscribe", "client": "sub", "topics": ["a/#"]}
    {"op": "publish", "client": "pub", "topic": "a/b", "payload": "<hex>", "qos": 1,
     "retain": false}
    {"op": "receive", "client": "sub"}
    {"op": "disconnect", "client": "sub"}

Everything it has to say goes to stdout as JSON lines, each with "event": first "ready"
(amqtt imported), then one line per step as it completes, with the step's "client":
"connected" (with the CONNACK's "rc"), "subscribed" (the SUBACK's "granted" codes),
"unsubscribed", "published" (once acknowledged, at QoS 1 and 2), "message" (what
`receive` got: "topic", "payload" in hex, "qos", "retain") and "disconnected"; at the end
"done" (exit status 0), or "error" with the failed "step" and "error" (exit status 1).
Every step has --timeout seconds. Anything else (amqtt's logging) goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

_REPORT = sys.stdout
sys.stdout = sys.stderr  # a stray print cannot garble the JSON lines


def report(event: str, **fields: Any) -> None:
    _REPORT.write(json.dumps({"event": event, **fields}) + "\n")
    _REPORT.flush()


try:
    from amqtt.client import MQTTClient
except ImportError as exc:  # a venv half made
    report("error", step=None, error=f"{sys.executable} cannot import amqtt: {exc}")
    raise SystemExit(1) from None

# No reconnecting, no plugins: a failure shows as it happens.
CLIENT_CONFIG = {"auto_reconnect": False, "keep_alive": 30, "plugins": {}}


async def run_step(clients: dict[str, Any], url: str, step: dict[str, Any]) -> dict[str, Any]:
    """Run one step; the fields of its event."""
    op, name = step["op"], step["client"]
    if op == "connect":
        client = MQTTClient(client_id=step.get("client_id"), config=dict(CLIENT_CONFIG))
        clients[name] = client
        rc = await client.connect(url, cleansession=step.get("clean", True))
        return {"event": "connected", "rc": rc}
    client = clients[name]
    if op == "subscribe":
        granted = await client.subscribe([(topic, qos) for topic, qos in step["topics"]])
        return {"event": "subscribed", "granted": list(granted)}
    if op == "unsubscribe":
        await client.unsubscribe(list(step["topics"]))
        return {"event": "unsubscribed"}
    if op == "publish":
        payload = bytes.fromhex(step["payload"])
        await client.publish(step["topic"], payload, qos=step["qos"], retain=step["retain"])
        return {"event": "published"}
    if op == "receive":
        msg = await client.deliver_message()
        return {
            "event": "message",
            "topic": msg.topic,
            "payload": bytes(msg.data).hex(),
            "qos": msg.qos,
            "retain": bool(msg.retain),
        }
    if op == "disconnect":
        await client.disconnect()
        del clients[name]
        return {"event": "disconnected"}
    raise ValueError(f"unknown op {op!r}")


async def run(url: str, steps: list[dict[str, Any]], timeout: float) -> int:
    clients: dict[str, Any] = {}
    for index, step in enumerate(steps):
        try:
            fields = await asyncio.wait_for(run_step(clients, url, step), timeout)
        except Exception as exc:
            what = f"nothing within {timeout:g} s" if isinstance(exc, TimeoutError) else exc
            report("error", step=index, error=f"{step['op']} failed: {type(exc).__name__}: {what}")
            return 1
        report(fields.pop("event"), step=index, client=step["client"], **fields)
    report("done")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="amqtt's MQTTClient, run step by step.")
    parser.add_argument("url", help="the broker, mqtt://HOST:PORT/")
    parser.add_argument("steps", help="a JSON list of steps")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per step")
    args = parser.parse_args()
    steps = json.loads(args.steps)
    report("ready")
    return asyncio.run(run(args.url, steps, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
