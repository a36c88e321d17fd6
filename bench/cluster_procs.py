# The processes of the clustering benchmark (bench/cluster.py): a private redis-server
# and Nautilus nodes, started and stopped by it.
#
# Strategy: one redis-server for the whole run (testing/redis_server.py: temporary
# directory, ephemeral port, nothing persisted), emptied (FLUSHALL, FUNCTION FLUSH)
# before every deployment; a deployment is a fresh set of `python -m broker` processes,
# one plain node or a cluster of named nodes (a, b, c), each with its config and its log
# (stdout and stderr) in a temporary directory of its own. MQTT and the cluster listener
# bind port 0; a node is ready once its log says where it listens for MQTT and, in a
# cluster, that its link to every other node is up. Every process is stopped in `finally`
# (SIGTERM, then SIGKILL), and on Linux also dies with this process (PR_SET_PDEATHSIG),
# so neither an exception, Ctrl-C nor a killed benchmark leaves one behind.
from __future__ import annotations

import contextlib
import ctypes
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from testing.redis_server import RedisServer

from .brokers import HOST, MODES, REPO, child_env, free_port, nautilus_toml, raise_fd_limit
from .scenarios import cpu_seconds

READY_TIMEOUT = 30.0  # a node listening and linked (a loaded machine starts slowly)
STOP_TIMEOUT = 5.0
POLL = 0.02
MQTT_LINE = re.compile(r"listening for MQTT on 127\.0\.0\.1:(\d+)")
LINK_LINE = re.compile(r"cluster link to (\S+) \(\S+\) up")
# swc: the node holds the whole metadata (a joining node has copied every group).
COMPLETE_LINE = re.compile(r"every group holds the cluster's whole metadata")
NAMES = ("a", "b", "c")
_PR_SET_PDEATHSIG = 1


class ProcessError(RuntimeError):
    pass


def _child_setup() -> None:
    """In the child before exec: the open-files limit raised, and SIGTERM when we die."""
    raise_fd_limit()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def private_redis() -> Iterator[RedisServer]:
    """The run's redis-server (testing/redis_server.py, as the tests' one) in a temporary
    directory; it also dies with this process."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-redis-") as directory,
        RedisServer(Path(directory), child_setup=_child_setup) as server,
    ):
        yield server


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """What a deployment's nodes run with (the same for each node)."""

    mode: str = "bounded"  # bench/brokers.py MODES: the queue limits
    store: str = "memory"  # or "leveldb" (sync = false), in the node's directory
    broker: str = ""  # extra [broker] lines
    metadata: str = "redis"  # "swc": the leaderless metadata, no Redis (seeds: node A)
    swc_sync: bool = False  # [cluster.swc] sync: an fsync per commit
    cluster: str = ""  # extra [cluster] lines (swc)


class Node:
    """One `python -m broker` process; `name` empty: a plain node, not clustered."""

    def __init__(
        self,
        name: str,
        config: NodeConfig,
        redis_url: str | None,
        cluster_port: int = 0,
        seeds: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.cluster_port = cluster_port  # fixed for swc: the others' seed
        self.seeds = list(seeds)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-cluster-{name or 'plain'}-")
        self.directory = Path(self._tmp.name)
        self.log = self.directory / "broker.log"
        self.port = 0  # MQTT, once ready
        self.links: set[str] = set()  # nodes its links are up to
        # Serving every client id (swc: each group copied; no copy to wait for else).
        self.complete = config.metadata != "swc" or not name
        self.proc: subprocess.Popen[bytes] | None = None
        self._seen = 0  # log bytes already scanned
        path = self.directory / "nautilus.toml"
        path.write_text(self._toml(config, redis_url))
        self.config_path = path

    def _toml(self, config: NodeConfig, redis_url: str | None) -> str:
        store = 'backend = "memory"'
        if config.store == "leveldb":
            store = f'backend = "leveldb"\npath = "{self.directory / "store"}"\nsync = false'
        text = nautilus_toml(MODES[config.mode], store).format(host=HOST, port=0)
        if config.broker:
            text = text.replace("[broker]\n", f"[broker]\n{config.broker.rstrip()}\n", 1)
        text += "[http]\nenabled = false\n"
        if self.name and config.metadata == "swc":
            seeds = ", ".join(f'"{HOST}:{port}"' for port in self.seeds)
            text += (
                f'[cluster]\nnode_name = "{self.name}"\naddress = "{HOST}:{self.cluster_port}"\n'
                f'metadata = "swc"\nseeds = [{seeds}]\n{config.cluster}'
                f'[cluster.swc]\ndirectory = "{self.directory / "swc"}"\n'
                f"sync = {'true' if config.swc_sync else 'false'}\n"
            )
        elif self.name:
            assert redis_url is not None
            text += (
                f'[cluster]\nnode_name = "{self.name}"\naddress = "{HOST}:0"\n'
                f'metadata = "redis"\n[plugins.redis_subs]\nenabled = true\nurl = "{redis_url}"\n'
            )
        return text

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def label(self) -> str:
        return self.name.upper() if self.name else "plain"

    def start(self) -> None:
        """Start the process (again, after a stop: its log goes on, the port is read anew)."""
        self.port = 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "--config", str(self.config_path)],
                cwd=REPO,
                env=child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup,
            )

    def scan(self) -> None:
        """Read the log written since the last scan: the MQTT port, links that came up."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessError(
                f"node {self.label} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )
        with self.log.open("rb") as log:
            log.seek(self._seen)
            data = log.read()
        end = data.rfind(b"\n") + 1  # whole lines only
        self._seen += end
        text = data[:end].decode(errors="replace")
        if not self.port and (match := MQTT_LINE.search(text)):
            self.port = int(match[1])
        self.links.update(LINK_LINE.findall(text))
        if COMPLETE_LINE.search(text):
            self.complete = True

    def cpu(self) -> float | None:
        return cpu_seconds(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def errors(self) -> list[str]:
        """Log lines at WARNING or above (the text format names the level)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if re.search(r"\b(WARNING|ERROR)\b", line)]

    def close(self) -> None:
        _stop(self.proc)
        self._tmp.cleanup()


