"""API keys for the admin API, kept in `[http] api_keys_file` and managed with
`nautilus api-key add|list|delete`.

Only a SHA-256 of each key is stored (one JSON object per line: id, sha256, created, and
scope and expires when given), so the file does not give the keys away; `add` prints the
key once. A record without a scope is an admin key and one without `expires` never
expires: files written before scopes existed keep working as they did. The running
broker reads the file again whenever it changes (checked per request), so keys added or
deleted from the command line take effect without a restart.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
import os
import secrets
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.http.access import ADMIN, SCOPES

MIN_LENGTH = 16  # a key given with --key must be at least this long
ALPHABET = string.ascii_letters + string.digits


class KeysFileError(ValueError):
    """The keys file is not what `nautilus api-key` writes."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key's record (no key in it)."""

    id: str  # the key's first 6 characters
    sha256: str
    created: str
    scope: str = ADMIN
    expires: datetime.datetime | None = None

    def record(self) -> dict[str, Any]:
        """The JSON object of its line (scope and expires only when they say something,
        so that a plain key's line is what it always was)."""
        record: dict[str, Any] = {"id": self.id, "sha256": self.sha256, "created": self.created}
        if self.scope != ADMIN:
            record["scope"] = self.scope
        if self.expires is not None:
            record["expires"] = self.expires.isoformat(timespec="seconds")
        return record


class ApiKeys:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of what was read
        self._entries: list[ApiKey] = []

    def entries(self) -> list[ApiKey]:
        """The keys' records, read again if the file changed."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._seen, self._entries = None, []
            return []
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._entries = self._read()
            self._seen = seen
        return self._entries

    def _read(self) -> list[ApiKey]:
        entries = []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entries.append(_parse(line))
            except ValueError:
                raise KeysFileError(
                    f"{self.path}: line {number} is not a key record (as nautilus api-key "
                    "writes them); fix or delete the line"
                ) from None
        return entries

    def find(self, key: str) -> ApiKey | None:
        """The record of `key`, or None (expired or not: the caller says which)."""
        digest = _digest(key)
        for entry in self.entries():
            if hmac.compare_digest(digest, entry.sha256):
                return entry
        return None

    def add(
        self,
        key: str | None = None,
        scope: str = ADMIN,
        expires: datetime.datetime | None = None,
    ) -> str:
        """Keep a new key (made here unless given) and return it."""
        if key is None:
            # Letters and digits only: a key never looks like an option ("-...") to a shell.
            key = "".join(secrets.choice(ALPHABET) for _ in range(32))
        elif len(key) < MIN_LENGTH:
            raise ValueError(f"an API key needs at least {MIN_LENGTH} characters")
        elif key.startswith("-"):
            raise ValueError(
                "an API key may not start with '-' (commands would take it for an option)"
            )
        if scope not in SCOPES:
            raise ValueError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
        entries = self.entries()
        if any(entry.sha256 == _digest(key) for entry in entries):
            raise ValueError("that key is there already")
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._write([*entries, ApiKey(key[:6], _digest(key), created, scope, expires)])
        return key

    def delete(self, key_or_id: str) -> int:
        """Remove the key, or every key whose id (its first 6 characters) this is."""
        entries = self.entries()
        kept = [e for e in entries if e.id != key_or_id and e.sha256 != _digest(key_or_id)]
        self._write(kept)
        return len(entries) - len(kept)

    def _write(self, entries: list[ApiKey]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(entry.record()) + "\n" for entry in entries)
        os.replace(temporary, self.path)  # whole: the broker never reads half a file
        self._seen = None


def _parse(line: str) -> ApiKey:
    """A line's record; ValueError if it is not one."""
    entry = json.loads(line)
    if not isinstance(entry, dict) or not {"id", "sha256", "created"} <= set(entry):
        raise ValueError
    scope = entry.get("scope", ADMIN)
    if scope not in SCOPES:
        raise ValueError
    expires = entry.get("expires")
    if expires is not None and not isinstance(expires, str):
        raise ValueError
    return ApiKey(
        entry["id"],
        entry["sha256"],
        entry["created"],
        scope,
        None if expires is None else _aware(datetime.datetime.fromisoformat(expires)),
    )


