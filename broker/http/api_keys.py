"""API keys for the admin API, kept in `[http] api_keys_file` and managed with
`nautilus api-key add|list|delete`.

Only a SHA-256 of each key is stored (one JSON object per line: id, sha256, created), so
the file does not give the keys away; `add` prints the key once. The running broker reads
the file again whenever it changes (checked per request), so keys added or deleted from
the command line take effect without a restart.
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
from pathlib import Path
from typing import Any

MIN_LENGTH = 16  # a key given with --key must be at least this long
ALPHABET = string.ascii_letters + string.digits


class KeysFileError(ValueError):
    """The keys file is not what `nautilus api-key` writes."""


class ApiKeys:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of what was read
        self._entries: list[dict[str, Any]] = []

    def entries(self) -> list[dict[str, Any]]:
        """The keys' records (no key in them), read again if the file changed."""
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

    def _read(self) -> list[dict[str, Any]]:
        entries = []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not {"id", "sha256", "created"} <= set(entry):
                    raise ValueError
            except ValueError:
                raise KeysFileError(
                    f"{self.path}: line {number} is not a key record (as nautilus api-key "
                    "writes them); fix or delete the line"
                ) from None
            entries.append(entry)
        return entries

    def check(self, key: str) -> bool:
        digest = _digest(key)
        return any(hmac.compare_digest(digest, entry["sha256"]) for entry in self.entries())

    def add(self, key: str | None = None) -> str:
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
        entries = self.entries()
        if any(entry["sha256"] == _digest(key) for entry in entries):
            raise ValueError("that key is there already")
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._write([*entries, {"id": key[:6], "sha256": _digest(key), "created": created}])
        return key

    def delete(self, key_or_id: str) -> int:
        """Remove the key, or every key whose id (its first 6 characters) this is."""
        entries = self.entries()
        kept = [e for e in entries if e["id"] != key_or_id and e["sha256"] != _digest(key_or_id)]
        self._write(kept)
        return len(entries) - len(kept)

    def _write(self, entries: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(entry) + "\n" for entry in entries)
        os.replace(temporary, self.path)  # whole: the broker never reads half a file
        self._seen = None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def main(argv: list[str]) -> int:
    """`nautilus api-key add [--key K] | list | delete KEY_OR_ID` [--config F | --file F]."""
    parser = argparse.ArgumentParser(
        prog="nautilus api-key", description="Manage the admin API's keys."
    )
    parser.add_argument("action", choices=["add", "list", "delete"])
    parser.add_argument("key", nargs="?", help="delete: the key, or its id")
    parser.add_argument("--key", dest="new_key", help="add: this key instead of a new one")
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
            print(keys.add(args.new_key))
        except ValueError as exc:
            print(f"nautilus api-key: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.action == "list":
        for entry in keys.entries():
            print(f"{entry['id']}  created {entry['created']}")
        return 0
    if not args.key:
        parser.error("delete needs the key or its id")
    if keys.delete(args.key) == 0:
        print(f"nautilus api-key: no key {args.key!r}", file=sys.stderr)
        return 1
    return 0
