"""Helpers for the ACL tests: files written atomically, polling with a deadline, and a
stand-in for auth_jwt that puts claims where the real one does."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hooks import Ok, RegisterContext

DEADLINE = 10.0  # the longest a reload may take to show (interval 1 s in these tests)


def write_acl(path: Path, text: str) -> Path:
    """Replace the file in one step, so a reload never reads it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
    return path


def eventually(check: Callable[[], Any], timeout: float = DEADLINE, every: float = 0.05) -> Any:
    """Poll `check` until it returns something true; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(every)


class ClaimsFromPassword:
    """auth_on_register: accept everyone, the CONNECT password being the claims as JSON."""

    def auth_on_register(self, ctx: RegisterContext) -> Ok:
        if ctx.password:
            ctx.attributes["jwt_claims"] = json.loads(ctx.password)
        return Ok()
