"""A node whose Redis is missing or does not answer when it starts: one line, and an exit.

A Redis that took the connection and never answered (paused, or a hung host) used to hold
the start for ever, silently, and SIGTERM did not end it; one that refused the
connection ended the start with a traceback. Here a real redis-server is paused
(SIGSTOP) or stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from testing.redis_server import RedisServer
from tests.cluster.nodes import ClusterNode
from tests.test_cli import clean_env

START_LIMIT = 30.0  # seconds a node may take to give up (connect_timeout is 2 s)
ANSWER_TIMEOUT = "connect_timeout = 30\n"  # long enough for a signal to come first


def start_node(directory: Path, redis_url: str, redis_keys: str = "") -> subprocess.Popen[str]:
    node = ClusterNode(directory, "a", redis_url, redis_keys=redis_keys)
    node.prepare()
    return subprocess.Popen(
        [sys.executable, "-m", "broker", "--config", str(node.config_path)],
        env=clean_env(),
        stderr=subprocess.PIPE,
        text=True,
    )


def last_line(process: subprocess.Popen[str]) -> str:
    """The last line the node wrote, once it has ended (killed if it has not by
    START_LIMIT: a start that hangs fails the test and leaves no process behind)."""
    try:
        _, stderr = process.communicate(timeout=START_LIMIT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def test_a_redis_that_does_not_answer_ends_the_start_in_one_line(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        process = start_node(tmp_path, own_redis.url)
        line = last_line(process)
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert process.returncode == 1
    assert line.startswith("nautilus: the cluster's metadata cannot be reached: ")
    assert line.endswith("no answer within 2 s (plugins.redis_subs.connect_timeout)")


def test_a_redis_that_refuses_ends_the_start_in_one_line(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    url = own_redis.url
    own_redis.kill()  # its port: nothing listens there now
    process = start_node(tmp_path, url)
    line = last_line(process)
    assert process.returncode == 1
    assert line.startswith("nautilus: the cluster's metadata cannot be reached: ")
    assert "Connection refused" in line


def test_sigterm_ends_a_start_that_waits_for_redis(own_redis: RedisServer, tmp_path: Path) -> None:
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        keys = f'url = "{own_redis.url}"\n{ANSWER_TIMEOUT}'
        process = start_node(tmp_path, own_redis.url, redis_keys=keys)
        assert process.stderr is not None
        give_up = threading.Timer(START_LIMIT, process.kill)  # should the line never come
        give_up.start()
        for line in process.stderr:  # the start is under way: it waits for Redis now
            if "cluster metadata: Redis at" in line:
                break
        give_up.cancel()
        process.send_signal(signal.SIGTERM)
        line = last_line(process)
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert process.returncode == 0
    assert line.endswith("shutting down before the start completed")
