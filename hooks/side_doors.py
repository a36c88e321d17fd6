"""A plugin's side doors (hooks/spec.py, SIDE_DOORS): checked when it loads, looked up in
one place.

Besides hooks, the broker may call a plugin's `start()` / `stop()`, `before_ack()`,
`metrics()`, `metadata_backend(dead_after)`, `invalidate(client_id, username)`,
`bridges()`, `run_bridge(name, running)`, `placement(node, alive)` and `reload_tls()`,
and read its
`metadata` and `recorder`.
These are found by name, like hooks, so they are held to their declaration when the
plugin loads (`side_door_problem`, which check_plugin calls): a value that cannot be
called as the broker will call it, an `async` method the broker would not await, a
recorder without its methods, half of the metadata pair. Otherwise the mistake
would show later and elsewhere: a crash at start-up, a /metrics that reports an error,
acknowledgements written before an `async` before_ack ran.

The broker never looks these names up itself: it asks `side_doors(plugin)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hooks.recorder import RECORDER_METHODS, MessageRecorder
from hooks.spec import SIDE_DOORS, Metric


@dataclass(frozen=True, slots=True)
class SideDoors:
    """What one plugin has of the side doors; None where it has none."""

    start: Callable[[], Awaitable[None] | None] | None = None
    stop: Callable[[], Awaitable[None] | None] | None = None
    before_ack: Callable[[], bool] | None = None
    metrics: Callable[[], Iterable[Metric]] | None = None
    metadata: str | None = None
    metadata_backend: Callable[[float], Any] | None = None  # a cluster MetadataBackend
    invalidate: Callable[[str | None, str | None], Awaitable[int] | int] | None = None
    bridges: Callable[[], list[dict[str, Any]]] | None = None
    run_bridge: Callable[[str, bool], Awaitable[None] | None] | None = None
    placement: Callable[[str, Callable[[], list[str] | None]], None] | None = None
    reload_tls: Callable[[], None] | None = None
    recorder: MessageRecorder | None = None


def side_doors(plugin: Any) -> SideDoors:
    """The side doors of a plugin (checked when it loaded: see side_door_problem)."""
    return SideDoors(**{name: getattr(plugin, name, None) for name in SIDE_DOORS})


def side_door_problem(plugin: Any) -> str | None:
    """What breaks the side-door contract in `plugin` (one line), or None."""
    for name, door in SIDE_DOORS.items():
        value = getattr(plugin, name, None)
        if value is None:
            continue
        if door.needs is not None and getattr(plugin, door.needs, None) is None:
            return f"{name} needs {SIDE_DOORS[door.needs].signature} beside it"
        if door.calling == "value":
            problem = _VALUE_CHECKS[name](value)
        else:
            problem = call_problem(name, value, door.params, plain=door.calling == "plain")
        if problem is not None:
            return problem
    return None


def _metadata_problem(metadata: Any) -> str | None:
    if not isinstance(metadata, str) or not metadata:
        return f"metadata must be a non-empty str (it is {metadata!r})"
    return None


def _recorder_problem(recorder: Any) -> str | None:
    """What stops `recorder` from serving as a MessageRecorder, or None."""
    for method in RECORDER_METHODS:
        function = getattr(recorder, method, None)
        if function is None:
            return f"recorder {type(recorder).__name__} has no method {method} (MessageRecorder)"
        params = tuple(inspect.signature(getattr(MessageRecorder, method)).parameters)[1:]
        problem = call_problem(f"recorder.{method}", function, params, plain=True)
        if problem is not None:
            return problem
    return None


_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "metadata": _metadata_problem,
    "recorder": _recorder_problem,
}


def call_problem(what: str, method: Any, params: tuple[str, ...], plain: bool) -> str | None:
    """What stops `method` from being called as what(*params), without awaiting it when
    `plain`, or None. A callable without a signature (some builtins, C methods) is
    trusted."""
    if not callable(method):
        return f"{what} is not callable (it is {type(method).__name__})"
    if plain and inspect.iscoroutinefunction(method):
        return f"{what} must be a plain method, not async: the broker does not await it"
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*params)
    except TypeError:
        expected = f"{what.rpartition('.')[2]}({', '.join(params)})"
        return f"{what}{bare(signature)} cannot be called as {expected}"
    return None


def bare(signature: inspect.Signature) -> inspect.Signature:
    """The signature without annotations: the parameters are what the message is about."""
    empty = inspect.Signature.empty
    return signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )
