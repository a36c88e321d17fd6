"""A plugin's side doors (hooks/spec.py, SIDE_DOORS): checked when it loads, resolved once.

Besides hooks, the broker may call a plugin's `start()` / `stop()`, `before_ack()`,
`metrics()`, `metadata_backend(dead_after)`, `invalidate(client_id, username)`,
`placement(node, alive)` and `reload_tls()`, and read its `metadata`, its `recorder` (a
MessageRecorder, hooks/recorder.py) and its `bridges` (a BridgeControl, hooks/bridges.py).
These are found by name, like hooks, so they are held to their declaration when the
plugin loads (`side_door_problem`, which check_plugin calls): a value that cannot be
called as the broker will call it, an `async` method the broker would not await, a
recorder or bridges without their methods, half of the metadata pair. Otherwise the
mistake would show later and elsewhere: a crash at start-up, a /metrics that reports an
error, acknowledgements written before an `async` before_ack ran.

They are looked up once. `side_doors(plugin)` gives one plugin's; `plugin_doors(plugins,
disabled)` gives those of all the broker's plugins as the parts that use them want them
(PluginDoors: every plugin's metrics for /metrics and $SYS, the enabled plugins'
before_ack for the ingress, the bridges' ports for the admin side...), made when the
plugins load and again when the admin API enables or disables one. The recorder is
resolved with the hook chains (Hooks.recorder, hooks/dispatch.py). Nothing else looks
these names up.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hooks.bridges import BRIDGE_METHODS, BridgeControl
from hooks.recorder import RECORDER_METHODS, MessageRecorder
from hooks.spec import SIDE_DOORS, Metric

StartOrStop = Callable[[], Awaitable[None] | None]  # plain or async
Invalidate = Callable[[str | None, str | None], Awaitable[int] | int]
Placement = Callable[[str, Callable[[], list[str] | None]], None]


@dataclass(frozen=True, slots=True)
class SideDoors:
    """What one plugin has of the side doors; None where it has none."""

    start: StartOrStop | None = None
    stop: StartOrStop | None = None
    before_ack: Callable[[], bool] | None = None
    metrics: Callable[[], Iterable[Metric]] | None = None
    metadata: str | None = None
    metadata_backend: Callable[[float], Any] | None = None  # a cluster MetadataBackend
    invalidate: Invalidate | None = None
    bridges: BridgeControl | None = None
    placement: Placement | None = None
    reload_tls: Callable[[], None] | None = None
    recorder: MessageRecorder | None = None


def side_doors(plugin: Any) -> SideDoors:
    """The side doors of a plugin (checked when it loaded: see side_door_problem)."""
    return SideDoors(**{name: getattr(plugin, name, None) for name in SIDE_DOORS})


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """One plugin's start() and stop() (either may be None)."""

    plugin: str
    start: StartOrStop | None
    stop: StartOrStop | None


@dataclass(frozen=True, slots=True)
class PluginDoors:
    """The side doors of the broker's plugins, resolved once (`plugin_doors`), each kind
    in the plugins' call order. A disabled plugin has no say in the broker's decisions
    (its hooks, `before_ack` and `invalidate` are left out); its own work runs on, so its
    other doors stay."""

    lifecycles: tuple[Lifecycle, ...] = ()  # started in this order, stopped in this order
    before_ack: tuple[Callable[[], bool], ...] = ()
    metrics: tuple[tuple[str, Callable[[], Iterable[Metric]]], ...] = ()  # (plugin, its)
    # `metadata` name -> its backend's maker (the first plugin's that serves the name).
    metadata_backends: Mapping[str, Callable[[float], Any]] = field(default_factory=dict)
    invalidate: tuple[tuple[str, Invalidate], ...] = ()  # (plugin, its)
    bridges: tuple[BridgeControl, ...] = ()
    placement: tuple[Placement, ...] = ()
    reload_tls: tuple[tuple[str, Callable[[], None]], ...] = ()  # (plugin, its)


def plugin_doors(plugins: Iterable[tuple[str, Any]], disabled: Collection[str] = ()) -> PluginDoors:
    """The side doors of `plugins`, (name, plugin) pairs in call order, each checked when
    it loaded; `disabled`: the names of those the admin API disabled."""
    every = [(name, side_doors(plugin)) for name, plugin in plugins]
    enabled = [(name, doors) for name, doors in every if name not in disabled]
    backends: dict[str, Callable[[float], Any]] = {}
    for _, doors in every:
        if doors.metadata is not None and doors.metadata_backend is not None:
            backends.setdefault(doors.metadata, doors.metadata_backend)
    return PluginDoors(
        lifecycles=tuple(
            Lifecycle(name, d.start, d.stop)
            for name, d in every
            if d.start is not None or d.stop is not None
        ),
        before_ack=tuple(d.before_ack for _, d in enabled if d.before_ack is not None),
        metrics=tuple((name, d.metrics) for name, d in every if d.metrics is not None),
        metadata_backends=backends,
        invalidate=tuple((name, d.invalidate) for name, d in enabled if d.invalidate is not None),
        bridges=tuple(d.bridges for _, d in every if d.bridges is not None),
        placement=tuple(d.placement for _, d in every if d.placement is not None),
        reload_tls=tuple((name, d.reload_tls) for name, d in every if d.reload_tls is not None),
    )


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


def _port_problem(door: str, value: Any, port: type, plain: Mapping[str, bool]) -> str | None:
    """What stops `value` from serving as `port` (a Protocol): one of its methods missing,
    or one that cannot be called as the broker calls it (`plain`: method -> whether the
    broker calls it without awaiting); None if nothing."""
    for method, must_be_plain in plain.items():
        function = getattr(value, method, None)
        if function is None:
            return f"{door} {type(value).__name__} has no method {method} ({port.__name__})"
        params = tuple(inspect.signature(getattr(port, method)).parameters)[1:]
        problem = call_problem(f"{door}.{method}", function, params, plain=must_be_plain)
        if problem is not None:
            return problem
    return None


_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "metadata": _metadata_problem,
    "recorder": lambda value: _port_problem(
        "recorder", value, MessageRecorder, dict.fromkeys(RECORDER_METHODS, True)
    ),
    "bridges": lambda value: _port_problem("bridges", value, BridgeControl, BRIDGE_METHODS),
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