def _aware(moment: datetime.datetime) -> datetime.datetime:
    """A time without a zone is UTC's (the keys file and --expires-at alike)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def main(argv: list[str]) -> int:
    """`nautilus api-key add [--key K] [--scope S] [--expires-in D | --expires-at T] | list |
    delete KEY_OR_ID` [--config F | --file F]."""
    parser = argparse.ArgumentParser(
        prog="nautilus api-key", description="Manage the admin API's keys."
    )
    parser.add_argument("action", choices=["add", "list", "delete"])
    parser.add_argument("key", nargs="?", help="delete: the key, or its id")
    parser.add_argument("--key", dest="new_key", help="add: this key instead of a new one")
    parser.add_argument(
        "--scope", choices=SCOPES, default=ADMIN, help="add: what the key may call (admin)"
    )
    expiry = parser.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", metavar="DURATION", help="add: e.g. 90d, 12h, 3600")
    expiry.add_argument("--expires-at", metavar="TIME", help="add: ISO 8601, UTC unless given")
    parser.add_argument("--config", metavar="FILE", help="the broker's config (its [http] table)")
    parser.add_argument("--file", help="the keys file (default: the config's api_keys_file)")
    args = parser.parse_args(argv)
    from broker.config import ConfigError, load_config

    if args.file is None:
        try:
            args.file = load_config(args.config).http.api_keys_file
        except ConfigError as exc:
            print(f"nautilus api-key: {exc}", file=sys.stderr)
            return 2
    try:
        return _act(parser, args, ApiKeys(args.file))
    except KeysFileError as exc:
        print(f"nautilus api-key: {exc}", file=sys.stderr)
        return 1


def _act(parser: argparse.ArgumentParser, args: argparse.Namespace, keys: ApiKeys) -> int:
    if args.action == "add":
        try:
            print(keys.add(args.new_key, args.scope, _expiry(args)))
        except ValueError as exc:
            print(f"nautilus api-key: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.action == "list":
        now = datetime.datetime.now(datetime.UTC)
        for entry in keys.entries():
            print(_listed(entry, now))
        return 0
    if not args.key:
        parser.error("delete needs the key or its id")
    if keys.delete(args.key) == 0:
        print(f"nautilus api-key: no key {args.key!r}", file=sys.stderr)
        return 1
    return 0


def _expiry(args: argparse.Namespace) -> datetime.datetime | None:
    """When a key being added expires (--expires-in, --expires-at), or None: never.
    ValueError, naming the option, for a bad value or a time already past."""
    from broker.config import _duration  # the config's durations: 30s, 12h, 90d, 2w

    now = datetime.datetime.now(datetime.UTC)
    if args.expires_in is not None:
        seconds = _duration(args.expires_in, "--expires-in")  # ConfigError is a ValueError
        if not seconds:
            raise ValueError("--expires-in: must be more than 0")
        return now + datetime.timedelta(seconds=seconds)
    if args.expires_at is None:
        return None
    try:
        moment = _aware(datetime.datetime.fromisoformat(args.expires_at))
    except ValueError:
        raise ValueError(
            f"--expires-at: expected an ISO 8601 time such as 2027-01-31T12:00:00+00:00, "
            f"got {args.expires_at!r}"
        ) from None
    if moment <= now:
        raise ValueError(f"--expires-at: {args.expires_at} has passed already")
    return moment


def _listed(entry: ApiKey, now: datetime.datetime) -> str:
    """A `list` line: id, scope, created, expiry."""
    if entry.expires is None:
        expiry = "never expires"
    else:
        when = entry.expires.isoformat(timespec="seconds")
        expiry = f"expired {when}" if entry.expires <= now else f"expires {when}"
    return f"{entry.id}  {entry.scope:<9}  created {entry.created}  {expiry}"
