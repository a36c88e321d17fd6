"""A real `redis-server` process for the cluster tests, on 127.0.0.1.

No config file and no persistence (`--save ""`, `--appendonly no`): a restart starts
empty. The server logs to `redis.log` in its directory; a start that fails quotes its
tail. Without `redis-server` on PATH, `start()` skips the test (pytest.skip).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"
START_TIMEOUT = 10.0  # until the first PING answers
STOP_TIMEOUT = 10.0
POLL = 0.02
PORT_ATTEMPTS = 5  # a port picked free may be taken before redis-server binds it


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    """A port nothing listens on now (bound to 0 and released)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One `redis-server` on `port` (None: a free one, kept for the server's lifetime)."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.log_path = self.directory / "redis.log"
        self._port = port
        self._chosen = port is not None  # a port of the caller's, or one that has served
        self.proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    # ------------------------------------------------------------------ life cycle

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING (on the same port as before
        if it has run already)."""
        executable = redis_server_path()
        if executable is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = self._port if self._chosen and self._port is not None else free_port()
            if self._launch(executable, port):
                self._port, self._chosen = port, True
                return self
            if self._chosen or attempt == PORT_ATTEMPTS:
                break
        raise AssertionError(f"redis-server did not start; {self.log_path}:\n{self.log_tail()}")

    def _launch(self, executable: str, port: int) -> bool:
        """Run the server on `port`; True once it answers, False if it exited first."""
        with self.log_path.open("ab") as log:
            log.write(f"--- starting on port {port}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [
                    *(executable, "--port", str(port), "--bind", HOST),
                    *("--save", "", "--appendonly", "no"),  # nothing persisted
                    *("--dir", str(self.directory), "--protected-mode", "no"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        self._paused = False
        client = redis.Redis(
            HOST, port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False  # e.g. the port was taken meanwhile: see the log
                with contextlib.suppress(redis.RedisError):
                    # Another server on this port would answer too: check it is ours.
                    if int(client.info("server")["process_id"]) == self.proc.pid:
                        return True
                time.sleep(POLL)
        finally:
            client.close()
        self.kill()
        raise AssertionError(
            f"redis-server gave no PING answer within {START_TIMEOUT}s; "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM, and wait for the exit (SIGKILL if it takes over STOP_TIMEOUT)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        if self._paused:
            self.resume()  # a stopped process handles SIGTERM only once continued
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"redis-server ignored SIGTERM:\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL (works on a paused server too), and wait for the exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(STOP_TIMEOUT)
        self._paused = False

    close = kill

    def restart(self) -> RedisServer:
        """stop() then start() on the same port; the data is gone (nothing persisted)."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but nothing answers."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def _signal(self, signum: int) -> None:
        assert self.proc is not None and self.proc.poll() is None, "redis-server not running"
        os.kill(self.proc.pid, signum)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    # ------------------------------------------------------------------ access

    @property
    def port(self) -> int:
        assert self._port is not None, "start() first"
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous client; kwargs go to redis.Redis (e.g. socket_timeout)."""
        return redis.Redis(HOST, self.port, **kwargs)

    def flush(self) -> None:
        """FLUSHALL and FUNCTION FLUSH: no keys, no loaded functions."""
        with self.client() as client:
            client.flushall()
            client.function_flush()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])
