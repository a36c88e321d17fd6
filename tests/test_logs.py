"""`[log]`: text or JSON lines to the console, a file rotated by size, and syslog (a real
UDP socket stands in for the syslog daemon); through the real command too."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import ConfigError, LogSettings
from broker.logs import configure
from tests.test_cli import BrokerProcess, write_config


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[None]:
    """configure() replaces the root logger's handlers: put the test runner's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_json_lines_to_a_file(tmp_path):
    path = tmp_path / "broker.log"
    configure(LogSettings(format="json", console=False, file=str(path)))
    logging.getLogger("nautilus.connection").info("client %s refused", "dev-1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("nautilus").exception("internal error")
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert {k: first[k] for k in ("level", "logger", "message")} == {
        "level": "info",
        "logger": "nautilus.connection",
        "message": "client dev-1 refused",
    }
    assert second["level"] == "error" and "RuntimeError: boom" in second["exception"]


def test_the_file_is_rotated_by_size_and_backups_are_bounded(tmp_path):
    path = tmp_path / "broker.log"
    configure(LogSettings(console=False, file=str(path), file_max_bytes=200, file_backups=2))
    log = logging.getLogger("nautilus")
    for i in range(40):
        log.warning("line %02d %s", i, "x" * 40)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["broker.log", "broker.log.1", "broker.log.2"]
    assert all(p.stat().st_size <= 200 for p in tmp_path.iterdir())
    assert "line 39" in path.read_text()  # the newest is in the file itself


def test_level_filters(tmp_path):
    path = tmp_path / "broker.log"
    configure(LogSettings(level="warning", console=False, file=str(path)))
    logging.getLogger("nautilus").info("not this")
    logging.getLogger("nautilus").warning("this")
    assert path.read_text().splitlines()[0].endswith("WARNING nautilus: this")


def test_syslog_over_udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as daemon:
        daemon.bind(("127.0.0.1", 0))
        daemon.settimeout(5)
        port = daemon.getsockname()[1]
        configure(LogSettings(console=False, syslog=f"127.0.0.1:{port}"))
        logging.getLogger("nautilus").error("store cannot write")
        datagram = daemon.recv(4096).decode()
    # <priority>: facility user (1) * 8 + error (3) = 11.
    assert datagram.startswith("<11>") and "store cannot write" in datagram


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (LogSettings(file="/nonexistent/dir/broker.log"), "log.file: cannot write"),
        (LogSettings(syslog="localhost"), "log.syslog: expected a socket path"),
        (LogSettings(syslog="/nonexistent/log-socket"), "log.syslog: cannot use"),
    ],
    ids=["file", "syslog-address", "syslog-socket"],
)
def test_an_unusable_destination_names_the_key(settings, message):
    with pytest.raises(ConfigError, match="^" + message):
        configure(settings)


def test_the_command_logs_json_to_its_file(tmp_path: Path):
    config = write_config(tmp_path / "nautilus.toml")
    path = tmp_path / "broker.log"
    with config.open("a") as out:
        out.write(f'\n[log]\nformat = "json"\nfile = "{path}"\n')
    broker = BrokerProcess(config, cwd=tmp_path)  # waits for the listening line on stderr
    try:
        assert broker.stop() == 0
    finally:
        broker.kill()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    messages = [entry["message"] for entry in entries]
    assert any(m.startswith("listening for MQTT on 127.0.0.1:") for m in messages)
    assert "shutting down" in messages
    # The console had the same records, as JSON too.
    assert json.loads(broker.lines[-1])["message"].startswith("listening for MQTT")
