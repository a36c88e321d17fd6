"""`[event_relay]` and `[event_relay.sidecar]`: every key with its default
(docs/configuration.md, "Event relay")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker.config import ConfigError
from event_relay.schema import HOOK_NAMES

SAMPLED_HOOKS = ("on_publish", "on_deliver", "on_delivery_complete")  # Courier's


@dataclass(slots=True)
class SidecarConfig:
    """Courier's events sidecar: Nautilus connects out and pushes protobuf frames."""

    enabled: bool = False
    hostname: str = "127.0.0.1"
    port: int = 8890
    pool_size: int = 4  # connections; events of one client always take the same one
    backlog_size: int = 4096  # frames waiting per connection before the push waits
    hooks: list[str] = field(default_factory=lambda: list(HOOK_NAMES))


@dataclass(slots=True)
class RelayConfig:
    serve: bool = False  # `enabled` in the file: the TCP relay server runs
    address: str = "127.0.0.1:7883"
    secret: str = ""  # consumers must present it in HELLO when set
    # TLS, on when certfile is set (the MQTT listeners' keys and meanings): the server's
    # certificate chain and key (PEM), and the CA that consumers' certificates must
    # chain to (with require_certificate, every consumer must show one).
    certfile: str = ""
    keyfile: str = ""
    keypasswd: str = ""
    cafile: str = ""
    require_certificate: bool = False
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = "tlsv1.2"  # the lowest accepted
    ciphers: str = ""  # an OpenSSL cipher list (TLS 1.2); "" keeps OpenSSL's defaults
    hooks: list[str] = field(default_factory=lambda: list(HOOK_NAMES))
    payloads: Literal["full", "size", "none"] = "full"
    # sample.<hook>.<acl label> = percentage of those events relayed (Courier's sampling)
    sample: dict[str, dict[str, int]] = field(default_factory=dict)
    durability: Literal["none", "spool", "acknowledged"] = "none"
    spool_path: str = "./data/events"
    spool_max_events: int = 10_000_000
    memory_events: int = 1_000_000
    memory_bytes: int = 256 * 1024 * 1024
    batch_events: int = 2000  # events per EVENTS frame at most
    # Consumers whose commits let the log go: once each has committed, events before the
    # lowest of their positions are let go of (whole memory segments; the spool exactly).
    trim_committed: list[str] = field(default_factory=list)
    node_name: str = ""  # the broker's node_name unless set
    # Seconds without an event after which the relay appends a heartbeat (the broker's
    # clock): readers' event time moves on while the broker is quiet. 0: never.
    heartbeat_interval: float = 1.0
    sidecar: SidecarConfig = field(default_factory=SidecarConfig)


def check(config: RelayConfig) -> RelayConfig:
    """What single values cannot show; errors name the key."""
    for where, hooks in (
        ("event_relay.hooks", config.hooks),
        ("event_relay.sidecar.hooks", config.sidecar.hooks),
    ):
        for hook in hooks:
            if hook not in HOOK_NAMES:
                raise ConfigError(
                    f"{where}: {hook!r} is not an event hook ({', '.join(HOOK_NAMES)})"
                )
    for hook, rates in config.sample.items():
        if hook not in SAMPLED_HOOKS:
            raise ConfigError(
                f"event_relay.sample.{hook}: only {', '.join(SAMPLED_HOOKS)} are sampled"
            )
        for label, percentage in rates.items():
            if not 0 <= percentage <= 100:
                raise ConfigError(
                    f"event_relay.sample.{hook}.{label}: must be 0 to 100, got {percentage}"
                )
    for key in ("spool_max_events", "memory_events", "memory_bytes", "batch_events"):
        if getattr(config, key) < 1:
            raise ConfigError(f"event_relay.{key}: must be 1 or more, got {getattr(config, key)}")
    for key in ("pool_size", "backlog_size"):
        if getattr(config.sidecar, key) < 1:
            raise ConfigError(
                f"event_relay.sidecar.{key}: must be 1 or more, got {getattr(config.sidecar, key)}"
            )
    if not 0 < config.sidecar.port < 65536:
        raise ConfigError(
            f"event_relay.sidecar.port: must be 1 to 65535, got {config.sidecar.port}"
        )
    host_port(config.address, "event_relay.address")
    check_tls(config)
    return config


_TLS_KEYS = ("keypasswd", "cafile", "require_certificate", "tls_version", "ciphers")
_DEFAULTS = RelayConfig()


def check_tls(config: RelayConfig) -> None:
    """certfile and keyfile turn TLS on together; the other TLS keys need them."""
    if config.certfile or config.keyfile:
        for key in ("certfile", "keyfile"):
            if not getattr(config, key):
                other = "keyfile" if key == "certfile" else "certfile"
                raise ConfigError(f"event_relay.{key}: needed with {other} (TLS needs both)")
    else:
        for key in _TLS_KEYS:
            if getattr(config, key) != getattr(_DEFAULTS, key):
                raise ConfigError(
                    f"event_relay.{key}: a TLS setting, and TLS is off (set certfile and keyfile)"
                )
    if config.require_certificate and not config.cafile:
        raise ConfigError("event_relay.cafile: require_certificate needs the CA to check against")


def host_port(address: str, where: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ConfigError(f"{where}: expected 'host:port' (port 0 to 65535), got {address!r}")
    return host.strip("[]"), int(port)
