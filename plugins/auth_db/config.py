"""`[plugins.auth_db]`: which database, how to reach it, how passwords are checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker.config import ConfigError, Duration

# VerneMQ's defaults (vmq_diversity): its users, databases and hash methods.
DEFAULT_URLS = {
    "postgres": "postgresql://root:password@localhost:5432/vernemq_db",
    "mysql": "mysql://root:password@localhost:3306/vernemq_db",
    "redis": "redis://localhost:6379/0",
}
DEFAULT_HASHES = {"postgres": "crypt", "mysql": "password", "redis": "bcrypt"}
QUERY_NAMES = ("auth_on_register", "acls")
# Compared by the database (server side), or by the broker (bcrypt).
HASHES = {
    "postgres": ("crypt", "bcrypt"),
    "mysql": ("password", "md5", "sha1", "sha256", "bcrypt"),
    "redis": ("bcrypt",),
}


@dataclass(slots=True)
class AuthDbConfig:
    backend: Literal["postgres", "mysql", "redis"] = "postgres"
    url: str = ""  # "": the backend's VerneMQ default (DEFAULT_URLS)
    pool_size: int = 5
    password_hash: str = ""  # "": the backend's VerneMQ default (DEFAULT_HASHES)
    # How long a CONNECT waits for the database before it is refused (server unavailable).
    query_timeout: Duration = Duration(5)
    # Re-read a connected client's ACLs this often; 0: only when it connects (and when
    # `nautilus admin auth invalidate` says so).
    cache_ttl: Duration = Duration(0)
    # SQL of your own for a schema that differs (docs/plugins/auth_db.md): auth_on_register
    # (the rows of a CONNECT), acls (one row again, to re-read its ACLs).
    query: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.url = self.url or DEFAULT_URLS[self.backend]
        self.password_hash = self.password_hash or DEFAULT_HASHES[self.backend]
        if self.password_hash not in HASHES[self.backend]:
            raise ConfigError(
                f"plugins.auth_db.password_hash: {self.password_hash!r} is not one of "
                f"{', '.join(HASHES[self.backend])} (backend {self.backend})"
            )
        if self.pool_size < 1:
            raise ConfigError(f"plugins.auth_db.pool_size: must be 1 or more, got {self.pool_size}")
        if self.query_timeout <= 0:
            raise ConfigError("plugins.auth_db.query_timeout: must be more than 0 seconds")
        for name in self.query:
            if self.backend == "redis":
                raise ConfigError("plugins.auth_db.query: not for the redis backend (no SQL)")
            if name not in QUERY_NAMES:
                raise ConfigError(
                    f"plugins.auth_db.query.{name}: unknown (known: {', '.join(QUERY_NAMES)})"
                )
