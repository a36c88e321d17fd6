"""`nautilus passwd`: add, change or delete a user in a password file (like vmq-passwd).

    nautilus passwd FILE USER        add USER or change their password
    nautilus passwd -c FILE USER     create FILE (replacing it) with USER alone
    nautilus passwd -D FILE USER     delete USER

The password is asked twice on a terminal; otherwise one line is read from standard
input (`echo secret | nautilus passwd FILE USER`), without its line ending. The file is
rewritten atomically and every other line is kept as it was. Exit status: 0 done,
1 refused (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import IO

from plugins.passwd.hashes import make_hash
from plugins.passwd.passwd_file import (
    PasswdFileError,
    check_username,
    delete_user,
    read_text,
    set_user,
    write_atomic,
)

PROG = "nautilus passwd"


class CliError(Exception):
    """A refusal; the message is printed after `nautilus passwd: `."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Add, change or delete a user in a Nautilus (or VerneMQ) password file.",
        epilog="New passwords are stored as salted scrypt hashes; VerneMQ $6$ lines are kept "
        "as they are. See docs/plugins/passwd.md.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "-c", dest="create", action="store_true", help="create FILE, replacing any existing one"
    )
    mode.add_argument("-D", dest="delete", action="store_true", help="delete USER from FILE")
    parser.add_argument("file", metavar="FILE", help="the password file")
    parser.add_argument("user", metavar="USER", help="the username (no ':')")
    return parser.parse_args(argv)


def read_password(stdin: IO[str] | None = None) -> bytes:
    """Twice with getpass on a terminal, else one line of standard input (as bytes)."""
    stdin = sys.stdin if stdin is None else stdin
    if stdin is None:
        raise CliError("no standard input to read the password from")
    if stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Reenter password: ") != first:
            raise CliError("the passwords do not match")
        password = first.encode("utf-8")
    else:
        raw = getattr(stdin, "buffer", None)
        line = raw.readline() if raw is not None else stdin.readline().encode("utf-8")
        if not line:
            raise CliError("no password on standard input")
        password = line.removesuffix(b"\n").removesuffix(b"\r")
    if not password:
        raise CliError("the password is empty")
    return password


def run(args: argparse.Namespace) -> None:
    problem = check_username(args.user)
    if problem:
        raise CliError(problem)
    if args.create:
        text = ""
    else:
        if not os.path.exists(args.file):
            raise CliError(f"{args.file}: no such file (use -c to create it)")
        try:
            text = read_text(args.file)
        except PasswdFileError as exc:
            raise CliError(str(exc)) from None
    if args.delete:
        text, found = delete_user(text, args.user)
        if not found:
            raise CliError(f"{args.file}: no user {args.user!r}")
    else:
        text = set_user(text, args.user, make_hash(read_password()))
    try:
        write_atomic(args.file, text)
    except OSError as exc:
        raise CliError(f"{args.file}: cannot write: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except CliError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
