"""The password file: one `username:hash` per line. Parsing, editing, atomic writing.

Pure apart from `load` and `write_atomic`. The format is VerneMQ's vmq.passwd plus two
conveniences: blank lines and lines starting with `#` are ignored. A username is every
character before the first `:` (so it cannot contain one) and is compared exactly, case
and spaces included. Line endings may be LF or CRLF; the file is UTF-8.

Editing works on lines, not on the parsed table, so every line a command does not touch
(comments, VerneMQ `$6$` users, even a broken line) is written back byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from plugins.passwd.hashes import Hash, HashError, parse_hash

Table = dict[str, Hash]


class PasswdFileError(ValueError):
    """A password file that cannot be used; the message is `FILE:LINE: what` or
    `FILE: what`."""


def check_username(username: str) -> str | None:
    """None if `username` can be stored in a password file, else why not."""
    if not username:
        return "the username is empty"
    if ":" in username:
        return "a username cannot contain ':'"
    if "\n" in username or "\r" in username:
        return "a username cannot contain a line break"
    if username.startswith("#"):
        return "a username cannot start with '#' (a comment in the password file)"
    return None


def parse(text: str, path: str = "<passwd>") -> Table:
    """The users of a password file; raises PasswdFileError at the first bad line."""
    table: Table = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        username, colon, hashed = line.partition(":")
        if not colon:
            raise PasswdFileError(f"{path}:{number}: expected username:hash")
        if not username:
            raise PasswdFileError(f"{path}:{number}: empty username")
        if username in table:
            raise PasswdFileError(f"{path}:{number}: user {username!r} is listed twice")
        try:
            table[username] = parse_hash(hashed.strip())
        except HashError as exc:
            raise PasswdFileError(f"{path}:{number}: user {username!r}: {exc}") from None
    return table


def read_text(path: str | Path) -> str:
    """The file's text with its line endings as they are (no newline translation)."""
    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PasswdFileError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise PasswdFileError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise PasswdFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load(path: str | Path) -> Table:
    """Read and parse the file at `path`; raises PasswdFileError."""
    return parse(read_text(path), str(path))


# -- editing ------------------------------------------------------------------------------


def _owner(line: str) -> str | None:
    if line.startswith("#") or ":" not in line:
        return None
    return line.partition(":")[0]


def set_user(text: str, username: str, hashed: str) -> str:
    """`text` with `username`'s line replaced (where it was) or appended."""
    lines = text.splitlines(keepends=True)
    entry = f"{username}:{hashed}"
    for i, line in enumerate(lines):
        if _owner(line) == username:
            ending = line[len(line.rstrip("\r\n")) :] or "\n"
            lines[i] = entry + ending
            # A duplicate further down (hand-edited file) would win nowhere: drop it.
            lines[i + 1 :] = [other for other in lines[i + 1 :] if _owner(other) != username]
            return "".join(lines)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.append(entry + "\n")
    return "".join(lines)


def delete_user(text: str, username: str) -> tuple[str, bool]:
    """`text` without `username`'s line(s), and whether there was one."""
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if _owner(line) != username]
    return "".join(kept), len(kept) != len(lines)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace the file at `path` with `text` in one step (temp file, fsync, os.replace).

    A reader (the broker's reloader) sees the old file or the new one, never half of it.
    The new file keeps the old one's permission bits; a new file is private (0600)."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o600
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
