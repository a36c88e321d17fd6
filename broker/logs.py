"""Where the broker's log goes (`[log]`): the console, a file rotated by size, syslog;
as text lines or JSON lines (one object per record, for log shippers).

Connection-level problems (refused logins, protocol errors, clients dropped for keepalive)
are logged at INFO, one line each, so that a production broker can run at `info`; the
per-packet detail is DEBUG. A line that can come thousands of times a second (every
CONNECT refused while Redis is away) is an episode instead (broker/episodes.py): the first
in full, then a count per interval.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os

from broker.config import ConfigError, LogSettings, host_port

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """{"time": ISO 8601 UTC, "level", "logger", "message"[, "exception"]} per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(settings: LogSettings) -> None:
    """Replace the root logger's handlers with those `settings` name (ConfigError, naming
    the key, for a file or syslog address that cannot be used)."""
    handlers: list[logging.Handler] = []
    if settings.console:
        handlers.append(logging.StreamHandler())
    if settings.file:
        try:
            handlers.append(
                logging.handlers.RotatingFileHandler(
                    settings.file,
                    maxBytes=settings.file_max_bytes,
                    backupCount=settings.file_backups,
                    encoding="utf-8",
                )
            )
        except OSError as exc:
            raise ConfigError(f"log.file: cannot write {settings.file}: {exc.strerror}") from None
    if settings.syslog:
        handlers.append(_syslog(settings.syslog))
    formatter = JsonLines() if settings.format == "json" else logging.Formatter(TEXT)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(settings.level.upper())


def _syslog(address: str) -> logging.Handler:
    if address.startswith("/"):
        # The handler itself would wait silently for a socket that is not there.
        if not os.path.exists(address):
            raise ConfigError(f"log.syslog: cannot use {address}: no such socket")
        try:
            return logging.handlers.SysLogHandler(address=address)
        except OSError as exc:
            raise ConfigError(f"log.syslog: cannot use {address}: {exc.strerror}") from None
    try:
        return logging.handlers.SysLogHandler(address=host_port(address))  # UDP
    except ValueError:
        raise ConfigError(
            f"log.syslog: expected a socket path such as /dev/log or host:port, got {address!r}"
        ) from None
