"""Passwords the broker checks itself: bcrypt hashes (`$2a$`, `$2b$` and `$2y$`, which
VerneMQ refused: its issue 1435). The other methods are the database's (server-side
hashing, as VerneMQ's scripts do): the query compares, and only matching rows come back.

bcrypt costs milliseconds of CPU by design: it runs in a thread (the bcrypt library
releases the GIL), never on the event loop. Its comparison is constant-time.
"""

from __future__ import annotations

import bcrypt

_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


def bcrypt_matches(password: bytes, stored: str | bytes | None) -> bool:
    """Whether `password` is the one `stored` (a bcrypt hash) was made from; False for a
    hash that is not bcrypt (a row made for another method)."""
    if stored is None:
        return False
    hashed = stored.encode() if isinstance(stored, str) else stored
    if not hashed.startswith(_PREFIXES):
        return False
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a malformed hash: no match, not a crash
        return False
