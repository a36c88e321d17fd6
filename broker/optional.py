"""Optional libraries: the pieces a config may leave out are imported only when it asks.

`load(module, purpose)` imports one of the broker's modules that needs a library
(`broker.websocket` needs websockets, `broker.proxy_protocol` proxy-protocol,
`broker.http.app` aiohttp, ...), once, when what needs it starts. When the library is
missing or broken (any ImportError while importing it: a module not found, or one
raised from inside the library, as a release that removed a name does), it raises
`MissingLibrary`, whose message is the one log line: what is not started, which library,
and the fix, the exact requirement this package declares for it
(`pip install 'websockets>=13'`, read from the installed metadata). An ImportError from
our own code is a bug, not a missing library: it is raised as it is.
"""

from __future__ import annotations

import importlib
import re
import sys
import traceback
from importlib import metadata
from types import ModuleType

DISTRIBUTION = "nautilus-mqtt"  # ours, whose metadata declares the requirements
# Import name -> the distribution that provides it (pip's name).
DISTRIBUTIONS = {
    "websockets": "websockets",
    "proxyprotocol": "proxy-protocol",
    "aiohttp": "aiohttp",
    "redis": "redis",
    "msgpack": "msgpack",
    "plyvel": "plyvel",
    "jwt": "PyJWT",
    "google.protobuf": "protobuf",
    "asyncpg": "asyncpg",
    "asyncmy": "asyncmy",
    "bcrypt": "bcrypt",
}
# Our own top-level packages: an ImportError raised in them, of them, is not a library's.
OWN = ("broker", "hooks", "plugins", "event_relay", "spark_consumers")
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class MissingLibrary(Exception):
    """A library `purpose` needs cannot be imported. `str()` is the one log line."""

    def __init__(self, purpose: str, library: str, detail: str) -> None:
        self.purpose = purpose
        self.library = library  # the import name: "websockets", "google.protobuf"
        self.distribution = DISTRIBUTIONS.get(library, library)
        self.fix = f"pip install '{requirement(self.distribution)}'"
        detail = " ".join(detail.split())  # one line, whatever the library said
        super().__init__(
            f"{purpose}: the {self.distribution} library cannot be imported ({detail}); "
            f"fix: {self.fix}"
        )


def load(module: str, purpose: str, own: tuple[str, ...] = OWN) -> ModuleType:
    """Import `module` for `purpose` (what the log line says is not started, e.g.
    "listeners[1] (ws on 127.0.0.1:8080) not started"). MissingLibrary when a library it
    imports is missing or broken; any other ImportError (one of ours: a bug) as it is."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing_library = missing(exc, purpose, own)
        if missing_library is None:
            raise
        raise missing_library from exc


def missing(exc: ImportError, purpose: str, own: tuple[str, ...] = OWN) -> MissingLibrary | None:
    """The MissingLibrary an ImportError means, or None when it is one of our own."""
    library = culprit(exc, own)
    if library is None:
        return None
    return MissingLibrary(purpose, library, str(exc) or type(exc).__name__)


def culprit(exc: ImportError, own: tuple[str, ...] = OWN) -> str | None:
    """The library an ImportError comes from (its import name), or None when it comes from
    our own packages (`own`). The outermost library module on the traceback is the one our
    code imported (whose own import of something else may be what failed: aiohttp's
    yarl is fixed by installing aiohttp); with none there, the module that was not found."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        name = frame.f_globals.get("__name__") or ""
        if name and not name.startswith("importlib") and not _ours(name, own):
            return _library(name)
    if exc.name and not _ours(exc.name, own):
        return _library(exc.name)
    return None


def _library(module: str) -> str | None:
    """The known library a module belongs to ("google.protobuf.message" ->
    "google.protobuf"), else its top-level package; None for the standard library's
    (not something pip installs)."""
    for library in DISTRIBUTIONS:
        if module == library or module.startswith(library + "."):
            return library
    top = module.split(".")[0]
    return None if top in sys.stdlib_module_names else top


def requirement(distribution: str) -> str:
    """What this package requires of `distribution` ("websockets>=13", markers left out),
    read from the installed metadata; the plain name when that is not available."""
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return distribution
    wanted = _normalized(distribution)
    for line in lines:
        spec, _, marker = line.partition(";")
        match = _NAME.match(spec)
        if match and _normalized(match[1]) == wanted and "extra" not in marker:
            return spec.strip()
    return distribution


def _ours(module: str, own: tuple[str, ...]) -> bool:
    return module.split(".")[0] in own


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
