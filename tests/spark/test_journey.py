"""The design card's journey, run from examples/journey/ as a user copies it: a broker
with anonymous access off, auth_jwt, the ACL (devices write only `devices/%u/#`, `spark`
writes `$analytics/#`, `reader` reads it), the relay with a secret (once over TLS), the
LevelDB store; its scripts mint the tokens and publish known counts; `nautilus-spark
topic-traffic` logs in as `spark` with its token from a file; `reader` sees the exact
counts. Every part is the real one, each in a process of its own.

A wrong sink token and an ACL that refuses the sink, each ending the job with one line,
are tests/spark/test_sink_login.py's, on the same kind of broker."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.test_tls import pki
from tests.test_cli import BrokerProcess, clean_env

from .commands import nautilus_spark

__all__ = ["pki"]  # a fixture, used by name

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "journey"
RELAY_LISTENING = re.compile(r"event relay listening on 127\.0\.0\.1:(\d+)\b")
DEVICES, MESSAGES = 3, 7  # each device publishes MESSAGES messages


def run(folder: Path, script: str, *args: str) -> str:
    """One of the example's scripts, run from its folder as its README says; its stdout."""
    done = subprocess.run(
        [sys.executable, script, *args], cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def copied(tmp_path: Path, relay_tls: tuple[str, str] | None = None) -> Path:
    """The example as a user copies it, its addresses on free ports (and the relay's
    certificate, if given), its credentials minted by its own script."""
    folder = tmp_path / "journey"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns(*_generated()))
    config = folder / "nautilus.toml"
    text = re.sub(r'address = "127\.0\.0\.1:\d+"', 'address = "127.0.0.1:0"', config.read_text())
    if relay_tls is not None:
        certfile, keyfile = relay_tls
        header = re.search(r"^\[event_relay\].*\n", text, re.MULTILINE)
        assert header is not None
        keys = f'certfile = "{certfile}"\nkeyfile = "{keyfile}"\n'
        text = text[: header.end()] + keys + text[header.end() :]
    config.write_text(text)
    run(folder, "mint_tokens.py", "--devices", str(DEVICES))
    return folder


def _generated() -> list[str]:
    """What the example's .gitignore keeps out: never copied from a checkout that ran it."""
    lines = (EXAMPLE / ".gitignore").read_text().splitlines()
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def start(folder: Path) -> tuple[BrokerProcess, int]:
    """The broker as the README starts it (the relay's secret from the environment); its
    MQTT port and its relay's."""
    secret = (folder / "relay.secret").read_text()
    env = clean_env(NAUTILUS_EVENT_RELAY__SECRET=secret)
    broker = BrokerProcess(folder / "nautilus.toml", cwd=folder, env=env)
    said = [m for line in broker.lines if (m := RELAY_LISTENING.search(line))]
    relay = said[0] if said else broker.wait_for(RELAY_LISTENING)
    return broker, int(relay[1])


def analytics(folder: Path, port: int) -> dict[str, dict]:
    """What `reader` sees under $analytics/ (watch.py): topic -> the row."""
    lines = run(folder, "watch.py", "--broker", f"127.0.0.1:{port}", "--count", str(DEVICES))
    rows = [line.split(" ", 1) for line in lines.splitlines()]
    return {topic: json.loads(payload) for topic, payload in rows}


def journey(folder: Path, *relay_tls: str) -> None:
    broker, relay = start(folder)
    try:
        mqtt = f"127.0.0.1:{broker.port}"
        said = run(folder, "devices.py", "--broker", mqtt, "--messages", str(MESSAGES))
        assert said.strip() == f"{DEVICES} devices published {MESSAGES} messages each"
        done = nautilus_spark(
            "topic-traffic", "--relay", f"127.0.0.1:{relay}",
            "--relay-secret-file", str(folder / "relay.secret"), *relay_tls,
            "--sink", f"mqtt://spark@{mqtt}",
            "--sink-password-file", str(folder / "tokens" / "spark.jwt"),
            "--checkpoint", str(folder / "checkpoint"),
            "--trigger", "available-now", "--window", "1 day", "--master", "local[2]",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"wrote {DEVICES} rows to mqtt://spark@{mqtt}" in done.stderr.splitlines()[-1]
        got = analytics(folder, broker.port)
        assert {topic: row["messages"] for topic, row in got.items()} == {
            f"$analytics/topic_traffic/devices/device-{n}/telemetry": MESSAGES
            for n in range(1, DEVICES + 1)
        }
        assert not [line for line in broker.lines if " WARNING " in line or " ERROR " in line]
    finally:
        broker.kill()


def test_the_example_config_checks_clean(tmp_path):
    folder = copied(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "broker", "check-config", "nautilus.toml"],
        cwd=folder,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "nautilus.toml: ok, no warnings"
    assert "  CONNECT    auth_jwt; refused unless one says Ok" in done.stdout


def test_the_journey_with_authentication_on_everywhere(tmp_path):
    journey(copied(tmp_path))


def test_the_journey_with_the_relay_over_tls(tmp_path, pki):
    folder = copied(tmp_path, (pki.server.certfile, pki.server.keyfile))
    journey(folder, "--relay-cafile", pki.cafile)
