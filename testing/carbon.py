"""A real carbon-cache (Debian's graphite-carbon) for the Graphite tests, in a directory
of its own: its carbon.conf and storage-schemas.conf, its whisper files, its line receiver
on an ephemeral port of 127.0.0.1 (the pickle and UDP receivers off).

The port: carbon takes no port 0 for its receivers (0 turns one off), so a socket of
ours binds port 0 with SO_REUSEPORT and keeps it until close(). Carbon binds the same
port with SO_REUSEPORT too (its own sockets always set it) and listens on it; ours never
listens, so every connection goes to carbon, and no other program can take the port
meanwhile: no race between choosing a port and carbon binding it.

Carbon runs in the foreground with --debug, logging to its stdout; a thread reads the
lines (and copies them to carbon-cache.log), and start() and the test wait on them (the
receiver started, a metric's datapoints written) instead of sleeping. Values are read
back from the whisper files with whisper-fetch.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from testing.lifecycle import HOST, Missing, ServerProcess

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
LINE_RECEIVER_INTERFACE = {host}
LINE_RECEIVER_PORT = {port}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_PORT = 0
CACHE_QUERY_INTERFACE = {host}
CACHE_QUERY_PORT = 0
LOG_UPDATES = True
LOG_CREATES = True
WHISPER_AUTOFLUSH = True
"""
SCHEMAS = "[all]\npattern = .*\nretentions = 1s:10m\n"  # a point per second, 10 minutes


class CarbonCache(ServerProcess):
    NAME = "carbon-cache"
    START_TIMEOUT = WAIT

    def __init__(self, directory: Path) -> None:
        self._reserved = socket.socket()
        self._reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._reserved.bind((HOST, 0))
        super().__init__(directory, port=self._reserved.getsockname()[1])
        self.lines: list[str] = []  # carbon's output
        self._ended = False  # its output has ended: it exited
        self._changed = threading.Condition()

    def _find_binaries(self) -> None:
        carbon, fetch = shutil.which("carbon-cache"), shutil.which("whisper-fetch")
        if carbon is None or fetch is None:
            raise Missing("graphite-carbon is not installed (apt-get install graphite-carbon)")
        self.executable, self.whisper_fetch = carbon, fetch

    def _command(self, port: int) -> list[str]:
        config = self.directory / "carbon.conf"
        config.write_text(CONF.format(dir=self.directory, host=HOST, port=port))
        (self.directory / "storage-schemas.conf").write_text(SCHEMAS)
        pidfile = self.directory / "carbon.pid"
        return [self.executable, f"--config={config}", f"--pidfile={pidfile}", "--debug", "start"]

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        """Carbon's output goes to a pipe, which a thread reads into `lines`."""
        proc = subprocess.Popen(
            self._command(port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self._workdir(),
        )
        self._ended = False
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """Each line of carbon's into `lines`, and into its log."""
        assert proc.stdout is not None
        with proc.stdout, self.log_path.open("ab", buffering=0) as log:
            for line in proc.stdout:
                log.write(line)
                with self._changed:
                    self.lines.append(line.decode(errors="replace").rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def _wait_until_ready(self, port: int, deadline: float) -> bool:
        """Awaits carbon's line saying its receiver listens (or the end of its output)."""
        said = f"CarbonReceiverFactory starting on {port}"
        with self._changed:
            self._changed.wait_for(
                lambda: self._ended or self._find(said, 0) is not None,
                deadline - time.monotonic(),
            )
            return self._find(said, 0) is not None

    def _find(self, text: str, after: int) -> int | None:
        return next((i for i in range(after, len(self.lines)) if text in self.lines[i]), None)

    def close(self) -> None:
        """Carbon stopped (see ServerProcess.close), and its port given up."""
        try:
            super().close()
        finally:
            self._reserved.close()

    def wait_for(self, text: str, after: int = 0) -> int:
        """The number of the first line from `after` on that contains `text` (awaited)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self._find(text, after) is not None, WAIT), (
                f"carbon-cache never said {text!r}:\n" + "\n".join(self.lines[-30:])
            )
            number = self._find(text, after)
        assert number is not None
        return number

    def whisper_file(self, metric: str) -> Path:
        return self.directory / "storage" / "whisper" / (metric.replace(".", "/") + ".wsp")

    def values(self, metric: str) -> list[tuple[int, float]]:
        """The (time, value) points carbon wrote for `metric` in the last 5 minutes."""
        since = int(time.time()) - 300
        fetched = subprocess.run(
            [self.whisper_fetch, "--json", f"--from={since}", str(self.whisper_file(metric))],
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
