"""A real broker with `[broker] allow_anonymous = false` and the passwd plugin, real
clients (paho-mqtt; raw sockets where the exact MQTT 3 CONNACK byte matters).

Reloads are awaited on the plugin's own log line (a handler sets an Event), never on a
sleep; the reload interval is 1 s.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading

import pytest

from plugins.passwd.hashes import make_hash
from plugins.passwd.passwd_file import set_user, write_atomic
from tests.broker.helpers import V5, V311, VERSIONS, PahoClient, RawClient, unique_id

# MQTT 3.1.1 CONNACK return codes and MQTT 5 reason codes.
BAD_USERNAME_OR_PASSWORD_V3, NOT_AUTHORIZED_V3 = 4, 5
BAD_USERNAME_OR_PASSWORD, NOT_AUTHORIZED = 0x86, 0x87
# paho reports an MQTT 3 CONNACK code as the matching MQTT 5 reason code (4 -> 0x86,
# 5 -> 0x87), so the paho tests expect 0x86 / 0x87 for both versions; the exact MQTT 3
# bytes are checked with a raw socket below.
RELOAD_TIMEOUT = 5.0  # interval 1 s, plus a coarse file-system clock

SALT = b"vernemq-salt"
VMQ_HASH = (
    f"$6${base64.b64encode(SALT).decode()}$"
    f"{base64.b64encode(hashlib.sha512(b'from-vernemq' + SALT).digest()).decode()}"
)


@pytest.fixture
def login():
    """login(server, version, username, password, expect_code=0) -> the connected client."""
    made: list[PahoClient] = []

    def connect(server, version, username, password, expect_code=0):
        client = PahoClient(server.host, server.port, version)
        made.append(client)
        client.connect(expect_code=expect_code, username=username, password=password)
        return client

    yield connect
    for client in made:
        client.close()


class ReloadEvents(logging.Handler):
    """Sets an Event for each kind of line the reloader logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reloaded = threading.Event()
        self.failed = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.failed.set()
        elif record.getMessage().startswith("passwd: reloaded"):
            self.reloaded.set()


@pytest.fixture
def reload_events():
    logger = logging.getLogger("nautilus.plugins.passwd")
    handler, level = ReloadEvents(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def passwd_path(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(
        f"# test users\nalice:{make_hash(b'wonderland')}\nlegacy:{VMQ_HASH}\n", encoding="utf-8"
    )
    return path


@pytest.fixture
def server(start_broker, passwd_path):
    return start_broker(
        broker={"allow_anonymous": False},
        plugins={
            "passwd": {
                "enabled": True,
                "password_file": str(passwd_path),
                "password_reload_interval": 1,
            }
        },
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_right_password_connects_and_works(server, login, version):
    client = login(server, version, "alice", "wonderland")
    assert client.subscribe("passwd/t", 1) == [1]
    client.publish("passwd/t", b"hello", qos=1)
    assert client.expect_message().payload == b"hello"


@pytest.mark.parametrize("version", VERSIONS)
def test_vernemq_hash_connects(server, login, version):
    login(server, version, "legacy", "from-vernemq")


@pytest.mark.parametrize("version", VERSIONS)
def test_wrong_password_is_bad_username_or_password(server, login, version):
    login(server, version, "alice", "Wonderland", expect_code=BAD_USERNAME_OR_PASSWORD)
    login(server, version, "legacy", "wonderland", expect_code=BAD_USERNAME_OR_PASSWORD)


@pytest.mark.parametrize("version", VERSIONS)
def test_unknown_user_exhausts_the_chain(server, login, version):
    login(server, version, "mallory", "wonderland", expect_code=NOT_AUTHORIZED)
    login(server, version, None, None, expect_code=NOT_AUTHORIZED)


@pytest.mark.parametrize(
    ("username", "password", "code"),
    [
        ("alice", b"wonderland", 0),
        ("alice", b"nope", BAD_USERNAME_OR_PASSWORD_V3),
        ("mallory", b"wonderland", NOT_AUTHORIZED_V3),
        ("alice", None, NOT_AUTHORIZED_V3),  # username without password: NEXT
    ],
)
def test_mqtt311_connack_bytes(server, username, password, code):
    raw = RawClient(server.host, server.port, V311)
    try:
        connack = raw.connect(unique_id(), username=username, password=password, expect_code=None)
        assert connack.body == bytes([0, code])
    finally:
        raw.close()


def test_reload_picks_up_a_new_user(server, login, passwd_path, reload_events):
    login(server, V311, "bob", "builder", expect_code=NOT_AUTHORIZED)
    text = passwd_path.read_text(encoding="utf-8")
    write_atomic(passwd_path, set_user(text, "bob", make_hash(b"builder")))
    assert reload_events.reloaded.wait(RELOAD_TIMEOUT), "the file was not reloaded"
    login(server, V311, "bob", "builder")
    login(server, V5, "alice", "wonderland")  # the others are still there


def test_broken_file_keeps_the_users_until_fixed(server, login, passwd_path, reload_events):
    good = passwd_path.read_text(encoding="utf-8")
    write_atomic(passwd_path, good + "broken line without a hash\n")
    assert reload_events.failed.wait(RELOAD_TIMEOUT), "the broken file was not noticed"
    login(server, V311, "alice", "wonderland")
    write_atomic(passwd_path, set_user(good, "alice", make_hash(b"changed")))
    assert reload_events.reloaded.wait(RELOAD_TIMEOUT), "the fixed file was not reloaded"
    login(server, V311, "alice", "wonderland", expect_code=BAD_USERNAME_OR_PASSWORD)
    login(server, V5, "alice", "changed")


@pytest.mark.parametrize(
    ("version", "seen"),
    [
        (V311, "CONNACK 4 (bad username or password)"),
        (V5, "CONNACK 0x86 (bad user name or password)"),
    ],
)
def test_a_refusal_is_logged_once_with_the_code_the_client_saw(
    server, login, caplog, version, seen
):
    caplog.set_level(logging.INFO, logger="nautilus.connection")
    login(server, version, "alice", "Wonderland", expect_code=BAD_USERNAME_OR_PASSWORD)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert refusals[0].endswith(f"connection refused: invalid_credentials, {seen}")