class Deployment:
    """`nodes` clustered nodes (named from `names`) sharing `redis`, or one plain node
    (`nodes` 0), for the duration of a `with` block; ready when every node listens and is
    linked to every other. The Redis server is emptied first."""

    def __init__(
        self,
        nodes: int,
        config: NodeConfig,
        redis_server: RedisServer | None,
        names: Sequence[str] = NAMES,
    ) -> None:
        swc = config.metadata == "swc"
        if nodes and redis_server is None and not swc:
            raise ValueError("a cluster needs a Redis server")
        self.redis = None if swc else redis_server  # swc: no Redis in the figures
        url = None if redis_server is None else redis_server.url
        names = tuple(names[:nodes]) if nodes else ("",)
        ports = [free_port() if swc else 0 for _ in names]
        self.nodes = [
            Node(name, config, url, ports[i], ports[:1] if swc and i else ())
            for i, name in enumerate(names)
        ]
        self.startup = 0.0  # seconds until ready

    def __enter__(self) -> Deployment:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self) -> None:
        started = time.monotonic()
        if self.redis is not None and self.nodes[0].name:
            self.redis.flush()
        for node in self.nodes:
            node.start()
        names = {node.name for node in self.nodes}
        deadline = started + READY_TIMEOUT
        while True:
            for node in self.nodes:
                node.scan()
            if all(
                node.port and node.links >= names - {node.name} and node.complete
                for node in self.nodes
            ):
                break
            if time.monotonic() > deadline:
                missing = [
                    f"{node.label}: port {node.port or '?'}, links up to "
                    f"{', '.join(sorted(node.links)) or 'none'}"
                    for node in self.nodes
                ]
                raise ProcessError(
                    f"cluster not ready after {READY_TIMEOUT:.0f} s ({'; '.join(missing)}):\n"
                    + self.nodes[0].log_tail()
                )
            time.sleep(POLL)
        self.startup = time.monotonic() - started

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def cpu(self) -> list[float | None]:
        """CPU-seconds used so far by each node, then by the Redis server."""
        figures = [node.cpu() for node in self.nodes]
        figures.append(None if self.redis is None else cpu_seconds(self.redis.pid))
        return figures

    def dead(self) -> str | None:
        """Which node exited, with its log's tail, if one did."""
        for node in self.nodes:
            if not node.alive():
                code = node.proc.returncode if node.proc is not None else None
                return f"node {node.label} exited with {code}: {node.log_tail(5)}"
        return None

    def warnings(self) -> list[str]:
        """Every node's WARNING and ERROR log lines, the ERROR ones first."""
        lines = [f"{node.label}: {line}" for node in self.nodes for line in node.errors()]
        return sorted(lines, key=lambda line: " ERROR " not in line)

    def close(self) -> None:
        for node in self.nodes:  # all at once, then wait for each
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(OSError):
                    node.proc.terminate()
        for node in self.nodes:
            node.close()
