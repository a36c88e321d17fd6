# Starting and stopping the brokers under test, one at a time.
#
# Strategy: each broker runs as a child process on a free loopback port, with a config
# file generated into a temporary directory and its output captured in a log file there.
# Readiness is a TCP connect polled with a deadline. Every child is stopped in `finally`,
# so an exception or Ctrl-C never leaves a broker behind.
from __future__ import annotations

import importlib
import importlib.metadata
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from .scenarios import Target

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
_READY_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0

NAUTILUS_TOML = """\
[broker]
allow_anonymous = true
max_inflight_messages = 100
max_online_messages = 100000
[[listeners]]
type = "tcp"
address = "{host}:{port}"
[store]
backend = "memory"
"""

# Mosquitto with the same limits as Nautilus. TCP_NODELAY is on because asyncio (and so
# Nautilus and amqtt) sets it on every socket; Mosquitto's default would add Nagle delays.
MOSQUITTO_CONF = """\
listener {port} {host}
allow_anonymous true
persistence false
max_inflight_messages 100
max_queued_messages 100000
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
"""


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    name: str
    label: str
    # (working directory, port) -> argv; may write a config file into the directory.
    command: Callable[[Path, int], list[str]]
    version: Callable[[], str]
    # Scenario topologies the broker cannot serve, with why (not measured, reported).
    unsupported: Mapping[str, str] = field(default_factory=dict)


def _nautilus(workdir: Path, port: int) -> list[str]:
    config = workdir / "nautilus.toml"
    config.write_text(NAUTILUS_TOML.format(host=HOST, port=port))
    return [sys.executable, "-m", "broker", "--config", str(config)]


def _mosquitto(workdir: Path, port: int) -> list[str]:
    config = workdir / "mosquitto.conf"
    config.write_text(MOSQUITTO_CONF.format(host=HOST, port=port))
    return [mosquitto_path(), "-c", str(config)]


def _amqtt(workdir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "bench.amqtt_server", "--host", HOST, "--port", str(port)]


def _null(workdir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "bench.nullbroker", "--host", HOST, "--port", str(port)]


def mosquitto_path() -> str:
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _mosquitto_version() -> str:
    out = subprocess.run([mosquitto_path(), "-h"], capture_output=True, text=True).stdout
    words = out.split()
    return words[2] if words[:2] == ["mosquitto", "version"] else "unknown"


def _nautilus_version() -> str:
    version = getattr(importlib.import_module("broker"), "__version__", "unknown")
    git = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return f"{version} ({git.stdout.strip()})" if git.returncode == 0 else version


BROKERS = {
    "nautilus": BrokerSpec("nautilus", "Nautilus", _nautilus, _nautilus_version),
    "mosquitto": BrokerSpec("mosquitto", "Mosquitto", _mosquitto, _mosquitto_version),
    "amqtt": BrokerSpec(
        "amqtt",
        "amqtt",
        _amqtt,
        lambda: importlib.metadata.version("amqtt"),
        unsupported={"shared": "no shared subscriptions"},
    ),
    # A byte pipe, not a broker: calibrates the load generator (see bench/nullbroker.py).
    "null": BrokerSpec("null", "null broker", _null, lambda: "-"),
}


def raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one (the idle scenario needs ~10k)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class RunningBroker:
    """A broker child process, for the duration of a `with` block."""

    def __init__(self, spec: BrokerSpec):
        self.spec = spec
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-{spec.name}-")
        self._workdir = Path(self._tmp.name)
        self._log = self._workdir / "broker.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.target: Target | None = None

    def __enter__(self) -> RunningBroker:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self._stop()

    def exit_code(self) -> int | None:
        """The broker's exit code if it has died, else None."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def _start(self) -> None:
        port = free_port()
        argv = self.spec.command(self._workdir, port)
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=raise_fd_limit
            )
        self._wait_ready(port)
        self.target = Target(HOST, port, self._proc.pid)

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"{self.spec.label} exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            try:
                socket.create_connection((HOST, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)  # poll interval, bounded by the deadline
        raise BrokerError(f"{self.spec.label} not listening after {_READY_TIMEOUT:.0f} s")

    def _stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._tmp.cleanup()
