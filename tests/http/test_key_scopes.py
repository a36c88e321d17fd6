"""API key scopes and expiry (VerneMQ's api-key scopes): a read-only key reads, a publish
key publishes, an admin key (and every record written before scopes) does everything; an
expired key is refused with 401 saying so. Real broker, real HTTP; `nautilus api-key` run
in this process (its own file handling is tested as a subprocess in test_commands.py)."""

from __future__ import annotations

import datetime
import json

import pytest

from broker.http import api_keys
from broker.http.access import ADMIN, PUBLISH, READ_ONLY, needed_scope
from broker.http.api_keys import ApiKeys

from .conftest import api, error, table


def now() -> datetime.datetime:
    """Read when the test runs (not at import: the suite takes minutes to get there)."""
    return datetime.datetime.now(datetime.UTC)


READING = [
    "session/show",
    "sessions",
    "retain/show",
    "metrics/show",
    "plugin/show",
    "plugins",
    "cluster/show",
    "cluster/status",
    "bridge/show",
]
CHANGING = [
    "session/disconnect",
    "retain/delete",
    "retain/delete-expired",
    "metrics/reset",
    "plugin/enable",
    "plugin/disable",
    "auth/invalidate",
    "cluster/join",
    "cluster/leave",
    "bridge/start",
    "bridge/stop",
]


def test_each_command_needs_the_scope_of_what_it_does():
    assert {needed_scope(c) for c in READING} == {READ_ONLY}
    assert {needed_scope(c) for c in CHANGING} == {ADMIN}
    assert needed_scope("session/client") == READ_ONLY
    assert needed_scope("publish") == PUBLISH
    assert needed_scope("show/settings") == READ_ONLY  # vmq-admin's `show settings`
    assert needed_scope("some/new-command") == ADMIN  # not open to read-only by omission


def test_a_keys_file_written_before_scopes_loads_as_admin_keys(keyed_broker, keys_file):
    server, _ = keyed_broker()
    old_key = "an-old-key-from-before-scopes"
    digest = api_keys._digest(old_key)
    with keys_file.open("a", encoding="utf-8") as out:  # a line as the old version wrote it
        out.write(json.dumps({"id": old_key[:6], "sha256": digest, "created": "2026-01-02"}))
    (entry,) = [e for e in ApiKeys(str(keys_file)).entries() if e.sha256 == digest]
    assert (entry.scope, entry.expires) == (ADMIN, None)
    assert table(api(server, "metrics/reset", old_key, method="POST"))


def test_a_read_only_key_reads_and_is_refused_what_changes(keyed_broker, keys_file):
    server, admin_key = keyed_broker()
    reader = ApiKeys(str(keys_file)).add(scope=READ_ONLY)
    for command in READING:  # let in (cluster/show: 404, not in a cluster)
        assert api(server, command, reader).status in (200, 404), command
    refused = error(api(server, "metrics/reset", reader, method="POST"), 403)
    assert refused == (
        f"metrics/reset changes the broker: it needs scope admin; "
        f"API key {reader[:6]} has scope read-only"
    )
    for command in CHANGING:
        assert api(server, command, reader, method="POST").status == 403, command
    published = error(api(server, "publish", reader, method="POST", topic="a"), 403)
    assert "it needs scope publish or admin" in published
    assert table(api(server, "metrics/reset", admin_key, method="POST"))


def test_a_publish_key_publishes_and_reads_nothing(keyed_broker, keys_file):
    server, _ = keyed_broker()
    gateway = ApiKeys(str(keys_file)).add(scope=PUBLISH)
    assert table(api(server, "publish", gateway, method="POST", topic="a/b"))
    refused = error(api(server, "sessions", gateway), 403)
    assert refused.startswith("sessions reads: it needs scope read-only or admin")


def test_an_expired_key_is_refused_with_401_saying_so(keyed_broker, keys_file):
    server, _ = keyed_broker()
    keys = ApiKeys(str(keys_file))
    past = now().replace(microsecond=0) - datetime.timedelta(minutes=1)
    expired = keys.add(expires=past)
    later = keys.add(scope=READ_ONLY, expires=now() + datetime.timedelta(days=1))
    reply = api(server, "sessions", expired)
    message = error(reply, 401)
    assert message == (
        f"API key {expired[:6]} expired at {past.isoformat()}; "
        "make another with nautilus api-key add"
    )
    assert reply.headers["WWW-Authenticate"] == 'Basic realm="nautilus"'
    assert table(api(server, "sessions", later)) == []


def test_a_record_with_a_scope_not_known_fails_closed(keys_file):
    keys_file.parent.mkdir(parents=True)
    keys_file.write_text('{"id": "x", "sha256": "y", "created": "z", "scope": "root"}\n')
    with pytest.raises(api_keys.KeysFileError, match="line 1 is not a key record"):
        ApiKeys(str(keys_file)).entries()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = api_keys.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_api_key_add_with_scope_and_expiry_and_list(capsys, keys_file):
    file = ("--file", str(keys_file))
    added_at = now()
    code, key, _ = run(capsys, "add", "--scope", "read-only", "--expires-in", "30d", *file)
    assert code == 0
    code, chosen, _ = run(capsys, "add", "--key", "k" * 16, "--expires-at", "2099-01-31", *file)
    assert (code, chosen) == (0, "k" * 16 + "\n")
    assert run(capsys, "add", *file)[0] == 0  # admin, never expires: as before
    code, listed, _ = run(capsys, "list", *file)
    lines = listed.splitlines()
    assert [line.split()[:2] for line in lines] == [
        [key[:6], "read-only"],
        ["kkkkkk", "admin"],
        [lines[2].split()[0], "admin"],
    ]
    expires = datetime.datetime.fromisoformat(lines[0].split("expires ")[1])
    assert abs(expires - added_at - datetime.timedelta(days=30)) < datetime.timedelta(minutes=1)
    assert lines[1].endswith("expires 2099-01-31T00:00:00+00:00")  # no zone given: UTC
    assert lines[2].endswith("never expires")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--expires-in", "soon", "--expires-in: expected seconds or a duration"),
        ("--expires-in", "0", "--expires-in: must be more than 0"),
        ("--expires-at", "2020-01-01T00:00:00Z", "--expires-at: 2020-01-01T00:00:00Z has passed"),
        ("--expires-at", "next week", "--expires-at: expected an ISO 8601 time"),
    ],
)
def test_api_key_add_refuses_an_expiry_it_cannot_use(capsys, keys_file, option, value, says):
    code, out, err = run(capsys, "add", option, value, "--file", str(keys_file))
    assert (code, out) == (2, "")
    assert err.startswith(f"nautilus api-key: {says}")
    assert not keys_file.exists()
