# Starting and stopping the brokers under test, one at a time.
#
# Strategy: each broker runs as a child process on a free loopback port, with a config
# file generated into a temporary directory and its output captured in a log file there.
# Readiness is a TCP connect polled with a deadline. Every child is stopped in `finally`,
# so an exception or Ctrl-C never leaves a broker behind. Children import from this
# checkout (PYTHONPATH is set to REPO), so the broker measured is the one beside the bench;
# amqtt is the exception, run from a venv of its own (see _amqtt).
# A broker's configuration depends on the mode of the scenario (MODES): bounded rows keep
# the queue limits of every earlier run, flood and paced rows the brokers' default queue
# length.
from __future__ import annotations

import importlib
import os
import pwd
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from . import deployed as deployed_config
from .drops import SysCounter
from .scenarios import Credentials, Target

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
_READY_TIMEOUT = 20.0
_STOP_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-subscriber queue limits: deliveries in flight before acks, and queued."""

    inflight: int
    queued: int


@dataclass(frozen=True, slots=True)
class Mode:
    """How the brokers are configured for the throughput scenarios of one mode."""

    name: str
    limits: Limits
    sys_interval: int | None  # $SYS period in seconds when the drop counter is read


# bounded: the limits of every earlier run (100 in flight, 100,000 queued), so the figures
#   stay comparable with earlier ones.
# flood: the default queue length of both brokers (1,000 messages per subscriber), as
#   users run them: under an open-loop flood it decides between queueing, pushing back
#   and dropping, so 100,000-message queues would measure a configuration nobody runs.
#   The in-flight window stays at the bounded rows' 100, so each flood row differs from
#   its bounded row only by the open loop and the queue length. The $SYS tree comes every
#   second, for the drop counter.
# paced: configured as flood (a steady offered load against the queue length users run),
#   so a paced row and its flood row differ only by how the publishers send.
MODES = {
    "bounded": Mode("bounded", Limits(inflight=100, queued=100_000), sys_interval=None),
    "flood": Mode("flood", Limits(inflight=100, queued=1000), sys_interval=1),
    "paced": Mode("paced", Limits(inflight=100, queued=1000), sys_interval=1),
}


def nautilus_toml(mode: Mode, store: str = 'backend = "memory"', anonymous: bool = True) -> str:
    """The Nautilus config of `mode`, with {host} and {port} left to fill in; `store`: the
    body of its [store] table (the memory store unless a store is being measured);
    `anonymous`: whether clients without credentials are let in."""
    lines = ["[broker]", f"allow_anonymous = {str(anonymous).lower()}"]
    lines += [
        f"max_inflight_messages = {mode.limits.inflight}",
        f"max_online_messages = {mode.limits.queued}",
    ]
    if mode.sys_interval:
        lines.append(f"systree_interval = {mode.sys_interval}")
    lines += ["[[listeners]]", 'type = "tcp"', 'address = "{host}:{port}"']
    lines += ["[store]", store]
    return "\n".join(lines) + "\n"


def mosquitto_conf(
    mode: Mode, persistence: str = "persistence false", security: str | None = None
) -> str:
    """Mosquitto with the limits of `mode`. TCP_NODELAY is on because asyncio (and so
    Nautilus and amqtt) sets it on every socket; Mosquitto's default adds Nagle delays.
    `security`: lines that check clients (a password file, an ACL file), which then
    must log in; None: anonymous clients are let in."""
    anonymous = "allow_anonymous true" if security is None else "allow_anonymous false"
    lines = ["listener {port} {host}", anonymous, persistence]
    if security is not None:
        lines.append(security.rstrip("\n"))
    lines += [
        f"max_inflight_messages {mode.limits.inflight}",
        f"max_queued_messages {mode.limits.queued}",
    ]
    if mode.sys_interval:
        lines.append(f"sys_interval {mode.sys_interval}")
    lines += ["set_tcp_nodelay true", "log_dest stderr", "log_type error", "log_type warning"]
    return "\n".join(lines) + "\n"


NAUTILUS_TOML = nautilus_toml(MODES["bounded"])  # also the base of bench/acl.py, webhooks.py
MOSQUITTO_CONF = mosquitto_conf(MODES["bounded"])


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    name: str
    label: str
    # (working directory, port) -> argv; may write a config file into the directory.
    command: Callable[[Path, int], list[str]]
    version: Callable[[], str]
    # Scenario topologies the broker cannot serve, with why (not measured, reported).
    unsupported: Mapping[str, str] = field(default_factory=dict)
    inflight: int | None = None  # QoS 1 deliveries per subscriber before it waits for acks
    drops: SysCounter | None = None  # its queue drop counter, when the mode reads it
    # Why the broker cannot run on this machine, in one line (None: it can); compare
    # skips such a broker and measures the others.
    missing: Callable[[], str | None] | None = None
    # What clients log in with (the deployed variants refuse anonymous clients).
    credentials: Credentials | None = None
    # The command is a wrapper (bench/relay/broker.py, the relay's consumer) whose one
    # child is the broker: its CPU time and memory are read from that child.
    wrapped: bool = False


def _nautilus(mode: Mode, store: str | None = None) -> Callable[[Path, int], list[str]]:
    """`store`: None for the memory store, else `leveldb` with this `sync` setting."""

    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        table = 'backend = "memory"'
        if store is not None:
            table = f'backend = "leveldb"\npath = "{workdir / "store"}"\nsync = {store}'
        config.write_text(nautilus_toml(mode, table).format(host=HOST, port=port))
        return [sys.executable, "-m", "broker", "--config", str(config)]

    return command


# The event relay with its defaults (every hook relayed, payloads full, memory only).
RELAY_TOML = """\
[event_relay]
enabled = true
address = "{host}:{port}"
"""
# bench/relay/overhead.py sets this to a directory: each `nautilus-relay` broker started
# then leaves the count of its consumer there (bench/relay/tally.py), named by start time.
RELAY_TALLIES = "BENCH_RELAY_TALLIES"


def _nautilus_relay(
    mode: Mode, consumer: bool, durability: str = "none", deployed: bool = False
) -> Callable[[Path, int], list[str]]:
    """Nautilus with the relay on; `consumer`: with one consumer reading every event, in
    a process of its own (bench/relay/broker.py runs the broker and the consumer);
    `durability` other than none: with a spool in the broker's working directory;
    `deployed`: as the design card's users run it (bench/deployed.py): no anonymous
    clients, auth_jwt, the acl plugin, LevelDB at its default `sync = true`."""

    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "nautilus.toml"
        relay = free_port()
        spool = (
            f'durability = "{durability}"\nspool_path = "{workdir / "spool"}"\n'
            if durability != "none"
            else ""
        )
        if deployed:
            store = f'backend = "leveldb"\npath = "{workdir / "store"}"\nsync = true'
            base = nautilus_toml(mode, store, anonymous=False)
            base += deployed_config.nautilus_plugins(workdir)
        else:
            base = nautilus_toml(mode)
        config.write_text(
            base.format(host=HOST, port=port) + RELAY_TOML.format(host=HOST, port=relay) + spool
        )
        broker = [sys.executable, "-m", "broker", "--config", str(config)]
        if not consumer:
            return broker
        tally = Path(os.environ.get(RELAY_TALLIES) or workdir) / f"{time.time_ns()}.tally"
        wrapper = [sys.executable, "-m", "bench.relay.broker", f"--relay={HOST}:{relay}"]
        return [*wrapper, f"--tally={tally}", "--", *broker]

    return command


def _mosquitto(
    mode: Mode, persist: bool = False, deployed: bool = False
) -> Callable[[Path, int], list[str]]:
    """`persist`: persistence on, in the working directory; `deployed`: also a password
    file and an ACL file (bench/deployed.py), no anonymous clients."""

    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "mosquitto.conf"
        persistence = "persistence false"
        if persist:  # written at its default autosave interval, and at exit
            # Started as root, Mosquitto runs as user `mosquitto`, which may not write in
            # our working directory ("Error: Permission denied." at exit): stay this user.
            persistence = (
                f"persistence true\npersistence_location {workdir}/\n"
                f"user {pwd.getpwuid(os.getuid()).pw_name}"
            )
        # Its files are readable by this user only: the `user` line above keeps it so.
        security = deployed_config.mosquitto_security(workdir) if deployed else None
        config.write_text(mosquitto_conf(mode, persistence, security).format(host=HOST, port=port))
        return [mosquitto_path(), "-c", str(config)]

    return command


# amqtt pins websockets==15.0.1, and Nautilus is tested with the newest websockets, so
# amqtt has a venv of its own, .venv-amqtt (`make .venv-amqtt/.installed`); the Makefile
# exports its interpreter in this variable. That interpreter runs bench/amqtt_server.py as
# a file, in isolated mode (-I: no PYTHONPATH, so nothing of this checkout is imported).
AMQTT_PYTHON = "NAUTILUS_AMQTT_PYTHON"
AMQTT_SERVER = REPO / "bench" / "amqtt_server.py"


def amqtt_python() -> str:
    return os.environ.get(AMQTT_PYTHON) or str(REPO / ".venv-amqtt" / "bin" / "python")


def amqtt_missing() -> str | None:
    """Why amqtt cannot run here (its venv's interpreter is not there), or None."""
    python = amqtt_python()
    if os.access(python, os.X_OK):
        return None
    return f"amqtt's venv is missing (no {python}): run `make .venv-amqtt/.installed`"


def _amqtt(workdir: Path, port: int) -> list[str]:
    if why := amqtt_missing():
        raise BrokerError(why)
    script = [amqtt_python(), "-I", str(AMQTT_SERVER)]
    return [*script, "--host", HOST, "--port", str(port)]


def _amqtt_version() -> str:
    """Asked of amqtt's own interpreter: amqtt is not installed in ours."""
    ask = 'import importlib.metadata as m; print(m.version("amqtt"))'
    try:
        out = subprocess.run([amqtt_python(), "-I", "-c", ask], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _null(workdir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "bench.nullbroker", "--host", HOST, "--port", str(port)]


def mosquitto_path() -> str:
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _mosquitto_version() -> str:
    out = subprocess.run([mosquitto_path(), "-h"], capture_output=True, text=True).stdout
    words = out.split()
    return words[2] if words[:2] == ["mosquitto", "version"] else "unknown"


def _nautilus_version() -> str:
    version = getattr(importlib.import_module("broker"), "__version__", "unknown")
    git = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return f"{version} ({git.stdout.strip()})" if git.returncode == 0 else version


def _nautilus_drops(mode: Mode) -> SysCounter | None:
    """`queue_message_drop`, published every `systree_interval` under the node name."""
    if not mode.sys_interval:
        return None
    from broker.config import BrokerSettings

    node = BrokerSettings().node_name
    return SysCounter(f"$SYS/{node}/queue/message/drop", period=mode.sys_interval)


def _mosquitto_drops(mode: Mode) -> SysCounter | None:
    """Published when it changed, in rounds that come once more than `sys_interval`
    whole seconds have passed (every 2 s for 1), each starting with the uptime."""
    if not mode.sys_interval:
        return None
    return SysCounter(
        "$SYS/broker/publish/messages/dropped",
        period=mode.sys_interval + 1,
        round_topic="$SYS/broker/uptime",
    )


def for_mode(mode: Mode) -> dict[str, BrokerSpec]:
    """Every broker, configured for `mode`."""
    limits = mode.limits

    def nautilus(
        name: str,
        label: str,
        command: Callable[[Path, int], list[str]],
        credentials: Credentials | None = None,
        wrapped: bool = False,
    ) -> BrokerSpec:
        return BrokerSpec(
            name,
            label,
            command,
            _nautilus_version,
            inflight=limits.inflight,
            drops=_nautilus_drops(mode),
            credentials=credentials,
            wrapped=wrapped,
        )

    def mosquitto(
        name: str,
        label: str,
        command: Callable[[Path, int], list[str]],
        credentials: Credentials | None = None,
    ) -> BrokerSpec:
        return BrokerSpec(
            name,
            label,
            command,
            _mosquitto_version,
            inflight=limits.inflight,
            drops=_mosquitto_drops(mode),
            credentials=credentials,
        )

    return {
        "nautilus": nautilus("nautilus", "Nautilus", _nautilus(mode)),
        "mosquitto": mosquitto("mosquitto", "Mosquitto", _mosquitto(mode)),
        # The stores, for the store comparison (not in the default list of brokers).
        "nautilus-leveldb": nautilus(
            "nautilus-leveldb", "Nautilus, LevelDB", _nautilus(mode, store="false")
        ),
        "nautilus-leveldb-sync": nautilus(
            "nautilus-leveldb-sync", "Nautilus, LevelDB, fsync", _nautilus(mode, store="true")
        ),
        "mosquitto-persist": mosquitto(
            "mosquitto-persist", "Mosquitto, persistence", _mosquitto(mode, persist=True)
        ),
        # The event relay, for its overhead (bench/relay/overhead.py).
        "nautilus-relay-log": nautilus(
            "nautilus-relay-log", "Nautilus, relay on, no consumer", _nautilus_relay(mode, False)
        ),
        "nautilus-relay": nautilus(
            "nautilus-relay",
            "Nautilus, relay on, one consumer",
            _nautilus_relay(mode, True),
            wrapped=True,
        ),
        # The relay's spool, for its cost (bench/relay/spool.py).
        "nautilus-relay-spool": nautilus(
            "nautilus-relay-spool",
            "Nautilus, relay with a spool",
            _nautilus_relay(mode, False, "spool"),
        ),
        "nautilus-relay-acked": nautilus(
            "nautilus-relay-acked",
            "Nautilus, relay with acknowledged durability",
            _nautilus_relay(mode, False, "acknowledged"),
        ),
        # As the design card's users run them (bench/deployed.py): every client logs in
        # and is checked by a per-user ACL; Nautilus with auth_jwt (HS256), the acl
        # plugin, LevelDB and the relay read by one consumer; Mosquitto with a password
        # file, an ACL file and persistence.
        "nautilus-deployed": nautilus(
            "nautilus-deployed",
            "Nautilus, deployed",
            _nautilus_relay(mode, True, deployed=True),
            deployed_config.nautilus_credentials(),
            wrapped=True,
        ),
        "mosquitto-deployed": mosquitto(
            "mosquitto-deployed",
            "Mosquitto, deployed",
            _mosquitto(mode, persist=True, deployed=True),
            deployed_config.mosquitto_credentials(),
        ),
        # No queue limits to set, no drop counter: the same in every mode.
        "amqtt": BrokerSpec(
            "amqtt",
            "amqtt",
            _amqtt,
            _amqtt_version,
            unsupported={"shared": "no shared subscriptions"},
            missing=amqtt_missing,
        ),
        # A byte pipe, not a broker: calibrates the load generator (see bench/nullbroker.py).
        "null": BrokerSpec("null", "null broker", _null, lambda: "-"),
    }


BROKERS = for_mode(MODES["bounded"])


def raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one (the idle scenario needs ~10k)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    """The environment with REPO first on PYTHONPATH: `broker` and `bench` are imported
    from this checkout, whatever the virtualenv's editable install points at."""
    env = dict(os.environ)
    others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *others])
    # No HTTP server: benchmarks measure MQTT, and brokers run side by side (port 8888).
    env.setdefault("NAUTILUS_HTTP__ENABLED", "false")
    return env


