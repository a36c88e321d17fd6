"""Configuration: one TOML file, every key with a default, environment overrides.

The schema below is the single source of truth: each section is a dataclass whose fields
are the keys, with their defaults. `docs/configuration.md` documents the same keys; a test
keeps the two in step. Unknown keys and bad values raise `ConfigError` naming the key, so
start-up fails with one clear line.

Environment variables override keys: `NAUTILUS_BROKER__ALLOW_ANONYMOUS=false` sets
`broker.allow_anonymous`. Values are parsed as TOML values where they parse, else taken as
strings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from broker.mountpoints import problem as mountpoint_problem

ENV_PREFIX = "NAUTILUS_"
_DURATION = re.compile(r"^(\d+)\s*([smhdw]?)$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigError(ValueError):
    """A config file, key or value that cannot be used; the message names it."""


class Duration(int):
    """Seconds, given as an integer or a string such as "30s", "5m", "1h", "1d", "1w"."""


@dataclass(slots=True)
class BrokerSettings:
    allow_anonymous: bool = True
    max_client_id_size: int = 100
    connect_timeout: Duration = 10  # type: ignore[assignment]
    max_inflight_messages: int = 20
    max_online_messages: int = 1000
    max_offline_messages: int = 1000
    queue_type: Literal["fifo", "lifo"] = "fifo"
    max_message_size: int = 0
    persistent_client_expiration: Duration = 0  # type: ignore[assignment]
    retry_interval: Duration = 20  # type: ignore[assignment]
    receive_max_broker: int = 65535
    topic_alias_max_broker: int = 64
    topic_alias_max_client: int = 64
    max_keepalive: int = 0
    topic_max_depth: int = 10
    max_message_rate: int = 0
    max_subscriptions_per_client: int = 0
    upgrade_outgoing_qos: bool = False
    slow_subscriber_timeout: float = 2.0
    max_msgs_per_drain_step: int = 1000
    shared_subscription_policy: Literal["prefer_local", "local_only", "random", "round_robin"] = (
        "prefer_local"
    )
    allow_multiple_sessions: bool = False
    queue_deliver_mode: Literal["fanout", "balance"] = "fanout"
    response_information: str = ""
    server_reference: str = ""
    server_moved: bool = False
    node_name: str = "nautilus"
    systree_enabled: bool = True
    systree_interval: Duration = 20  # type: ignore[assignment]
    systree_qos: int = 0
    systree_retain: bool = False
    systree_mountpoint: str = ""  # the topic tree $SYS is published in ("": the default)


@dataclass(slots=True)
class ListenerSettings:
    type: Literal["tcp", "ssl", "ws", "wss"] = "tcp"
    address: str = "127.0.0.1:1883"
    max_connections: int = 10000
    # A PROXY protocol v1/v2 header comes first (a load balancer's): the peer it names is
    # the client's address for hooks, logs and ACLs.
    proxy_protocol: bool = False
    # The topic tree of this listener's clients ("": the default; broker/mountpoints.py).
    mountpoint: str = ""
    path: str = "/mqtt"  # ws / wss: where the WebSocket upgrade is accepted
    # ssl (VerneMQ's names): the server's certificate chain and key (PEM), the CA that
    # client certificates must chain to, and what the listener asks of clients.
    certfile: str = ""
    keyfile: str = ""
    keypasswd: str = ""
    cafile: str = ""
    require_certificate: bool = False
    use_identity_as_username: bool = False  # the client certificate's CN is the username
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = "tlsv1.2"  # the lowest accepted
    ciphers: str = ""  # an OpenSSL cipher list (TLS 1.2); "" keeps OpenSSL's defaults

    @property
    def host_port(self) -> tuple[str, int]:
        return host_port(self.address)


def host_port(address: str) -> tuple[str, int]:
    """("127.0.0.1", 1883) from "127.0.0.1:1883"; IPv6 hosts in brackets: "[::1]:1883"."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("IPv6 hosts need brackets")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected host:port")
    return host, int(port)


@dataclass(slots=True)
class StoreSettings:
    backend: Literal["leveldb", "memory"] = "leveldb"
    path: str = "./data"
    sync: bool = True


