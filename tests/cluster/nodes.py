"""Cluster nodes as real `python -m broker` processes on loopback, for the cluster tests.

`ClusterNode(directory, name, redis_url)` writes the node's config (the issue's template:
[cluster] node_name / address / metadata = "redis", [plugins.redis_subs]), with its own
LevelDB store, MQTT on an ephemeral port, the cluster listener on an ephemeral port (or a
fixed one: a node restarted under its name keeps its port), HTTP on an ephemeral port,
and short liveness settings so that failures show within a test's time.

A node may run elsewhere than on loopback: `host` is the address it binds (MQTT, HTTP,
the cluster listener) and `prefix` the command its process runs through (a network
namespace's `ip netns exec NAME`: testing/netns.py).

`start()` returns once the node listens for MQTT; `wait_for_log(pattern)` waits for a
line in its log; `status()` reads `/status.json`; `cluster_status()` asks the admin API
through `nautilus cluster status --json` with a key the node was given at start.
"""

from __future__ import annotations

import functools
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.frames import CHALLENGE, WELCOME, Connecting, FrameDecoder
from broker.cluster.node import DRAIN_LIMIT, Cluster
from broker.http.api_keys import ApiKeys
from tests.test_cli import BrokerProcess, clean_env

LIVENESS_INTERVAL = 0.2
DEAD_AFTER = 1.5
LOOPBACK = "127.0.0.1"
CLUSTER_LINE = re.compile(r"cluster node (\S+) listening on [\d.]+:(\d+)")
HTTP_LINE = re.compile(r"HTTP on [\d.]+:(\d+)")
COMPLETE_LINE = re.compile(r"every group holds the cluster's whole metadata")
API_KEY = "cluster-tests-key"
# [cluster.swc] for the tests: exchanges and GC within a test's time.
SWC_TIMES = "[cluster.swc]\nsync_interval = 0.3\ngc_interval = 1.0\n"


def start_in_process_node(
    start_broker: Any,
    redis_url: str,
    dead_after: float = 1.0,
    name: str = "a",
    sections: dict[str, Any] | None = None,
    **cluster: Any,
) -> Any:
    """Node `name` in this test process (the `start_broker` fixture), on ephemeral ports,
    with the Redis store at `redis_url`; `cluster` adds or overrides [cluster] keys,
    `sections` adds other config sections (e.g. `http`)."""
    return start_broker(
        **(sections or {}),
        broker={"node_name": name},
        cluster={
            "address": "127.0.0.1:0",
            "metadata": "redis",
            "liveness_interval": LIVENESS_INTERVAL,
            "dead_after": dead_after,
            **cluster,
        },
        plugins={"redis_subs": {"enabled": True, "url": redis_url}},
    )


def cluster_of(server: Any) -> Cluster:
    """The Cluster of an in-process node (its Broker's `peers`)."""
    peers = server.broker.peers
    assert isinstance(peers, Cluster), peers
    return peers


Frames = list[list[Any]]


def read_frames(
    sock: socket.socket, timeout: float, until: Callable[[Frames], bool] | None = None
) -> tuple[Frames, bool]:
    """The cluster frames a node sends on `sock`, and whether it closed the connection,
    within `timeout` (or as soon as `until(frames)` holds)."""
    decoder = FrameDecoder(1 << 20)
    got: Frames = []
    deadline = time.monotonic() + timeout
    while until is None or not until(got):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got, True
        except TimeoutError:
            return got, False
        if not chunk:
            return got, True
        got += decoder.feed(chunk)
    return got, False


def handshake(
    sock: socket.socket, node: str, target: str, secret: str = "", timeout: float = 10.0
) -> tuple[Frames, bool]:
    """The handshake of a link, said by node `node` on `sock` (a connection to the cluster
    listener of node `target`), proving `secret`: HELLO, then the PROOF that answers the
    CHALLENGE. The frames answered (WELCOME first when the proof is right; else those
    up to the close: a REFUSED) and whether the node closed the connection."""
    said = Connecting(secret, node, f"{node}-boot", target)
    sock.sendall(said.hello())
    got, closed = read_frames(sock, timeout, functools.partial(first_is, CHALLENGE))
    if closed or not got or got[0][0] != CHALLENGE:
        return got, closed
    sock.sendall(said.proof(got[0]))
    return read_frames(sock, timeout, functools.partial(first_is, WELCOME))


def first_is(kind: int, got: Frames) -> bool:
    return bool(got) and got[0][0] == kind