def _only_child(pid: int) -> int:
    """The one child of process `pid` (a wrapper's broker, listening by now)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise BrokerError(f"process {pid} has {len(children)} children, not the broker alone")
    return int(children[0])


class RunningBroker:
    """A broker child process, for the duration of a `with` block."""

    def __init__(self, spec: BrokerSpec):
        self.spec = spec
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-{spec.name}-")
        self._workdir = Path(self._tmp.name)
        self._log = self._workdir / "broker.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._target: Target | None = None

    def __enter__(self) -> RunningBroker:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def exit_code(self) -> int | None:
        """The broker's exit code if it has died, else None."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def _start(self) -> None:
        port = free_port()
        argv = self.spec.command(self._workdir, port)
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=raise_fd_limit,
            )
        self._wait_ready(port)
        pid = _only_child(self._proc.pid) if self.spec.wrapped else self._proc.pid
        self._target = Target(
            HOST, port, pid, self.spec.inflight, self.spec.drops, credentials=self.spec.credentials
        )

    @property
    def target(self) -> Target:
        """Where the started broker listens."""
        if self._target is None:
            raise BrokerError(f"{self.spec.label} is not running")
        return self._target

    def _wait_ready(self, port: int) -> None:
        proc = self._proc
        assert proc is not None  # _start made it
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(
                    f"{self.spec.label} exited with {proc.returncode}:\n{self.log_tail()}"
                )
            try:
                socket.create_connection((HOST, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)  # poll interval, bounded by the deadline
        raise BrokerError(f"{self.spec.label} not listening after {_READY_TIMEOUT:.0f} s")

    def _stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._tmp.cleanup()
