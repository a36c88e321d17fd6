"""The password file: parsing (errors name file and line), line-preserving edits, atomic
writes."""

from __future__ import annotations

import base64
import hashlib
import os
import stat

import pytest

from plugins.passwd.hashes import ScryptHash, Sha512Hash, make_hash
from plugins.passwd.passwd_file import (
    PasswdFileError,
    check_username,
    delete_user,
    load,
    parse,
    set_user,
    write_atomic,
)

SALT = b"0123456789ab"
VMQ = (
    f"$6${base64.b64encode(SALT).decode()}$"
    f"{base64.b64encode(hashlib.sha512(b'old' + SALT).digest()).decode()}"
)
SCRYPT = make_hash(b"new", n=1024)


def test_parse_both_schemes_comments_blank_lines_crlf():
    text = f"# users\n\nvmq:{VMQ}\r\nmodern:{SCRYPT}  \n   \nwith space:{VMQ}"
    table = parse(text)
    assert set(table) == {"vmq", "modern", "with space"}
    assert isinstance(table["vmq"], Sha512Hash)
    assert isinstance(table["modern"], ScryptHash)
    assert table["vmq"].verify(b"old")
    assert table["modern"].verify(b"new")


def test_usernames_are_exact():
    table = parse(f"Alice:{VMQ}\n")
    assert "alice" not in table
    assert " Alice" not in table


def test_empty_file_has_no_users():
    assert parse("") == {}
    assert parse("# nobody yet\n") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice\n", "f:1: expected username:hash"),
        (f"# c\nalice:{VMQ}\n:{VMQ}\n", "f:3: empty username"),
        (f"alice:{VMQ}\nbob:plain\n", "f:2: user 'bob': expected a hash starting with $6$"),
        (f"alice:{VMQ}\n\nalice:{SCRYPT}\n", "f:3: user 'alice' is listed twice"),
        ("x:$6$AAAA$AAAA\n", "f:1: user 'x': SHA-512 digest is 3 bytes, expected 64"),
    ],
)
def test_parse_errors_name_file_and_line(text, message):
    with pytest.raises(PasswdFileError) as info:
        parse(text, "f")
    assert str(info.value).startswith(message)


def test_load_missing_and_not_utf8(tmp_path):
    with pytest.raises(PasswdFileError, match="no such file"):
        load(tmp_path / "missing")
    bad = tmp_path / "latin1"
    bad.write_bytes(b"caf\xe9:" + VMQ.encode() + b"\n")
    with pytest.raises(PasswdFileError, match="not UTF-8"):
        load(bad)


@pytest.mark.parametrize(
    ("username", "problem"),
    [
        ("alice", None),
        ("ünïcode user", None),
        ("", "empty"),
        ("a:b", "':'"),
        ("a\nb", "line break"),
        ("#admin", "'#'"),
    ],
)
def test_check_username(username, problem):
    result = check_username(username)
    if problem is None:
        assert result is None
    else:
        assert problem in result


ORIGINAL = f"# keep me\r\nvmq:{VMQ}\r\n\nbob:{SCRYPT}\nbroken line\ncarol:{VMQ}"


def test_set_user_replaces_in_place_and_keeps_every_other_byte():
    text = set_user(ORIGINAL, "bob", "$scrypt$NEW")
    assert text == ORIGINAL.replace(f"bob:{SCRYPT}", "bob:$scrypt$NEW")


def test_set_user_keeps_crlf_of_the_replaced_line():
    text = set_user(ORIGINAL, "vmq", "$scrypt$NEW")
    assert text == ORIGINAL.replace(f"vmq:{VMQ}\r\n", "vmq:$scrypt$NEW\r\n")


def test_set_user_appends_after_a_missing_final_newline():
    text = set_user(ORIGINAL, "dave", "$scrypt$D")
    assert text == ORIGINAL + "\ndave:$scrypt$D\n"
    assert set_user("", "first", "$scrypt$F") == "first:$scrypt$F\n"


def test_set_user_drops_hand_made_duplicates():
    text = set_user(f"a:{VMQ}\nb:{VMQ}\na:{SCRYPT}\n", "a", "$x")
    assert text == f"a:$x\nb:{VMQ}\n"


def test_delete_user():
    text, found = delete_user(ORIGINAL, "bob")
    assert found
    assert text == ORIGINAL.replace(f"bob:{SCRYPT}\n", "")
    again, found = delete_user(text, "bob")
    assert (again, found) == (text, False)
    # A comment that looks like a user line is not a user.
    assert delete_user("#bob:x\n", "#bob") == ("#bob:x\n", False)


def test_write_atomic_new_file_is_private(tmp_path):
    path = tmp_path / "passwd"
    write_atomic(path, "a:b\n")
    assert path.read_text() == "a:b\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["passwd"]  # no temp file left behind


def test_write_atomic_replaces_keeps_mode_and_crlf(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("old\n")
    path.chmod(0o640)
    inode = path.stat().st_ino
    write_atomic(path, "a:b\r\nc:d\r\n")
    assert path.read_bytes() == b"a:b\r\nc:d\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert path.stat().st_ino != inode  # replaced, not rewritten in place


def test_write_atomic_failure_leaves_the_old_file(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "bad \udcff surrogate\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["passwd"]