class ClusterNode:
    def __init__(
        self,
        directory: Path,
        name: str,
        redis_url: str,
        *,
        cluster_port: int = 0,
        cluster_host: str = "",
        peer_addresses: dict[str, tuple[str, int]] | None = None,
        extra: str = "",
        broker_keys: str = "",
        liveness_interval: float = LIVENESS_INTERVAL,
        dead_after: float = DEAD_AFTER,
        redis_keys: str = "",
        metadata: str = "redis",
        seeds: list[tuple[str, int]] | None = None,
        host: str = LOOPBACK,
        prefix: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.name = name
        self.redis_url = redis_url
        self.cluster_port = cluster_port
        # The cluster listener's (0.0.0.0: every address); "": the node's host.
        self.cluster_host = cluster_host or host
        self.peer_addresses = dict(peer_addresses or {})
        self.extra = extra  # lines of [cluster]
        self.broker_keys = broker_keys  # lines of [broker]
        self.liveness_interval = liveness_interval
        self.dead_after = dead_after
        # [plugins.redis_subs] keys instead of `url = redis_url` (e.g. Sentinel's).
        self.redis_keys = redis_keys or f'url = "{redis_url}"'
        # "swc": the leaderless metadata, joined through `seeds` (no Redis at all).
        self.metadata = metadata
        self.seeds = list(seeds or [])
        self.host = host
        self.prefix = list(prefix)
        self.process: BrokerProcess | None = None
        self.port = 0  # MQTT
        self.http_port = 0
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def config_path(self) -> Path:
        return self.directory / f"{self.name}.toml"

    @property
    def store_path(self) -> Path:
        return self.directory / f"store-{self.name}"

    def write_config(self) -> Path:
        peers = "".join(
            f'{node} = "{host}:{port}"\n' for node, (host, port) in self.peer_addresses.items()
        )
        self.config_path.write_text(
            f"[broker]\nallow_anonymous = true\n{self.broker_keys}\n\n"
            f'[[listeners]]\ntype = "tcp"\naddress = "{self.host}:0"\n\n'
            f'[store]\nbackend = "leveldb"\npath = "{self.store_path}"\n\n'
            f'[http]\naddress = "{self.host}:0"\napi_keys_file = "{self.directory}/api-keys"\n\n'
            "[cluster]\n"
            f'node_name = "{self.name}"\n'
            f'address = "{self.cluster_host}:{self.cluster_port}"\n'
            f'metadata = "{self.metadata}"\n'
            f"seeds = {json.dumps([f'{host}:{port}' for host, port in self.seeds])}\n"
            f"liveness_interval = {self.liveness_interval}\n"
            f"dead_after = {self.dead_after}\n"
            f"{self.extra}\n"
            + (f"[cluster.peer_addresses]\n{peers}\n" if peers else "")
            + (
                f"[plugins.redis_subs]\nenabled = true\n{self.redis_keys}\n"
                if self.metadata == "redis"
                else SWC_TIMES
            ),
            encoding="utf-8",
        )
        return self.config_path

    def prepare(self) -> None:
        """Its config and API key file (what start() needs before it launches the node)."""
        self.write_config()
        if not (self.directory / "api-keys").exists():
            self._add_api_key()

    def start(self, complete: bool = True) -> ClusterNode:
        """`complete` (swc): also wait until the node holds the cluster's metadata."""
        self.prepare()
        self.http_port = 0  # a restart binds another one
        # clean_env() binds HTTP to loopback, over the config: here, the node's host.
        env = clean_env(NAUTILUS_HTTP__ADDRESS=f"{self.host}:0")
        self.process = BrokerProcess(self.config_path, self.directory, env, self.prefix)
        self.port = self.process.port
        for line in self.process.lines:
            if match := CLUSTER_LINE.search(line):
                self.cluster_port = int(match[2])
            if match := HTTP_LINE.search(line):
                self.http_port = int(match[1])
        if not self.http_port:
            self.http_port = int(self.process.wait_for(HTTP_LINE)[1])
        if self.metadata == "swc" and complete:  # every client id served: copied first
            self.wait_for_log(COMPLETE_LINE)
        return self

    def _add_api_key(self) -> None:
        """API_KEY into the node's keys file (what `nautilus api-key add` does, here in
        the test's process: a Python process of its own per node cost half a second)."""
        ApiKeys(str(self.directory / "api-keys")).add(API_KEY)

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        assert self.process is not None
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        for line in self.process.lines:  # already seen
            if match := compiled.search(line):
                return match
        return self.process.wait_for(compiled, timeout)

    @property
    def url(self) -> str:
        """The node's HTTP server (status, metrics, admin API)."""
        return f"http://{self.host}:{self.http_port}"

    def status(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/status.json") as r:
            return json.load(r)

    def metrics(self) -> dict[str, float]:
        """/metrics as {name: value}, labels dropped."""
        with urllib.request.urlopen(f"{self.url}/metrics") as r:
            text = r.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name.partition("{")[0]] = float(value)
        return values

    def cluster_status(self) -> dict[str, Any]:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "broker",
                "cluster",
                "status",
                "--url",
                self.url,
                "--key",
                API_KEY,
                "--json",
            ],
            cwd=self.directory,
            env=clean_env(),
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(result.stdout)["table"][0]

    def stop(self) -> int:
        """SIGTERM, and the exit status. A stopping node waits for its peers to take the
        frames it sent them (up to DRAIN_LIMIT, while a slow subscriber there drains):
        it may take longer than the harness's TIMEOUT for one event."""
        assert self.process is not None
        proc = self.process.proc
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(DRAIN_LIMIT + 5.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node {self.name} still running after SIGTERM: {self.process.lines}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
