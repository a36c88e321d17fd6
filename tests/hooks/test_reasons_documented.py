"""The refusal reasons docs/plugins.md lists ("Refusal reasons") are the ones the code
gives: neither a reason the code gives and the docs do not name, nor one the docs name
and nothing gives.

The code's reasons are found where refusals are made: the first argument of `Error(...)`
(hooks' results), of auth_jwt's `Refused(...)` and of webhooks' `InvalidResponse(...)`,
the second of webhooks' `_failed(endpoint, reason, detail)`: a string, or a module-level
name bound to one. A reason computed at run time (a webhook endpoint's own) is not a
reason of ours.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "hooks", "plugins", "event_relay")
# Callable name -> the position of the reason among its arguments.
REFUSALS = {"Error": 0, "Refused": 0, "InvalidResponse": 0, "_failed": 1}
ALSO = {"not_authorized"}  # broker/authorization.py: a refusal that is not an Error


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _called(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Name):
        return function.id
    return function.attr if isinstance(function, ast.Attribute) else None


def _reason(call: ast.Call, position: int, path: Path) -> str | None:
    """The reason a refusal call gives, if it is fixed in the code."""
    if len(call.args) > position:
        argument: ast.expr | None = call.args[position]
    else:
        argument = next((k.value for k in call.keywords if k.arg == "reason"), None)
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    if isinstance(argument, ast.Name):
        value = getattr(importlib.import_module(_module(path)), argument.id, None)
        return value if isinstance(value, str) else None
    return None


def code_reasons() -> set[str]:
    found = set(ALSO)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and _called(node) in REFUSALS:
                    reason = _reason(node, REFUSALS[_called(node) or ""], path)
                    if reason is not None:
                        found.add(reason)
    return found


def documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = text.split("### Refusal reasons", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.MULTILINE))


def test_the_documented_refusal_reasons_are_the_ones_the_code_gives():
    code, docs = code_reasons(), documented_reasons()
    assert code - docs == set(), "given by the code, missing from docs/plugins.md"
    assert docs - code == set(), "in docs/plugins.md, given by nothing"


def test_the_scan_finds_reasons_of_each_kind():
    """The scan itself: constants, module-level names, and each kind of call."""
    code = code_reasons()
    assert {"plugin_chain_exhausted", "invalid_credentials"} <= code  # Error(...) constants
    assert {"missing_rid", "username_rid_mismatch"} <= code  # Refused(NAME) in auth_jwt
    assert {"timeout", "received_payload_not_json"} <= code  # webhooks' two kinds


def test_the_event_relay_docs_point_to_the_list():
    text = (ROOT / "docs" / "event-relay.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if "`on_register_failed`" in line)
    assert "plugins.md#refusal-reasons" in row
    for reason in re.findall(r"`([a-z0-9_]+)`", row.split("reason", 1)[1]):
        assert reason in documented_reasons(), reason
