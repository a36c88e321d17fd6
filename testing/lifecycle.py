"""The life cycle every real server here shares: start on a free port of 127.0.0.1 and
wait until it answers, stop cleanly or kill, pause and resume, restart on the same port.

A server's output goes to `<NAME>.log` in its directory; a start or a stop that fails
raises ServerError quoting the log's tail. A port picked free may be taken before the
server binds it: start() then tries another, up to PORT_ATTEMPTS times. Once the server
has served, its port is kept, so stop() and start() again find it where it was.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Self

HOST = "127.0.0.1"
STOP_TIMEOUT = 10.0
POLL = 0.02  # a server in another process gives no event to await: its state is polled
PORT_ATTEMPTS = 5


class Missing(Exception):
    """A server's binary is not installed; the message names the package to install."""


class ServerError(Exception):
    """A server did not start or did not stop as it should; the message quotes its log."""


def free_port() -> int:
    """A port nothing listens on now (bound to 0 and released)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One server process in `directory`, on `port` (None: a free one, kept once it has
    served).

    A subclass names its binaries (`_find_binaries`, Missing when one is not installed),
    its command line (`_command`) and when it answers (`_answers`). It may prepare its
    directory before each start (`_prepare`), run in another directory or environment
    (`_workdir`, `_environment`), own more processes than the one started (`_processes`)
    and free what a SIGKILLed server leaves behind (`_after_kill`).

    `child_setup` runs in the child before the server's binary (subprocess's
    preexec_fn; not safe in a process with threads: for the benchmarks).
    """

    NAME: ClassVar[str]  # the log's name and the errors'
    STOP_SIGNAL: ClassVar[signal.Signals] = signal.SIGTERM  # a clean shutdown
    START_TIMEOUT: ClassVar[float] = 10.0  # until it answers
    NEW_SESSION: ClassVar[bool] = False  # True: out of the caller's group (its Ctrl-C)

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        child_setup: Callable[[], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.log_path = self.directory / f"{self.NAME}.log"
        self._port = port
        self.child_setup = child_setup
        self.proc: subprocess.Popen[bytes] | None = None
        self._live = False  # processes of the server's may exist
        self._paused = False

    # ------------------------------------------------------------------ to override

    def _find_binaries(self) -> None:
        """Finds the binaries the server needs; Missing if one is not installed."""
        raise NotImplementedError

    def _command(self, port: int) -> list[str]:
        """The command line that runs the server on `port` (its config file written
        first, if it has one)."""
        raise NotImplementedError

    def _answers(self, port: int) -> bool:
        """Whether the server, started on `port`, accepts clients now."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Before each start, once the directory exists."""

    def _workdir(self) -> Path:
        return self.directory

    def _environment(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def _processes(self) -> set[int]:
        """The server's live processes: the one started, while it runs."""
        assert self.proc is not None
        return {self.proc.pid} if self.proc.poll() is None else set()

    def _after_kill(self) -> None:
        """Frees what a SIGKILLed server leaves behind."""

    # ------------------------------------------------------------------ life cycle

    def start(self) -> Self:
        """Starts the server and returns once it answers (on the same port as before if
        it has run already)."""
        self._find_binaries()
        assert not self.running, f"{self.NAME} is already running"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._prepare()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = self._port if self._port is not None else free_port()
            if self._launch(port):
                self._port = port
                return self
            if self._port is not None or attempt == PORT_ATTEMPTS:
                break
        raise ServerError(f"{self.NAME} did not start; {self.log_path}:\n{self.log_tail()}")

    def _launch(self, port: int) -> bool:
        """Runs the server on `port`; True once it answers, False if it exited first."""
        self.proc = self._spawn(port)
        self._live, self._paused = True, False
        if self._wait_until_ready(port, time.monotonic() + self.START_TIMEOUT):
            return True
        exited = self.proc.poll() is not None
        self.kill()
        if exited:
            return False  # e.g. the port was taken meanwhile: see the log
        raise ServerError(
            f"{self.NAME} did not answer within {self.START_TIMEOUT}s; "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        command = self._command(port)
        with self.log_path.open("ab") as log:
            log.write(f"--- starting on port {port}\n".encode())
            log.flush()
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._workdir(),
                env=self._environment(),
                start_new_session=self.NEW_SESSION,
                preexec_fn=self.child_setup,
            )

    def _wait_until_ready(self, port: int, deadline: float) -> bool:
        """True once the server answers; False if it exits or the deadline passes."""
        assert self.proc is not None
        while self.proc.poll() is None and time.monotonic() < deadline:
            if self._answers(port):
                return True
            time.sleep(POLL)
        return False

    def stop(self) -> None:
        """A clean shutdown (STOP_SIGNAL), which also ends the clients' connections;
        waits for the exit (SIGKILL, then ServerError, if it takes over STOP_TIMEOUT)."""
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            self.kill()  # it died on its own: its children may not have
            return
        self.proc.send_signal(self.STOP_SIGNAL)
        if self._paused:
            self.resume()  # a stopped process handles the signal only once continued
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServerError(
                f"{self.NAME} ignored {self.STOP_SIGNAL.name}:\n{self.log_tail()}"
            ) from None
        self._live = bool(self._processes())
        self._paused = False

    def kill(self) -> None:
        """SIGKILL to every process of the server's (a paused one too), and waits until
        none is left. What was written stays, as after a crash of the server."""
        if self.proc is None or not self._live:
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        # Again until none is left: a child forked just before its parent died shows up
        # on the next look.
        while (left := self._processes()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if self.proc.pid in left:
                self.proc.wait(STOP_TIMEOUT)  # our child's end is awaited
            else:
                time.sleep(POLL)  # its descendants' are not ours to await
        self.proc.wait(STOP_TIMEOUT)
        self._live = self._paused = False
        self._after_kill()
        if left:
            raise ServerError(f"{self.NAME}: processes {sorted(left)} survived SIGKILL")

    def close(self) -> None:
        """stop() if running, kill() in any case: nothing of the server's is left."""
        try:
            with contextlib.suppress(ServerError):
                self.stop()
        finally:
            self.kill()

    def restart(self) -> Self:
        """stop() then start() on the same port."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP to every process: connections are accepted by the kernel but nothing
        answers."""
        self._signal_all(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal_all(signal.SIGCONT)
        self._paused = False

    def _signal_all(self, signum: int) -> None:
        assert self.running, f"{self.NAME} is not running"
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ access

    @property
    def port(self) -> int:
        assert self._port is not None, "start() first"
        return self._port

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])
