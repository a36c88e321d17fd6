"""The real `nautilus` command, run as a subprocess (`python -m broker`).

Each broker listens on 127.0.0.1 port 0; the test learns the port from the
"listening for MQTT on 127.0.0.1:PORT" line on standard error. A thread drains stderr
into a queue, so every wait is on a line (or a process exit) with a timeout, never a sleep.
Every process started is killed in the fixture's teardown if the test left it running.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker import __version__

TIMEOUT = 5.0  # the longest any single expected event may take
LISTENING = re.compile(r"listening for MQTT on [\d.]+:(\d+)\b")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without NAUTILUS_* overrides, plus `extra`. HTTP binds a
    free port (the default, 8888, would collide between brokers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NAUTILUS_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["NAUTILUS_HTTP__ADDRESS"] = "127.0.0.1:0"
    env.update(extra)
    return env


def nautilus(*args: str, cwd: Path, env: dict[str, str] | None = None):
    """Run the command to completion (for invocations that must exit by themselves)."""
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=15,
    )


def write_config(path: Path, *, store: str = 'backend = "memory"', port: int = 0) -> Path:
    path.write_text(
        "[broker]\nallow_anonymous = true\n\n"
        f'[[listeners]]\ntype = "tcp"\naddress = "127.0.0.1:{port}"\n\n'
        f"[store]\n{store}\n",
        encoding="utf-8",
    )
    return path


# --------------------------------------------------------------------------- processes


class BrokerProcess:
    """A running `python -m broker --config FILE`, its stderr read line by line; `prefix`
    runs it through another command (e.g. `ip netns exec NAME`)."""

    def __init__(
        self, config: Path, cwd: Path, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> None:
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "broker", "--config", str(config)],
            cwd=cwd,
            env=env or clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.port = int(self.wait_for(LISTENING)[1])
        except BaseException:  # no caller holds it yet to clean it up
            self.kill()
            raise

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)  # end of stream: the process has closed stderr

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(remaining, 0))
            except queue.Empty:
                message = f"no line matching {pattern.pattern!r}: {self.lines}"
                raise AssertionError(message) from None
            if line is None:
                raise AssertionError(f"stderr closed before {pattern.pattern!r}: {self.lines}")
            self.lines.append(line)
            if match := pattern.search(line):
                return match

    def drain(self, timeout: float = TIMEOUT) -> list[str]:
        """Every line up to the end of stderr (the process exiting), then all lines read."""
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(deadline - time.monotonic(), 0))) is not None:
            self.lines.append(line)
        self._queue.put(None)  # still the end, for a later call
        return self.lines

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` and return the exit status (fails if it takes over TIMEOUT)."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"broker still running {TIMEOUT}s after signal {signum}: {self.lines}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(TIMEOUT)
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def start_process(tmp_path) -> Iterator:
    started: list[BrokerProcess] = []

    def start(config: Path) -> BrokerProcess:
        proc = BrokerProcess(config, cwd=tmp_path)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


# --------------------------------------------------------------------------- clients


class Client:
    """A blocking paho-mqtt (MQTT 3.1.1) client: each step waits for its acknowledgement."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        clean_session: bool = True,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self._connacks: queue.Queue[tuple[bool, bool]] = queue.Queue()
        self._subacks: queue.Queue[tuple[int, list]] = queue.Queue()
        self.disconnected = threading.Event()
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=mqtt.MQTTv311,
            reconnect_on_failure=False,  # a broker that goes away stays gone
        )
        self.paho.on_connect = self._on_connect
        self.paho.on_subscribe = lambda c, u, mid, codes, p: self._subacks.put((mid, codes))
        self.paho.on_message = lambda c, u, message: self.messages.put(message)
        self.paho.on_disconnect = lambda *args: self.disconnected.set()
        if credentials is not None:
            self.paho.username_pw_set(*credentials)
        self.paho.connect("127.0.0.1", port, keepalive=30)
        self.paho.loop_start()
        ok, self.session_present = self._connacks.get(timeout=TIMEOUT)
        assert ok, "CONNACK refused the connection"

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connacks.put((not reason_code.is_failure, flags.session_present))

    def subscribe(self, topic: str, qos: int) -> None:
        _, mid = self.paho.subscribe(topic, qos)
        got_mid, codes = self._subacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        assert [c.value for c in codes] == [qos]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.paho.publish(topic, payload, qos, retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def expect_message(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def close(self) -> None:
        """DISCONNECT (sent before this returns) and stop the network thread."""
        self.paho.disconnect()
        self.disconnected.wait(TIMEOUT)
        self.paho.loop_stop()


@pytest.fixture
def clients() -> Iterator:
    made: list[Client] = []

    def connect(port: int, client_id: str = "", clean_session: bool = True, **kw) -> Client:
        client = Client(port, client_id, clean_session, **kw)
        made.append(client)
        return client

    try:
        yield connect
    finally:
        for client in made:
            with contextlib.suppress(Exception):
                client.paho.disconnect()
            client.paho.loop_stop()


# --------------------------------------------------------------------------- one-shot runs


def test_version(tmp_path):
    result = nautilus("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"nautilus {__version__}\n"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[broker]\nmax_inflight_messages = "many"\n', "broker.max_inflight_messages"),
        ('[broker]\nqueue_type = "stack"\n', "broker.queue_type"),
        ("[broker]\nallow_anonymus = true\n", "broker.allow_anonymus"),
        ('[broker]\nconnect_timeout = "soon"\n', "broker.connect_timeout"),
        ("[broker]\nmax_online_messages = -7\n", "broker.max_online_messages"),
        ('[[listeners]]\naddress = "127.0.0.1"\n', "listeners[0].address"),
        ("[broker\nallow_anonymous = true\n", "invalid TOML"),
    ],
)
def test_bad_config_one_line_exit_2(tmp_path, text, key):
    config = tmp_path / "bad.toml"
    config.write_text(text, encoding="utf-8")
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nautilus: ")
    assert key in lines[0]


def test_bad_config_line_is_the_documented_one(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[broker]\nmax_inflight_messages = "many"\n', encoding="utf-8")
    result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.stderr == (
        "nautilus: broker.max_inflight_messages: expected an integer, got 'many'\n"
    )


def test_bad_env_override_one_line_exit_2(tmp_path):
    config = write_config(tmp_path / "nautilus.toml")
    env = clean_env(NAUTILUS_BROKER__QUEUE_TYPE="stack")
    result = nautilus("--config", str(config), cwd=tmp_path, env=env)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nautilus: ")
    assert "broker.queue_type" in lines[0]


def test_missing_config_file_one_line_exit_2(tmp_path):
    missing = tmp_path / "missing.toml"
    result = nautilus("--config", str(missing), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"nautilus: config file not found: {missing}\n"


def test_port_in_use_one_line_nonzero(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "nautilus.toml", port=port)
        result = nautilus("--config", str(config), cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nautilus: ")
    assert "address already in use" in lines[0].lower()
    assert str(port) in lines[0]


# --------------------------------------------------------------------------- a running broker


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serves_and_stops_cleanly_on_signal(tmp_path, start_process, clients, signum):
    proc = start_process(write_config(tmp_path / "nautilus.toml"))
    sub = clients(proc.port)
    sub.subscribe("cli/#", 1)
    pub = clients(proc.port)
    pub.publish("cli/x", b"round trip", qos=1)
    message = sub.expect_message()
    assert (message.topic, message.payload, message.qos) == ("cli/x", b"round trip", 1)
    pub.close()
    # `sub` stays connected: shutdown must not wait for its clients to leave.
    assert proc.stop(signum) == 0
    assert sub.disconnected.wait(TIMEOUT)
    assert not any("Traceback" in line for line in proc.lines)


def test_leveldb_state_survives_a_process_restart(tmp_path, start_process, clients):
    config = write_config(
        tmp_path / "nautilus.toml", store=f'backend = "leveldb"\npath = "{tmp_path / "db" / "x"}"'
    )
    sub_id = f"persistent-{uuid.uuid4().hex[:8]}"

    first = start_process(config)
    sub = clients(first.port, sub_id, clean_session=False)
    assert not sub.session_present
    sub.subscribe("offline/q", 1)
    sub.close()
    pub = clients(first.port)
    pub.publish("kept/r", b"retained payload", qos=1, retain=True)
    pub.publish("offline/q", b"queued while offline", qos=1)
    pub.close()
    assert first.stop() == 0
    assert (tmp_path / "db" / "x").is_dir()  # the store's directory is created if missing

    second = start_process(config)
    late = clients(second.port)
    late.subscribe("kept/#", 1)
    retained = late.expect_message()
    assert (retained.topic, retained.payload, retained.retain) == (
        "kept/r",
        b"retained payload",
        True,
    )
    back = clients(second.port, sub_id, clean_session=False)
    assert back.session_present
    queued = back.expect_message()  # no new SUBSCRIBE: the subscription was restored too
    assert (queued.topic, queued.payload, queued.qos) == ("offline/q", b"queued while offline", 1)
    assert second.stop() == 0


def test_all_four_plugins_enabled_from_the_config_file(tmp_path, start_process, clients):
    # The "done when": [plugins.passwd], [plugins.acl], [plugins.auth_jwt] and
    # [plugins.webhooks], each with enabled = true and its keys, enable each plugin.
    import jwt  # PyJWT, a dependency of the auth_jwt plugin

    from plugins.passwd.hashes import make_hash

    (tmp_path / "passwd").write_text(f"bob:{make_hash(b'hunter2')}\n")
    (tmp_path / "acl").write_text("topic demo/#\n")
    config = tmp_path / "nautilus.toml"
    config.write_text(
        f"""\
[broker]
allow_anonymous = false
[[listeners]]
address = "127.0.0.1:0"
[store]
backend = "memory"
[plugins.passwd]
enabled = true
password_file = "{tmp_path / "passwd"}"
[plugins.auth_jwt]
enabled = true
secret = "s3cret-s3cret-s3cret-s3cret-s3cret"
[plugins.acl]
enabled = true
acl_file = "{tmp_path / "acl"}"
[plugins.webhooks]
enabled = true
[[plugins.webhooks.endpoints]]
hook = "on_client_gone"
url = "http://127.0.0.1:9/gone"
""",
        encoding="utf-8",
    )
    proc = start_process(config)
    enabled = {line.split("plugin ")[1].split()[0] for line in proc.lines if " enabled" in line}
    assert enabled == {"passwd", "auth_jwt", "acl", "webhooks"}
    token = jwt.encode({"rid": "alice"}, "s3cret-s3cret-s3cret-s3cret-s3cret", "HS256")
    alice = clients(proc.port, credentials=("alice", token))  # auth_jwt lets her in
    bob = clients(proc.port, credentials=("bob", "hunter2"))  # passwd lets him in
    alice.subscribe("demo/t", 1)  # the ACL allows demo/#
    bob.publish("demo/t", b"four plugins", qos=1)
    assert alice.expect_message().payload == b"four plugins"
    with pytest.raises(AssertionError, match="refused"):
        clients(proc.port, credentials=("bob", "wrong"))
    assert proc.stop() == 0
