"""The installed package, used as a user would (run by scripts/smoke.sh with the clean
venv's Python, from outside the checkout).

It checks that the modules come from site-packages, that the data files, the C recorder
and the entry points are there, that `nautilus-spark --help` runs, then starts the
installed `nautilus` with a TCP, a WebSocket and a TLS listener, HTTP and the event relay
(a plugin found through its entry point), and over each listener subscribes, publishes and
receives with paho-mqtt. Each check prints one line; the first failure stops it.

usage: smoke_installed.py WORKDIR   (WORKDIR holds server.pem and ca.pem)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import queue
import re
import ssl
import subprocess
import sys
import threading
import urllib.request
from importlib import resources
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

TIMEOUT = 20.0
LISTENING = re.compile(r"listening for MQTT on 127\.0\.0\.1:(\d+) \((\w+)\)")
HTTP = re.compile(r"HTTP on 127\.0\.0\.1:(\d+)")


def check(what: str, ok: bool, detail: str = "") -> None:
    if not ok:
        sys.exit(f"smoke: FAILED: {what}{': ' + detail if detail else ''}")
    print(f"smoke: ok: {what}")


def installed_files() -> None:
    venv = Path(sys.prefix).resolve()
    for name in ("broker", "hooks", "plugins", "event_relay", "spark_consumers", "broker.cluster"):
        origin = Path(importlib.import_module(name).__file__ or "").resolve()
        check(f"{name} imported from the venv", venv in origin.parents, str(origin))
    recorder = importlib.import_module("event_relay._recorder")
    check("the C recorder is importable", recorder.__file__ is not None)
    for package, data in (
        ("broker.http", "status.html"),
        ("plugins.redis_subs", "functions.lua"),
        ("event_relay.sidecar_pb", "on_publish_pb2.py"),
    ):
        check(
            f"{package}/{data} is in the wheel", resources.files(package).joinpath(data).is_file()
        )
    importlib.import_module("event_relay.sidecar_pb.on_publish_pb2")
    check("the protobuf modules load with the installed runtime", True)
    tables = {entry.name for entry in importlib.metadata.entry_points(group="nautilus.tables")}
    check("the plugin tables' entry points", tables == {"event_relay", "bridges"}, str(tables))
    spark = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "nautilus-spark"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    check("nautilus-spark --help", spark.returncode == 0, spark.stderr.strip()[-500:])


def write_config(workdir: Path) -> Path:
    pem = workdir / "server.pem"
    config = workdir / "smoke.toml"
    config.write_text(
        "[broker]\nallow_anonymous = true\n\n"
        '[store]\nbackend = "leveldb"\npath = "data"\n\n'
        '[http]\naddress = "127.0.0.1:0"\n\n'
        '[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:0"\n\n'
        '[[listeners]]\ntype = "ws"\naddress = "127.0.0.1:0"\n\n'
        f'[[listeners]]\ntype = "ssl"\naddress = "127.0.0.1:0"\ncertfile = "{pem}"\n'
        f'keyfile = "{pem}"\n\n'
        '[event_relay]\nenabled = true\naddress = "127.0.0.1:0"\n'
    )
    return config


class Broker:
    """The installed `nautilus`, its stderr read by a thread."""

    def __init__(self, config: Path) -> None:
        command = [str(Path(sys.prefix) / "bin" / "nautilus"), "--config", str(config)]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def ports(self, listeners: int) -> tuple[int, dict[str, int]]:
        """The HTTP port and each listener type's port, from the start-up lines."""
        http, mqtt_ports = 0, {}
        while not http or len(mqtt_ports) < listeners:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                sys.exit(f"smoke: FAILED: nautilus did not start: {''.join(self.seen)}")
            self.seen.append(line)
            if match := LISTENING.search(line):
                mqtt_ports[match[2]] = int(match[1])
            elif match := HTTP.search(line):
                http = int(match[1])
        return http, mqtt_ports

    def stop(self) -> None:
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        check("nautilus stops cleanly on SIGTERM", code == 0, f"exit code {code}")


def round_trip(kind: str, port: int, ca: Path) -> None:
    """Subscribe, publish QoS 1, receive it back, over one listener."""
    received: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed = threading.Event()
    transport = "websockets" if kind == "ws" else "tcp"
    client = mqtt.Client(CallbackAPIVersion.VERSION2, f"smoke-{kind}", transport=transport)
    if kind == "ssl":
        client.tls_set_context(ssl.create_default_context(cafile=str(ca)))
    client.on_message = lambda _client, _userdata, message: received.put(message)
    client.on_subscribe = lambda *_args: subscribed.set()
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(f"smoke/{kind}", qos=1)
        check(f"{kind}: SUBACK", subscribed.wait(TIMEOUT))
        client.publish(f"smoke/{kind}", f"over {kind}".encode(), qos=1)
        try:
            message = received.get(timeout=TIMEOUT)
        except queue.Empty:
            message = None
        got = message.payload if message else None
        check(f"{kind}: publish and receive", got == f"over {kind}".encode(), repr(got))
    finally:
        client.disconnect()
        client.loop_stop()


def main() -> None:
    workdir = Path(sys.argv[1])
    installed_files()
    broker = Broker(write_config(workdir))
    try:
        http_port, ports = broker.ports(listeners=3)
        relay = any("plugin event_relay enabled" in line for line in broker.seen)
        check("[event_relay] loads its plugin", relay, "".join(broker.seen))
        for kind in ("tcp", "ws", "ssl"):
            round_trip(kind, ports[kind], workdir / "ca.pem")
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=TIMEOUT) as r:
            page = r.read().decode()
        check("the status page is served from the wheel", "<html" in page.lower())
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
