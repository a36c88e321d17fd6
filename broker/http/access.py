"""Who may call what under /api/v1/: API key scopes, as VerneMQ's api-key scopes.

    read-only   the commands that only read (`session/show`, `show/settings`, `sessions`, ...)
    publish     /api/v1/publish only: a gateway's key, which cannot manage the broker
    admin       everything (a record written before scopes existed is an admin key)

A command is reading only if it says so: a level of its path is `show` or `status`
(vmq-admin's verbs for reading: `session/show`, `cluster/status`, `show/settings`), or it
is listed in READING. Any other command, a new one included, changes the broker and needs
an admin key, so a command added later is never open to a read-only key by omission.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

READ_ONLY, PUBLISH, ADMIN = "read-only", "publish", "admin"
SCOPES = (READ_ONLY, PUBLISH, ADMIN)
PUBLISH_COMMAND = "publish"
READING = frozenset({"sessions", "plugins", "session/client"})  # besides show and status
_SHOWING = frozenset({"show", "status"})  # a level of a command's path that says "reads"
_DOES = {READ_ONLY: "reads", PUBLISH: "publishes a message", ADMIN: "changes the broker"}


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int  # 401: no valid key; 403: a key whose scope does not reach the command
    error: str


def needed_scope(command: str) -> str:
    """The scope a key needs (besides admin, which has them all) to call `command`."""
    if command == PUBLISH_COMMAND:
        return PUBLISH
    if command in READING or not _SHOWING.isdisjoint(command.split("/")):
        return READ_ONLY
    return ADMIN


def refusal(
    key_id: str,
    scope: str,
    expires: datetime.datetime | None,
    command: str,
    now: datetime.datetime,
) -> Refusal | None:
    """Why the known key `key_id` may not call `command` now, or None if it may."""
    if expires is not None and expires <= now:
        when = expires.isoformat(timespec="seconds")
        return Refusal(
            401, f"API key {key_id} expired at {when}; make another with nautilus api-key add"
        )
    needed = needed_scope(command)
    if scope in (ADMIN, needed):
        return None
    what = _DOES[needed]
    scopes = ADMIN if needed == ADMIN else f"{needed} or {ADMIN}"
    return Refusal(
        403, f"{command} {what}: it needs scope {scopes}; API key {key_id} has scope {scope}"
    )
