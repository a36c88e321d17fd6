"""What goes wrong, said in one line: a sink given wrong (`SinkError`, before Spark
starts) and a running query stopped by something its user must fix (`QueryFailed`:
refused credentials, an ACL, a certificate, a broker away too long).

Spark brings an exception raised in Python code it called (the MQTT sink's foreachBatch
on the driver, the source's methods in its Python workers) back to the driver as text
only: the Python traceback inside the message of a Java exception, whose last line is
`module.Class: message`. `one_line` finds that line for the classes it is given, so that
`nautilus-spark` can print the message instead of the stack of tracebacks around it.
"""

from __future__ import annotations

from collections.abc import Container


class SinkError(ValueError):
    """A sink, or one of its options, that cannot be used (the message names the
    option)."""


class QueryFailed(Exception):
    """A running query's failure that its message explains whole, in one line (no
    traceback adds anything a user can act on)."""


def qualified(kind: type[BaseException]) -> str:
    """The name a traceback's last line gives the class: `module.Class`."""
    return f"{kind.__module__}.{kind.__qualname__}"


def one_line(text: str, kinds: Container[str]) -> str | None:
    """The message of the first exception in `text` whose class (qualified name) is one
    of `kinds`; None when there is none."""
    for line in text.splitlines():
        name, colon, message = line.partition(": ")
        if colon and name in kinds:
            return message.strip()
    return None
