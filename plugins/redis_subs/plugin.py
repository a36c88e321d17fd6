"""The redis_subs plugin: the cluster's metadata backend in Redis (Courier's way).

It has no hooks: the broker's cluster (broker/cluster/) asks it for its backend when
`[cluster] metadata = "redis"`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.config import ConfigError, host_port
from plugins.redis_subs.store import RedisStore


@dataclass(slots=True)
class RedisSubsConfig:
    url: str = "redis://127.0.0.1:6379/0"
    # Sentinel instead of `url`: "host:port" of each sentinel, and the master's name.
    sentinel_endpoints: list[str] = field(default_factory=list)
    sentinel_master: str = "mymaster"
    database: int = 0  # with Sentinel (a url names its own)
    username: str = ""
    password: str = ""
    key_prefix: str = "nautilus:"  # several clusters can share one Redis
    connect_timeout: float = 2.0


class RedisSubs:
    Config = RedisSubsConfig
    metadata = "redis"  # the [cluster] metadata name this plugin serves

    def __init__(self, config: RedisSubsConfig) -> None:
        self.config = config
        if not config.url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(
                f"plugins.redis_subs.url: expected redis://, rediss:// or unix://, "
                f"got {config.url!r}"
            )
        self.sentinels: list[tuple[str, int]] = []
        for index, endpoint in enumerate(config.sentinel_endpoints):
            try:
                self.sentinels.append(host_port(endpoint))
            except ValueError:
                raise ConfigError(
                    f"plugins.redis_subs.sentinel_endpoints[{index}]: expected 'host:port', "
                    f"got {endpoint!r}"
                ) from None

    def metadata_backend(self, dead_after: float) -> RedisStore:
        """A new connection to the cluster's Redis, for the node's cluster to open."""
        c = self.config
        return RedisStore(
            c.url,
            prefix=c.key_prefix,
            sentinels=self.sentinels or None,
            sentinel_master=c.sentinel_master,
            database=c.database,
            username=c.username or None,
            password=c.password or None,
            timeout=c.connect_timeout,
            dead_after=dead_after,
        )
