"""A real Mosquitto for the bridge tests: 127.0.0.1, an ephemeral port kept across
restarts, a config and a password file in the test's directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

HOST = "127.0.0.1"
START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Mosquitto:
    def __init__(
        self,
        directory: Path,
        users: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,  # (certificate chain, key): a TLS listener
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.users = users
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Mosquitto:
        executable = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(executable).exists():
            pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "mosquitto.conf"
        lines = [f"listener {self.port} {HOST}", "persistence false"]
        if self.tls is not None:
            lines += [f"certfile {self.tls[0]}", f"keyfile {self.tls[1]}"]
        if os.geteuid() == 0:  # it would become user mosquitto, who cannot read tmp_path
            lines.append("user root")
        if self.users is None:
            lines.append("allow_anonymous true")
        else:
            passwords = self.directory / "passwords"
            passwords.write_text("".join(f"{u}:{p}\n" for u, p in self.users.items()))
            subprocess.run(
                ["mosquitto_passwd", "-U", str(passwords)], check=True, capture_output=True
            )
            passwords.chmod(0o600)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        config.write_text("\n".join(lines) + "\n")
        log = (self.directory / "mosquitto.log").open("ab")
        self.proc = subprocess.Popen([executable, "-c", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # a port that answers: no event to wait on across processes
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                return self
            except OSError:
                assert self.proc.poll() is None, self.log_tail()
                assert time.monotonic() < deadline, "mosquitto did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def log_tail(self) -> str:
        path = self.directory / "mosquitto.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
