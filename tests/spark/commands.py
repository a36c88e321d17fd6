"""`nautilus-spark` as a user runs it: a subprocess, and the one line a failed run ends
with."""

from __future__ import annotations

import os
import subprocess
import sys


def nautilus_spark(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`nautilus-spark ARGS...` to its end (its environment is this one's, PYTHONPATH
    included, and `env`)."""
    return subprocess.run(
        [sys.executable, "-m", "spark_consumers.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def failure_line(done: subprocess.CompletedProcess) -> str:
    """The one line a failed run says why in; nothing else of the failure on stderr (the
    lines before it are Spark's start-up notices)."""
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "\tat " not in done.stderr and " ERROR " not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("nautilus-spark:")] == lines[-1:]
    return lines[-1]
