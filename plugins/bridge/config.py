"""`[[bridges]]`: one table per bridge, VerneMQ's vmq_bridge settings under their names,
and its topic rules as `[[bridges.topics]]` tables (where `#` is just a character)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker.config import ConfigError, Duration, build_section
from broker.mountpoints import problem as mountpoint_problem
from broker.topics import valid_topic_filter


@dataclass(slots=True)
class TopicRule:
    pattern: str
    direction: Literal["out", "in", "both"] = "out"
    qos: int = 0  # the most a bridged message keeps: the lower of this and its own
    retain: bool = False  # keep the retain flag across the bridge
    local_prefix: str = ""
    remote_prefix: str = ""


@dataclass(slots=True)
class BridgeSettings:
    name: str
    address: str  # host:port of the remote broker
    transport: Literal["tcp", "ssl"] = "tcp"
    mqtt_version: Literal[3, 4, 5] = 4  # 3.1, 3.1.1 or 5
    client_id: str = "auto"  # auto: "<node>-bridge-<name>", stable across restarts
    clean_session: bool = False
    keepalive_interval: Duration = Duration(60)
    username: str = ""
    password: str = ""
    restart_timeout: Duration = Duration(10)  # between reconnect attempts, with jitter
    try_private: bool = True
    mountpoint: str = ""
    max_outgoing_buffered_messages: int = 1000
    persistent_queue: bool = False  # the outgoing buffer on disk: it survives a restart
    queue_dir: str = ""  # its LevelDB; "": <store.path>/bridges/<name>
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    insecure: bool = False  # ssl: no certificate or host name check
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = "tlsv1.2"  # the lowest accepted
    sni: str = ""  # the name sent and checked; default the address's host
    # The bridge's own connection to this broker (it acts through the hooks like any
    # client): credentials if the broker asks for them.
    local_username: str = ""
    local_password: str = ""
    topics: list[TopicRule] = field(default_factory=list)


def parse_bridges(tables: list[dict[str, object]]) -> list[BridgeSettings]:
    """The `[[bridges]]` tables, checked: a mistake is a ConfigError naming its key."""
    bridges = []
    names: set[str] = set()
    for i, table in enumerate(tables):
        where = f"bridges[{i}]"
        bridge = build_section(BridgeSettings, table, where)
        if not bridge.name or bridge.name in names:
            raise ConfigError(f"{where}.name: must be given, and differ from the others'")
        names.add(bridge.name)
        host, _, port = bridge.address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{where}.address: expected host:port, got {bridge.address!r}")
        if bridge.max_outgoing_buffered_messages < 0:
            raise ConfigError(f"{where}.max_outgoing_buffered_messages: must be 0 or more")
        why = mountpoint_problem(bridge.mountpoint)
        if why is not None:
            raise ConfigError(f"{where}.mountpoint: {why}")
        if not bridge.topics:
            raise ConfigError(f"{where}.topics: at least one [[bridges.topics]] table")
        for j, rule in enumerate(bridge.topics):
            here = f"{where}.topics[{j}]"
            if rule.qos not in (0, 1, 2):
                raise ConfigError(f"{here}.qos: 0, 1 or 2, got {rule.qos}")
            if not valid_topic_filter(rule.pattern):
                raise ConfigError(f"{here}.pattern: not a topic filter: {rule.pattern!r}")
            for name in ("local_prefix", "remote_prefix"):
                prefix = getattr(rule, name)
                if "+" in prefix or "#" in prefix:
                    raise ConfigError(f"{here}.{name}: no wildcards in a prefix: {prefix!r}")
        bridges.append(bridge)
    return bridges
