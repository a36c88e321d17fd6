"""A real carbon-cache (Debian's graphite-carbon) for the Graphite tests, in a temporary
directory of its own: its carbon.conf and storage-schemas.conf, its whisper files, its
line receiver on an ephemeral port of 127.0.0.1 (the pickle and UDP receivers off).

The port: carbon takes no port 0 for its receivers (0 turns one off), so a socket of
ours binds port 0 with SO_REUSEPORT and keeps it for carbon's lifetime. Carbon binds the
same port with SO_REUSEPORT too (its own sockets always set it) and listens on it; ours
never listens, so every connection goes to carbon, and no other program can take the port
meanwhile: no race between choosing a port and carbon binding it.

Carbon runs in the foreground with --debug, logging to its stdout; a thread reads the
lines, and the test waits on them (the receiver started, a metric's datapoints written)
instead of sleeping. Values are read back from the whisper files with whisper-fetch.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

CARBON = shutil.which("carbon-cache")
WAIT = 15.0  # carbon's writer wakes once a second: a metric is written within ~2 s

CONF = """\
[cache]
STORAGE_DIR = {dir}/storage/
LOCAL_DATA_DIR = {dir}/storage/whisper/
CONF_DIR = {dir}/
LOG_DIR = {dir}/log/
PID_DIR = {dir}/
DATABASE = whisper
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = {port}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_PORT = 0
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = 0
LOG_UPDATES = True
LOG_CREATES = True
WHISPER_AUTOFLUSH = True
"""
SCHEMAS = "[all]\npattern = .*\nretentions = 1s:10m\n"  # a point per second, 10 minutes


class CarbonCache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._reserved = socket.socket()
        self._reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._reserved.bind(("127.0.0.1", 0))
        self.port: int = self._reserved.getsockname()[1]
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> CarbonCache:
        assert CARBON is not None
        config = self.directory / "carbon.conf"
        config.write_text(CONF.format(dir=self.directory, port=self.port))
        (self.directory / "storage-schemas.conf").write_text(SCHEMAS)
        pidfile = self.directory / "carbon.pid"
        self.process = subprocess.Popen(
            [CARBON, f"--config={config}", f"--pidfile={pidfile}", "--debug", "start"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(f"CarbonReceiverFactory starting on {self.port}")
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, text: str, after: int = 0) -> int:
        """The number of the first line from `after` on that contains `text` (awaited)."""

        def found() -> int | None:
            return next((i for i in range(after, len(self.lines)) if text in self.lines[i]), None)

        with self._changed:
            assert self._changed.wait_for(lambda: found() is not None, WAIT), (
                f"carbon-cache never said {text!r}:\n" + "\n".join(self.lines[-30:])
            )
            number = found()
        assert number is not None
        return number

    def whisper_file(self, metric: str) -> Path:
        return self.directory / "storage" / "whisper" / (metric.replace(".", "/") + ".wsp")

    def values(self, metric: str) -> list[tuple[int, float]]:
        """The (time, value) points carbon wrote for `metric` in the last 5 minutes."""
        since = int(time.time()) - 300
        fetched = subprocess.run(
            ["whisper-fetch", "--json", f"--from={since}", str(self.whisper_file(metric))],
            capture_output=True,
            text=True,
            check=True,
        )
        # (Not --drop=nulls: whisper-fetch numbers the points left, shifting their times.)
        series = json.loads(fetched.stdout)
        start, step = series["start"], series["step"]
        return [
            (start + i * step, value)
            for i, value in enumerate(series["values"])
            if value is not None
        ]

    def written(self, metric: str, value: float) -> list[tuple[int, float]]:
        """Waits (on carbon's `wrote ... datapoints` lines) until the newest point carbon
        wrote for `metric` is `value`; the points."""
        after, deadline = 0, time.monotonic() + WAIT
        while True:
            after = self.wait_for(f"datapoints for {metric} in", after) + 1
            points = self.values(metric)
            if points and points[-1][1] == value:
                return points
            assert time.monotonic() < deadline, f"{metric}: {value} never written: {points}"

    def stop(self) -> int | None:
        """Carbon's exit status (SIGTERM, then SIGKILL if it does not go)."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(WAIT)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(WAIT)
        finally:
            self._reserved.close()
        return None if self.process is None else self.process.returncode
