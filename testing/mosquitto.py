"""A real Mosquitto (the bridge tests' remote broker) on 127.0.0.1: its config and its
password file in its directory, anonymous clients let in unless `users` are given."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from testing.lifecycle import HOST, Missing, ServerProcess


class Mosquitto(ServerProcess):
    NAME = "mosquitto"

    def __init__(
        self,
        directory: Path,
        users: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,  # (certificate chain, key): a TLS listener
    ) -> None:
        super().__init__(directory)
        self.users = users
        self.tls = tls

    def _find_binaries(self) -> None:
        executable = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        passwd = shutil.which("mosquitto_passwd")
        if not Path(executable).exists() or passwd is None:
            raise Missing("mosquitto is not installed (apt-get install mosquitto)")
        self.executable, self.passwd = executable, passwd

    def _prepare(self) -> None:
        if self.users is not None:
            passwords = self.directory / "passwords"
            passwords.write_text("".join(f"{u}:{p}\n" for u, p in self.users.items()))
            subprocess.run([self.passwd, "-U", str(passwords)], check=True, capture_output=True)
            passwords.chmod(0o600)

    def _command(self, port: int) -> list[str]:
        lines = [f"listener {port} {HOST}", "persistence false"]
        if self.tls is not None:
            lines += [f"certfile {self.tls[0]}", f"keyfile {self.tls[1]}"]
        if os.geteuid() == 0:  # it would become user mosquitto, who cannot read tmp_path
            lines.append("user root")
        if self.users is None:
            lines.append("allow_anonymous true")
        else:
            lines += ["allow_anonymous false", f"password_file {self.directory / 'passwords'}"]
        config = self.directory / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return [self.executable, "-c", str(config)]

    def _answers(self, port: int) -> bool:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
        except OSError:
            return False
        return True
