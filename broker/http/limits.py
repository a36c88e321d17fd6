"""HTTP's share of the process's file descriptors: at most half of them (RLIMIT_NOFILE),
so that its clients, anyone who reaches the port, cannot starve the MQTT listeners
(`check_http_reserve`); and what that leaves MQTT, said at start-up (`describe_reserve`).
(Running out of descriptors altogether: broker/descriptors.py.)
"""

from __future__ import annotations

import logging

from broker.config import Config, ConfigError
from broker.descriptors import nofile_limit

HTTP_SHARE = 2  # HTTP may hold at most 1/HTTP_SHARE of the descriptors: the rest is MQTT's


def check_http_reserve(config: Config) -> None:
    """ConfigError unless `[http] max_connections` is at most half of RLIMIT_NOFILE."""
    limit = nofile_limit()
    cap = config.http.max_connections
    if limit is not None and cap > limit // HTTP_SHARE:
        raise ConfigError(
            f"http.max_connections: {cap} would let HTTP clients take the file descriptors "
            f"MQTT needs: at most {limit // HTTP_SHARE}, half of the process's {limit} "
            "(RLIMIT_NOFILE; raise it with ulimit -n or systemd's LimitNOFILE)"
        )


def describe_reserve(config: Config) -> tuple[int, str]:
    """The start-up line on what HTTP leaves the MQTT listeners of the file descriptors,
    and its level: a warning when their max_connections add up to more than that (past
    it new connections are refused for want of descriptors, before any cap)."""
    limit = nofile_limit()
    http = config.http.max_connections
    caps = [listener.max_connections for listener in config.listeners]
    mqtt = "no limit" if 0 in caps else f"{sum(caps)} in all"
    if limit is None:
        return logging.INFO, f"http: at most {http} connections; RLIMIT_NOFILE: unlimited"
    line = (
        f"http: at most {http} connections, of the process's {limit} file descriptors "
        f"(RLIMIT_NOFILE): MQTT listeners keep {limit - http} (max_connections: {mqtt})"
    )
    if 0 in caps or sum(caps) > limit - http:
        return logging.WARNING, (
            f"{line}; past that, new MQTT connections are refused for want of descriptors "
            "before max_connections: raise RLIMIT_NOFILE (ulimit -n, systemd's "
            "LimitNOFILE) or lower max_connections"
        )
    return logging.INFO, line
