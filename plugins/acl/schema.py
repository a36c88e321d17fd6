"""The `[plugins.acl]` keys, their types and defaults (validated by broker.config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.config import Duration


@dataclass(slots=True)
class Config:
    # The ACL file (VerneMQ's vmq_acl.acl_file); read at start-up, a problem stops it.
    acl_file: str = "vmq.acl"
    # Seconds between checks of the file's modification time; 0 turns reloading off.
    acl_reload_interval: Duration = Duration(10)
    # Messages per second allowed per ACL label, across the node (Courier's
    # publish_rate_limit.<label>); e.g. { telemetry = 100 }.
    publish_rate_limits: dict[str, int] = field(default_factory=dict)