@dataclass(slots=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"  # json: one JSON object per line
    console: bool = True  # to stderr
    file: str = ""  # a path: also to this file, rotated by size
    file_max_bytes: int = 10 * 1024 * 1024
    file_backups: int = 5  # rotated files kept (file.1 ... file.N)
    syslog: str = ""  # "/dev/log", or "host:port" (UDP): also to syslog


@dataclass(slots=True)
class HttpSettings:
    enabled: bool = True
    address: str = "127.0.0.1:8888"
    # Prefix of every /metrics name (VerneMQ's prometheus_namespace): "" keeps the
    # metric names as they are in $SYS and VerneMQ's dashboards.
    prometheus_namespace: str = ""
    api_keys_file: str = "./data/api-keys"  # `nautilus api-key add|list|delete` edits it
    # Limits (broker/http/connections.py): seconds a request may take to arrive whole
    # (line, headers and body) and a response to be taken, seconds an idle kept-alive
    # connection is kept, and connections open at once (at most half of RLIMIT_NOFILE).
    request_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    max_connections: int = 256
    # Web pages of these origins ("https://dash.example.com", or "*") may read /status.json,
    # /health, /metrics and the admin API (CORS); none by default.
    cors_origins: list[str] = field(default_factory=list)


@dataclass(slots=True)
class GraphiteSettings:
    """[graphite]: the /metrics figures pushed to Graphite (VerneMQ's vmq_graphite)."""

    enabled: bool = False
    host: str = "localhost"
    port: int = 2003
    interval: float = 20.0  # seconds between rounds (VerneMQ's 20000 ms)
    prefix: str = ""  # before the node's name in every path
    api_key: str = ""  # hosted Graphite's key, before everything


@dataclass(slots=True)
class SwcSettings:
    """[cluster.swc]: the leaderless metadata's replication (metadata = "swc")."""

    directory: str = ""  # its LevelDB; "": <store.path>/swc
    groups: int = 10  # the keys are spread over this many replicas (1-100)
    sync_interval: float = 5.0  # seconds between a group's exchanges (plus up to half)
    exchange_batch_size: int = 100  # dots asked for per request of an exchange
    gc_interval: float = 15.0  # seconds between forgetting what every peer holds
    enable_broadcast: bool = True  # push each write to the peers at once
    # fsync each commit (a power loss keeps it too); false: written, which a crash of the
    # process (kill -9) keeps, but a crash of the machine may not.
    sync: bool = False


@dataclass(slots=True)
class ClusterSettings:
    """[cluster]: this node as one of several (docs/clustering.md). Off while `address`
    is empty."""

    node_name: str = ""  # "" keeps broker.node_name; set, it names this node everywhere
    address: str = ""  # the cluster listener, "host:port" (port 0: any free port)
    advertise: str = ""  # where other nodes reach it, if not `address` (NAT, proxies)
    # The shared truth: "redis" (plugins/redis_subs, Courier's way), or "swc": every node
    # holds it, replicated leaderlessly (broker/cluster/swc/; no external service).
    # "auto": "redis" when [plugins.redis_subs] is enabled, else "swc".
    metadata: Literal["auto", "redis", "swc"] = "auto"
    seeds: list[str] = field(default_factory=list)  # swc: "host:port" of the nodes (this one too)
    secret: str = ""  # nodes must prove they hold the same one to link (it is never sent)
    # TLS on the links (all three, or none): this node's certificate chain and key (PEM),
    # and the CA that signed every node's certificate; a certificate names its node (its
    # subject CN or a DNS subjectAltName is the node's name).
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_keypasswd: str = ""  # the key's password, if it is encrypted
    tls_cafile: str = ""
    liveness_interval: float = 0.5  # seconds between liveness refreshes
    dead_after: float = 3.0  # a node silent this long is dead: its sessions are reaped
    outgoing_buffer_size: int = 16 * 1024 * 1024  # bytes kept per link while it is down
    max_frame_size: int = 64 * 1024 * 1024  # a larger frame from a peer closes its link
    # Connections open at once on the cluster listener, linked or still before their
    # HELLO (1 or more): each other node needs one, and a link being replaced two.
    max_connections: int = 64
    remote_enqueue_timeout: float = 5.0  # seconds a takeover or migrated chunk may take
    # Registrations while Redis is away: refused with 0x88 server unavailable (false), or
    # taken on this node alone and written to Redis when it returns (true).
    allow_register_during_outage: bool = False
    # metadata = "swc": while a member cannot be reached (a netsplit), CONNECT is refused
    # (0x88 / 3), a PUBLISH dropped without an acknowledgement, SUBSCRIBE and UNSUBSCRIBE
    # refused, as in VerneMQ; each switch lets its kind through (both sides converge after).
    allow_register_during_netsplit: bool = False
    allow_publish_during_netsplit: bool = False
    allow_subscribe_during_netsplit: bool = False
    allow_unsubscribe_during_netsplit: bool = False
    # node -> "host:port": reach these nodes there instead of at what they advertise.
    peer_addresses: dict[str, str] = field(default_factory=dict)
    swc: SwcSettings = field(default_factory=SwcSettings)


# A top-level table that configures one plugin, instead of [plugins.<name>]: its plugin
# (named after the table) is the class the table's `nautilus.tables` entry point names
# (setup.cfg), which makes its section from the config (broker/plugins.py).
PLUGIN_TABLE = {"plugin": True}


@dataclass(slots=True)
class Config:
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    listeners: list[ListenerSettings] = field(default_factory=lambda: [ListenerSettings()])
    store: StoreSettings = field(default_factory=StoreSettings)
    log: LogSettings = field(default_factory=LogSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    graphite: GraphiteSettings = field(default_factory=GraphiteSettings)
    # [plugins.<name>] tables; each plugin validates its own keys (broker/plugins.py).
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    # [event_relay]: the relay validates its own keys (event_relay/config.py).
    event_relay: dict[str, Any] = field(default_factory=dict, metadata=PLUGIN_TABLE)
    # [[bridges]]: each checked by the bridge plugin (plugins/bridge/config.py).
    bridges: list[dict[str, Any]] = field(default_factory=list, metadata=PLUGIN_TABLE)


# The tables of PLUGIN_TABLE, by name.
PLUGIN_TABLES = tuple(f.name for f in dataclasses.fields(Config) if f.metadata.get("plugin"))


def plugin_tables(config: Config) -> dict[str, Any]:
    """The plugin tables (PLUGIN_TABLES) this config has, by name."""
    return {name: getattr(config, name) for name in PLUGIN_TABLES if getattr(config, name)}


# Keys whose value must satisfy more than its type says.
_NON_NEGATIVE = {
    "max_client_id_size",
    "max_inflight_messages",
    "max_message_size",
    "max_keepalive",
    "topic_max_depth",
    "max_message_rate",
    "max_subscriptions_per_client",
    "max_connections",
    "file_max_bytes",
    "file_backups",
    "outgoing_buffer_size",
}
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ORIGIN = re.compile(r"https?://[^/\s]+")  # scheme://host[:port], as a browser sends it
_AT_LEAST_MINUS_ONE = {"max_online_messages", "max_offline_messages"}


def load_config(path: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the TOML file at `path` (defaults only when None) and apply env overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    _apply_environment(data, os.environ if environ is None else environ)
    return config_from_dict(data)


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Build a validated Config from parsed TOML (sections as dicts)."""
    return validate(_build(Config, data, ""))


def _apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    sections = get_type_hints(Config)
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if not key:
            if any(section.startswith(f"{known}_") for known in sections):
                # Most likely a typo for a real key: say so rather than ignore it.
                raise ConfigError(
                    f"{name}: expected {ENV_PREFIX}<SECTION>__<KEY> (two underscores)"
                )
            continue  # another program's variable
        if section in ("listeners", "plugins"):
            raise ConfigError(f"{name}: [{section}] cannot be set from the environment")
        settings = sections.get(section)
        is_table = isinstance(settings, type) and dataclasses.is_dataclass(settings)
        hint = get_type_hints(settings).get(key) if is_table else None
        if hint is str:
            value: Any = raw  # a path or name stays text even if it looks like a number
        else:
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                value = raw
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ConfigError(f"{name}: [{section}] is not a section")
        data[section][key] = value


def build_section(cls: type, data: Any, where: str) -> Any:
    """Validate one table against a settings dataclass; errors name `where.key`."""
    return _build(cls, data, where)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a table, got {_kind(data)}")
    hints = get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            name = f"{where}.{key}" if where else key
            raise ConfigError(f"unknown config key {name!r}")
    values = {}
    for key, value in data.items():
        name = f"{where}.{key}" if where else key
        values[key] = _convert(hints[key], value, name)
    return cls(**values)


def _convert(hint: Any, value: Any, name: str) -> Any:
    origin = get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, name)
    if hint is Any:
        return value
    if origin is dict:  # a table whose values share one type, e.g. dict[str, int]
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a table, got {_kind(value)}")
        _, value_hint = get_args(hint)
        return {key: _convert(value_hint, item, f"{name}.{key}") for key, item in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected an array, got {_kind(value)}")
        (item,) = get_args(hint)
        return [_convert(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{name}: {value!r} is not one of {allowed}")
        return value
    if hint is Duration:
        return _duration(value, name)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if hint is int:
        return _integer(value, name)
    if hint is float:
        return _seconds(value, name)
    if not isinstance(value, hint):
        raise ConfigError(f"{name}: expected {hint.__name__}, got {_kind(value)}")
    empty_means_default = name == "cluster.node_name"  # "" keeps broker.node_name
    if name.endswith("node_name") and (
        (not value and not empty_means_default) or any(c in value for c in "/+#\0")
    ):
        raise ConfigError(f"{name}: must be one topic level, without '/', '+' or '#'")
    return value


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    key = name.rpartition(".")[2]
    # HTTP and the cluster listener always have a cap: anyone who reaches them may connect.
    if name in ("http.max_connections", "cluster.max_connections") and value < 1:
        raise ConfigError(f"{name}: must be 1 or more, got {value}")
    if key in _NON_NEGATIVE and value < 0:
        raise ConfigError(f"{name}: must be 0 or more, got {value}")
    if key in _AT_LEAST_MINUS_ONE and value < -1:
        raise ConfigError(f"{name}: must be -1 (no limit) or more, got {value}")
    if key.startswith("topic_alias_max") and not 0 <= value <= 65535:
        raise ConfigError(f"{name}: must be between 0 and 65535, got {value}")
    if key == "systree_qos" and not 0 <= value <= 2:
        raise ConfigError(f"{name}: must be 0, 1 or 2, got {value}")
    if key == "max_msgs_per_drain_step" and value < 1:
        raise ConfigError(f"{name}: must be 1 or more, got {value}")
    if key == "receive_max_broker" and not 1 <= value <= 65535:
        raise ConfigError(f"{name}: must be between 1 and 65535, got {value}")
    return value


# Seconds that may be 0, which turns the thing off.
_ZERO_IS_OFF = {"heartbeat_interval"}


def _seconds(value: Any, name: str) -> float:
    """A positive number of seconds, fractions allowed (e.g. 0.5)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if name.rpartition(".")[2] in _ZERO_IS_OFF:
        if not number or value < 0:
            raise ConfigError(f"{name}: expected 0 (off) or a number of seconds, got {value!r}")
    elif not number or not value > 0:
        raise ConfigError(f"{name}: expected a number of seconds above 0, got {value!r}")
    return float(value)


def _duration(value: Any, name: str) -> Duration:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Duration(value)
    match = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ConfigError(f"{name}: expected seconds or a duration like '30s', '1h', got {value!r}")
    return Duration(int(match[1]) * _DURATION_UNITS[match[2]])


def _kind(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def validate(config: Config) -> Config:
    """Cross-key checks that a single value cannot show."""
    for i, listener in enumerate(config.listeners):
        try:
            _ = listener.host_port
        except ValueError:
            raise ConfigError(
                f"listeners[{i}].address: expected 'host:port' (IPv6: '[::1]:port'), "
                f"got {listener.address!r}"
            ) from None
        if listener.type in ("ssl", "wss"):
            check_tls(listener, f"listeners[{i}]")
        else:
            for key in TLS_KEYS:
                if getattr(listener, key) != getattr(_PLAIN, key):
                    raise ConfigError(
                        f'listeners[{i}].{key}: TLS settings need type = "ssl" or "wss"'
                    )
        why = mountpoint_problem(listener.mountpoint)
        if why is not None:
            raise ConfigError(f"listeners[{i}].mountpoint: {why}")
        if listener.type in ("ws", "wss") and not listener.path.startswith("/"):
            raise ConfigError(f'listeners[{i}].path: expected a path such as "/mqtt"')
    if not config.listeners:
        raise ConfigError("listeners: at least one listener is needed")
    why = mountpoint_problem(config.broker.systree_mountpoint)
    if why is not None:
        raise ConfigError(f"broker.systree_mountpoint: {why}")
    namespace = config.http.prometheus_namespace
    if namespace and not _METRIC_NAME.fullmatch(namespace):
        raise ConfigError(
            f"http.prometheus_namespace: {namespace!r} cannot start a Prometheus metric name "
            "(letters, digits and _, not starting with a digit)"
        )
    if config.graphite.interval <= 0:
        raise ConfigError("graphite.interval: must be more than 0 seconds")
    if not 0 < config.graphite.port < 65536:
        raise ConfigError(f"graphite.port: {config.graphite.port} is not a port")
    for i, origin in enumerate(config.http.cors_origins):
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"http.cors_origins[{i}]: {origin!r} is not an origin "
                '("https://dash.example.com", "http://localhost:3000") or "*"'
            )
    _validate_cluster(config)
    try:
        host_port(config.http.address)
    except ValueError:
        raise ConfigError(
            f"http.address: expected 'host:port' (IPv6: '[::1]:port'), got {config.http.address!r}"
        ) from None
    return config


def _validate_cluster(config: Config) -> None:
    cluster = config.cluster
    if cluster.node_name:
        if config.broker.node_name not in ("nautilus", cluster.node_name):
            raise ConfigError(
                f"cluster.node_name: {cluster.node_name!r} differs from broker.node_name "
                f"{config.broker.node_name!r}; set one of them"
            )
        config.broker.node_name = cluster.node_name  # the one name the node goes by
    addresses = [("address", cluster.address), ("advertise", cluster.advertise)]
    addresses += [(f"peer_addresses.{n}", a) for n, a in cluster.peer_addresses.items()]
    addresses += [(f"seeds[{i}]", a) for i, a in enumerate(cluster.seeds)]
    for key, address in addresses:
        if not address:
            continue
        try:
            host_port(address)
        except ValueError:
            raise ConfigError(
                f"cluster.{key}: expected 'host:port' (IPv6: '[::1]:port'), got {address!r}"
            ) from None
    _check_cluster_tls(cluster)
    if cluster.address:
        if cluster.dead_after <= cluster.liveness_interval:
            raise ConfigError(
                f"cluster.dead_after: must be longer than liveness_interval "
                f"({cluster.liveness_interval}s), got {cluster.dead_after}s"
            )
        plugin = config.plugins.get("redis_subs", {})
        if cluster.metadata == "auto":  # existing Redis set-ups keep Redis
            cluster.metadata = "redis" if plugin.get("enabled") is True else "swc"
        if cluster.metadata == "redis" and plugin.get("enabled") is not True:
            raise ConfigError('cluster.metadata: "redis" needs [plugins.redis_subs] enabled = true')
        if not 1 <= cluster.swc.groups <= 100:
            raise ConfigError(f"cluster.swc.groups: 1 to 100, got {cluster.swc.groups}")
        for key in ("sync_interval", "gc_interval"):
            if getattr(cluster.swc, key) <= 0:
                raise ConfigError(f"cluster.swc.{key}: must be above 0")
        if cluster.swc.exchange_batch_size < 1:
            raise ConfigError("cluster.swc.exchange_batch_size: must be at least 1")
        if not cluster.swc.directory:
            cluster.swc.directory = os.path.join(config.store.path, "swc")


CLUSTER_TLS_KEYS = ("tls_certfile", "tls_keyfile", "tls_cafile")


def _check_cluster_tls(cluster: ClusterSettings) -> None:
    """The cluster's TLS is mutual: each node needs its certificate, its key and the CA
    (broker/cluster/channel_tls.py loads the files)."""
    given = [key for key in CLUSTER_TLS_KEYS if getattr(cluster, key)]
    if given and len(given) < len(CLUSTER_TLS_KEYS):
        missing = next(key for key in CLUSTER_TLS_KEYS if key not in given)
        raise ConfigError(
            f"cluster.{missing}: needed with {' and '.join(given)} (the cluster's TLS is "
            "mutual: tls_certfile, tls_keyfile and tls_cafile)"
        )
    if cluster.tls_keypasswd and not given:
        raise ConfigError("cluster.tls_keypasswd: a TLS setting, and TLS is off (set tls_certfile)")


TLS_KEYS = (
    "certfile",
    "keyfile",
    "keypasswd",
    "cafile",
    "require_certificate",
    "use_identity_as_username",
    "tls_version",
    "ciphers",
)
_PLAIN = ListenerSettings()  # a listener's defaults: what a tcp / ws listener must keep


def check_tls(listener: ListenerSettings, where: str) -> None:
    """What a TLS listener needs besides its files (broker/tls.py loads those)."""
    for key in ("certfile", "keyfile"):
        if not getattr(listener, key):
            raise ConfigError(f'{where}.{key}: a listener of type "{listener.type}" needs one')
    if listener.require_certificate and not listener.cafile:
        raise ConfigError(f"{where}.cafile: require_certificate needs the CA to check against")
    if listener.use_identity_as_username and not listener.require_certificate:
        raise ConfigError(
            f"{where}.use_identity_as_username: needs require_certificate = true "
            "(the username comes from the client's certificate)"
        )
