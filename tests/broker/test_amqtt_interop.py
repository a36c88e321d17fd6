"""Interoperability with amqtt's asyncio client (MQTT 3.1.1).

amqtt pins websockets==15.0.1 and Nautilus is tested with the newest websockets, so
amqtt is not installed here: it has a venv of its own, .venv-amqtt (`make
.venv-amqtt/.installed`), whose interpreter (NAUTILUS_AMQTT_PYTHON, by default
.venv-amqtt/bin/python) runs amqtt_peer.py beside this file in a subprocess. A test gives
the peer its steps (connect, subscribe, publish, receive, ...) and reads what happened
from its JSON lines on stdout, each with a timeout; when paho in this process has to act
in between, it waits for the peer's line saying the peer got there (e.g. "subscribed").
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import pytest

from .helpers import TIMEOUT, V5, unique_id

REPO = Path(__file__).resolve().parents[2]
PEER = Path(__file__).resolve().with_name("amqtt_peer.py")
AMQTT_PYTHON = "NAUTILUS_AMQTT_PYTHON"
# Starting the interpreter and importing amqtt, on a busy machine: longer than a step.
STARTUP = 30.0
# A step's own timeout in the peer is TIMEOUT; the peer reports it before this runs out.
LINE = TIMEOUT + 5.0


def amqtt_python() -> str:
    """The interpreter of amqtt's venv; the test fails when it is not there."""
    python = os.environ.get(AMQTT_PYTHON) or str(REPO / ".venv-amqtt" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.fail(
            f"amqtt's venv is missing: run `make .venv-amqtt/.installed` (no {python})",
            pytrace=False,
        )
    return python


def url(server) -> str:
    return f"mqtt://{server.host}:{server.port}/"


# --------------------------------------------------------------------------- steps


def connect(client: str, client_id: str | None = None, clean: bool = True) -> dict[str, Any]:
    return {
        "op": "connect",
        "client": client,
        "client_id": client_id or unique_id("amqtt"),
        "clean": clean,
    }


def subscribe(client: str, *topics: tuple[str, int]) -> dict[str, Any]:
    return {"op": "subscribe", "client": client, "topics": [list(t) for t in topics]}


def unsubscribe(client: str, *topics: str) -> dict[str, Any]:
    return {"op": "unsubscribe", "client": client, "topics": list(topics)}


def publish(
    client: str, topic: str, payload: bytes, qos: int, retain: bool = False
) -> dict[str, Any]:
    return {
        "op": "publish",
        "client": client,
        "topic": topic,
        "payload": payload.hex(),
        "qos": qos,
        "retain": retain,
    }


def receive(client: str) -> dict[str, Any]:
    return {"op": "receive", "client": client}


def disconnect(client: str) -> dict[str, Any]:
    return {"op": "disconnect", "client": client}


# --------------------------------------------------------------------------- the peer


@dataclass(frozen=True)
class Message:
    """A message amqtt received."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


class AmqttPeer:
    """amqtt_peer.py running `steps` against a broker, in amqtt's interpreter."""

    def __init__(self, python: str, server, steps: list[dict[str, Any]]) -> None:
        self.steps = steps
        self.events: list[dict[str, Any]] = []  # every line read so far, in order
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str | None] = []  # amqtt's logging, for the failure message
        # -I: nothing from the project or the environment's PYTHONPATH can be imported.
        argv = [python, "-I", str(PEER), url(server), json.dumps(steps), f"--timeout={TIMEOUT}"]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self._lines.put)),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._stderr.append)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()
        self.expect("ready", timeout=STARTUP)

    @staticmethod
    def _read(stream: IO[str], sink: Callable[[str | None], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)  # end of output

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self._fail(f"nothing from the peer within {timeout:g} s")
        if line is None:
            self._fail(f"the peer ended (exit status {self.proc.wait(TIMEOUT)})")
        try:
            event = json.loads(line)
        except ValueError:
            self._fail(f"not a JSON line: {line!r}")
        self.events.append(event)
        if event["event"] == "error":
            failed = event.get("step")
            step = self.steps[failed] if failed is not None else None
            self._fail(f"{event['error']} (step {failed}: {step})")
        return event

    def _fail(self, what: str) -> NoReturn:
        if self.proc.poll() is not None:  # all it wrote is on its way
            self._readers[1].join(TIMEOUT)
        tail = "".join(line for line in self._stderr if line)[-3000:]
        pytest.fail(f"amqtt peer: {what}\nevents so far: {self.events}\nstderr:\n{tail}")

    def expect(self, event: str, timeout: float = LINE) -> dict[str, Any]:
        """The next line, which must be `event`."""
        got = self._next(timeout)
        assert got["event"] == event, f"expected {event!r}, got {got}"
        return got

    def finish(self) -> list[dict[str, Any]]:
        """Every step's event, once the peer has run them all and exited with status 0."""
        while self.events[-1]["event"] != "done":
            self._next(LINE)
        assert self.proc.wait(TIMEOUT) == 0
        steps = self.events[1:-1]  # between "ready" and "done"
        assert [e["step"] for e in steps] == list(range(len(self.steps))), steps
        return steps

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(TIMEOUT)
        for reader in self._readers:
            reader.join(TIMEOUT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def amqtt() -> Iterator[Any]:
    """amqtt(server, *steps) -> a running AmqttPeer (killed after the test)."""
    started: list[AmqttPeer] = []

    def start(server, *steps: dict[str, Any]) -> AmqttPeer:
        # Looked up here, in the test's own call: a missing venv fails the test (not its
        # set-up, which pytest would report as an error).
        peer = AmqttPeer(amqtt_python(), server, list(steps))
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


def the(events: list[dict[str, Any]], event: str, client: str) -> dict[str, Any]:
    """The one `event` of `client`."""
    found = [e for e in events if e["event"] == event and e["client"] == client]
    assert len(found) == 1, (event, client, events)
    return found[0]


def messages(events: list[dict[str, Any]], client: str) -> list[Message]:
    """What `client` received, in order."""
    return [
        Message(e["topic"], bytes.fromhex(e["payload"]), e["qos"], e["retain"])
        for e in events
        if e["event"] == "message" and e["client"] == client
    ]


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_amqtt_publish_and_receive(broker, amqtt, qos):
    events = amqtt(
        broker,
        connect("sub"),
        connect("pub"),
        subscribe("sub", ("amqtt/#", qos)),
        publish("pub", "amqtt/t", b"hello", qos),
        receive("sub"),
        disconnect("pub"),
        disconnect("sub"),
    ).finish()
    assert the(events, "connected", "sub")["rc"] == 0
    assert the(events, "subscribed", "sub")["granted"] == [qos]
    [msg] = messages(events, "sub")
    assert (msg.topic, msg.payload, msg.qos) == ("amqtt/t", b"hello", qos)


def test_amqtt_to_paho_and_back(broker, paho_client, amqtt):
    paho = paho_client(broker, V5)
    paho.subscribe("x/to-paho", 2)
    peer = amqtt(
        broker,
        connect("c"),
        subscribe("c", ("x/to-amqtt", 2)),
        publish("c", "x/to-paho", b"from amqtt", 2),
        receive("c"),
        disconnect("c"),
    )
    peer.expect("connected")
    peer.expect("subscribed")
    # amqtt is subscribed (SUBACK received): what paho publishes now reaches it.
    paho.publish("x/to-amqtt", b"from paho", 1)
    [msg] = messages(peer.finish(), "c")
    assert (msg.topic, msg.payload, msg.qos) == ("x/to-amqtt", b"from paho", 1)
    msg = paho.expect_message()
    assert (msg.payload, msg.qos) == (b"from amqtt", 2)


def test_amqtt_retained_message(broker, amqtt):
    events = amqtt(
        broker,
        connect("pub"),
        publish("pub", "amqtt/ret", b"kept", 1, retain=True),
        disconnect("pub"),
        connect("sub"),
        subscribe("sub", ("amqtt/ret", 1)),
        receive("sub"),
        disconnect("sub"),
    ).finish()
    [msg] = messages(events, "sub")
    assert (msg.payload, msg.retain) == (b"kept", True)


def test_amqtt_persistent_session(broker, amqtt):
    client_id = unique_id("amqtt-persist")
    events = amqtt(
        broker,
        connect("sub", client_id, clean=False),
        subscribe("sub", ("amqtt/offline", 1)),
        disconnect("sub"),
        connect("pub"),
        publish("pub", "amqtt/offline", b"while away", 1),
        disconnect("pub"),
        connect("again", client_id, clean=False),
        receive("again"),
        disconnect("again"),
    ).finish()
    [msg] = messages(events, "again")
    assert msg.payload == b"while away"


def test_amqtt_unsubscribe(broker, amqtt):
    events = amqtt(
        broker,
        connect("c"),
        subscribe("c", ("amqtt/u", 1), ("amqtt/end", 1)),
        unsubscribe("c", "amqtt/u"),
        publish("c", "amqtt/u", b"unwanted", 1),
        publish("c", "amqtt/end", b"end", 1),
        receive("c"),
        disconnect("c"),
    ).finish()
    [msg] = messages(events, "c")
    assert msg.topic == "amqtt/end"
