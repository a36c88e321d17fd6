"""plugins/redis_subs: the cluster's subscription store in Redis (Courier's way).

    [cluster]
    node_name = "a"
    address = "127.0.0.1:44053"
    metadata = "redis"

    [plugins.redis_subs]
    enabled = true
    url = "redis://127.0.0.1:6379/0"

See docs/clustering.md.
"""

from plugins.redis_subs.plugin import RedisSubs, RedisSubsConfig

PLUGIN = RedisSubs
Config = RedisSubsConfig

__all__ = ["PLUGIN", "Config", "RedisSubs", "RedisSubsConfig"]
