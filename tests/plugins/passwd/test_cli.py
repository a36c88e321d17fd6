"""`nautilus passwd`, run as the real command (`python -m broker passwd ...`)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys

import pytest

from plugins.passwd import cli
from plugins.passwd.hashes import ScryptHash
from plugins.passwd.passwd_file import load

SALT = b"abcdefghijkl"
VMQ_LINE = (
    f"legacy:$6${base64.b64encode(SALT).decode()}$"
    f"{base64.b64encode(hashlib.sha512(b'old' + SALT).digest()).decode()}"
)


def passwd(*args: str, stdin: str | bytes = "", cwd=None) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    result = subprocess.run(
        [sys.executable, "-m", "broker", "passwd", *args],
        input=data,
        capture_output=True,
        cwd=cwd,
        timeout=15,
    )
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


def verifies(path, username: str, password: bytes) -> bool:
    return load(path)[username].verify(password)


def test_create_add_change_delete(tmp_path):
    path = tmp_path / "passwd"
    result = passwd("-c", str(path), "alice", stdin="wonderland\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert path.read_text().startswith("alice:$scrypt$n=2048,r=8,p=1$")
    assert isinstance(load(path)["alice"], ScryptHash)
    assert verifies(path, "alice", b"wonderland")

    assert passwd(str(path), "bob", stdin="builder\n").returncode == 0
    assert list(load(path)) == ["alice", "bob"]
    assert verifies(path, "bob", b"builder")

    assert passwd(str(path), "alice", stdin="looking-glass\n").returncode == 0
    assert list(load(path)) == ["alice", "bob"]  # changed in place
    assert verifies(path, "alice", b"looking-glass")
    assert not verifies(path, "alice", b"wonderland")

    assert passwd("-D", str(path), "alice").returncode == 0
    assert list(load(path)) == ["bob"]


def test_create_overwrites(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(VMQ_LINE + "\n")
    assert passwd("-c", str(path), "fresh", stdin="pw\n").returncode == 0
    assert list(load(path)) == ["fresh"]


def test_other_lines_are_kept_byte_for_byte(tmp_path):
    path = tmp_path / "passwd"
    original = f"# migrated from VerneMQ\r\n{VMQ_LINE}\r\n\nbob:$scrypt$x\n"
    path.write_bytes(original.encode())
    assert passwd(str(path), "carol", stdin="pw\n").returncode == 0
    text = path.read_bytes().decode()
    assert text.startswith(original)
    assert text.count("\n") == original.count("\n") + 1
    assert passwd("-D", str(path), "carol").returncode == 0
    assert path.read_bytes().decode() == original


def test_password_line_endings_are_not_part_of_the_password(tmp_path):
    path = tmp_path / "passwd"
    assert passwd("-c", str(path), "u", stdin=b"p w\r\nignored second line\n").returncode == 0
    assert verifies(path, "u", b"p w")
    assert passwd(str(path), "v", stdin=b"no newline at all").returncode == 0
    assert verifies(path, "v", b"no newline at all")
    assert passwd(str(path), "w", stdin="pässwörd\n").returncode == 0
    assert verifies(path, "w", "pässwörd".encode())


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["FILE", "a:b"], "pw\n", "a username cannot contain ':'"),
        (
            ["FILE", "#x"],
            "pw\n",
            "a username cannot start with '#' (a comment in the password file)",
        ),
        (["FILE", "alice"], "", "no password on standard input"),
        (["FILE", "alice"], "\n", "the password is empty"),
        (["-D", "FILE", "nobody"], "", "FILE: no user 'nobody'"),
        (["MISSING", "alice"], "pw\n", "MISSING: no such file (use -c to create it)"),
    ],
)
def test_refusals_exit_1_with_one_line(tmp_path, args, stdin, message):
    path = tmp_path / "passwd"
    path.write_text(VMQ_LINE + "\n")
    names = {"FILE": str(path), "MISSING": str(tmp_path / "missing")}
    result = passwd(*(names.get(a, a) for a in args), stdin=stdin)
    assert result.returncode == 1
    assert result.stderr == f"nautilus passwd: {message}\n".replace("FILE", str(path)).replace(
        "MISSING", str(tmp_path / "missing")
    )
    assert path.read_text() == VMQ_LINE + "\n"  # untouched
    assert not (tmp_path / "missing").exists()


def test_usage_errors_exit_2(tmp_path):
    assert passwd("-c", "-D", str(tmp_path / "f"), "u").returncode == 2
    assert passwd(str(tmp_path / "f")).returncode == 2


def test_help_of_both_commands():
    result = passwd("--help")
    assert result.returncode == 0
    assert "usage: nautilus passwd [-h] [-c | -D] FILE USER" in result.stdout
    main_help = subprocess.run(
        [sys.executable, "-m", "broker", "--help"], capture_output=True, text=True, timeout=15
    )
    assert "nautilus passwd" in main_help.stdout


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_asks_twice(monkeypatch):
    answers = iter(["secret", "secret", "one", "two"])
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt: next(answers))
    assert cli.read_password(FakeTerminal()) == b"secret"
    with pytest.raises(cli.CliError, match="do not match"):
        cli.read_password(FakeTerminal())


@pytest.mark.parametrize(("content", "where"), [(None, "no such file"), ("bob\n", ":1: expected")])
def test_broker_refuses_to_start_without_a_usable_file(tmp_path, content, where):
    path = tmp_path / "passwd"
    if content is not None:
        path.write_text(content)
    config = tmp_path / "nautilus.toml"
    config.write_text(
        "[broker]\nallow_anonymous = false\n\n"
        '[[listeners]]\naddress = "127.0.0.1:0"\n\n[store]\nbackend = "memory"\n\n'
        f'[plugins.passwd]\nenabled = true\npassword_file = "{path}"\n',
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=15,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("NAUTILUS_")},
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"nautilus: plugins.passwd.password_file: {path}")
    assert where in result.stderr
    assert len(result.stderr.splitlines()) == 1
