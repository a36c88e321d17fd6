"""The codec does no I/O: no module under broker/protocol imports an I/O or concurrency
module (STYLE.md section 1: only broker/connection.py touches a transport)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "broker" / "protocol"

FORBIDDEN = frozenset(
    {
        "asyncio",
        "anyio",
        "trio",
        "uvloop",
        "socket",
        "socketserver",
        "ssl",
        "select",
        "selectors",
        "asyncore",
        "asynchat",
        "threading",
        "_thread",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "signal",
        "os",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "http",
        "urllib",
        "logging",
        "importlib",  # a dynamic import would dodge this check
    }
)


def forbidden_imports(source: str) -> list[str]:
    """Top-level names of forbidden modules imported anywhere in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            names = ["__import__"]
        else:
            continue
        found += [name for name in names if name == "__import__" or name.split(".")[0] in FORBIDDEN]
    return found


def modules() -> list[Path]:
    return sorted(PROTOCOL_DIR.rglob("*.py"))


def test_protocol_package_is_there():
    names = {path.name for path in modules()}
    assert {"__init__.py", "_events.py", "_errors.py"} <= names


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_no_io_imports(path):
    assert forbidden_imports(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import os.path",
        "from socket import socket",
        "from concurrent.futures import Future",
        "def f():\n    import ssl",
        "__import__('asyncio')",
    ],
)
def test_checker_catches(source):
    assert forbidden_imports(source)


@pytest.mark.parametrize(
    "source", ["import struct", "from ._buffer import read_varint", "from . import _events"]
)
def test_checker_allows(source):
    assert forbidden_imports(source) == []
