"""Hook chains: the ordered implementations of each hook, and how they are called.

Strategy (pluggy's, adapted): all the work happens when plugins are registered. Each hook
gets one immutable Chain holding a tuple of (plugin name, bound method, is_async); the
broker asks `hooks.chain(name)` once per call site and skips everything when the chain is
empty, so a hook nobody implements costs one dict lookup and a truth test. A chain whose
implementations are all synchronous runs without awaiting (`run_sync`), so a sync ACL
plugin adds no task or coroutine to the publish path.

A deciding chain's answer says how long it holds (`cache_for`, hooks/decisions.py) only
when every plugin it asked said so of its own answer, for the shortest of their times; a
plugin that said nothing (plain NEXT, None) makes the chain's answer say nothing.

A plugin that raises is logged and counted; in an auth chain that is a denial, never an
allow. A deciding hook that returns None (a plain `return`, or falling off the end) has no
opinion, as if it returned NEXT.

Plugins are checked when chains are built (`check_plugin`): a public method named like a
hook (`on_*`, `auth_on_*`) that is no hook, or a hook that cannot be called with the one
context argument, raises PluginError, which the loader turns into a one-line start-up
error; otherwise a typo would be a hook that is silently never called, and a wrong
signature a crash on every call. The side doors (SIDE_DOORS: start/stop, before_ack,
metrics, metadata/metadata_backend, invalidate, bridges, placement, reload_tls, recorder;
hooks/side_doors.py) are checked with them.

`hooks.versions(name)` gives a hook pair's chains as (MQTT 3, MQTT 5), so a call site
picks its chain by protocol version with an index instead of building the name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import inspect
import logging
from collections.abc import Iterable
from typing import Any

from hooks.decisions import FOREVER
from hooks.recorder import MessageRecorder
from hooks.results import CHAIN_EXHAUSTED, NEXT, Error, Next, Ok, Result
from hooks.side_doors import bare, side_door_problem, side_doors
from hooks.spec import HOOKS, check_modifiers

log = logging.getLogger("nautilus.hooks")

PLUGIN_CRASHED = Error("plugin_crashed")
INVALID_RESULT = Error("invalid_result")


class Chain:
    """The implementations of one hook, in plugin order."""

    __slots__ = ("crashes", "impls", "name", "synchronous")

    def __init__(self, name: str, impls: tuple[tuple[str, Any, bool], ...]) -> None:
        self.name = name
        self.impls = impls
        self.synchronous = not any(is_async for _, _, is_async in impls)
        self.crashes = 0

    def __bool__(self) -> bool:
        return bool(self.impls)

    def __repr__(self) -> str:
        return f"<Chain {self.name} {[plugin for plugin, _, _ in self.impls]}>"

    # -- all_till_ok -------------------------------------------------------------------

    def run_sync(self, context: Any) -> Result:
        """all_till_ok for a chain with no async implementation."""
        holds: float | None = FOREVER if self.impls else None  # none: nobody promised
        for plugin, method, _ in self.impls:
            try:
                result = method(context)
            except Exception:
                return self._crashed(plugin)
            verdict = self._judge(plugin, result)
            if holds is not None:
                holds = _holds(holds, result, verdict)
            if verdict is not NEXT:
                return _lasting(verdict, holds)
        return _lasting(CHAIN_EXHAUSTED, holds)

    async def run(self, context: Any) -> Result:
        """all_till_ok: the first Ok or Error decides; all Next (or none) denies."""
        holds: float | None = FOREVER if self.impls else None  # none: nobody promised
        for plugin, method, is_async in self.impls:
            try:
                result = method(context)
                if is_async:
                    result = await result
            except Exception:
                return self._crashed(plugin)
            verdict = self._judge(plugin, result)
            if holds is not None:
                holds = _holds(holds, result, verdict)
            if verdict is not NEXT:
                return _lasting(verdict, holds)
        return _lasting(CHAIN_EXHAUSTED, holds)

    def _judge(self, plugin: str, result: Any) -> Result:
        if type(result) is Ok:
            if result.modifiers:
                problem = check_modifiers(self.name, result.modifiers)
                if problem is not None:
                    log.error("plugin %s: %s; treated as an error", plugin, problem)
                    return Error("invalid_modifiers")
            return result
        if result is None or type(result) is Next:
            return NEXT  # None, as Python authors expect; any Next(), not only NEXT
        if type(result) is Error:
            return result
        log.error(
            "plugin %s: %s returned %r, not Ok, Error, Next or None", plugin, self.name, result
        )
        return INVALID_RESULT

    def _crashed(self, plugin: str) -> Error:
        self.crashes += 1
        log.exception("plugin %s crashed in %s", plugin, self.name)
        return PLUGIN_CRASHED

    # -- all ---------------------------------------------------------------------------

    def notify(self, context: Any, tasks: set[asyncio.Task]) -> None:
        """all: call every implementation, ignore results. Async ones run as tasks."""
        for plugin, method, is_async in self.impls:
            try:
                result = method(context)
            except Exception:
                self._crashed(plugin)
                continue
            if is_async:
                task = asyncio.ensure_future(result)
                tasks.add(task)
                task.add_done_callback(self._event_done(plugin, tasks))

    def _event_done(self, plugin: str, tasks: set[asyncio.Task]):
        def done(task: asyncio.Task) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self.crashes += 1
                log.error("plugin %s crashed in %s", plugin, self.name, exc_info=task.exception())

        return done


def _holds(holds: float, result: Any, verdict: Result) -> float | None:
    """How long the chain's answer holds once `result` (judged `verdict`) is heard: the
    shortest promise so far (hooks/decisions.py); None once a plugin made none, or its
    answer was not taken as given (an invalid result, invalid modifiers)."""
    if verdict is not result and (verdict is not NEXT or result is None):
        return None
    cache_for = result.cache_for
    if cache_for is None:
        return None
    return cache_for if cache_for < holds else holds


def _lasting(verdict: Result, holds: float | None) -> Result:
    """`verdict` saying how long the whole chain's answer holds (a copy only when that is
    not what it says already: one plugin's promise is the chain's)."""
    if verdict.cache_for == holds:
        return verdict
    return dataclasses.replace(verdict, cache_for=holds)


class PluginError(Exception):
    """A plugin breaks the hook contract. `problem` says how, without the plugin's name."""

    def __init__(self, plugin: str, problem: str) -> None:
        super().__init__(f"plugin {plugin}: {problem}")
        self.plugin = plugin
        self.problem = problem


def _recorder(plugins: list[tuple[str, Any]]) -> MessageRecorder | None:
    """The one plugin's MessageRecorder (hooks/recorder.py), if a plugin has one."""
    recorders = [(name, side_doors(plugin).recorder) for name, plugin in plugins]
    found = [(name, recorder) for name, recorder in recorders if recorder is not None]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise PluginError(found[1][0], f"only one plugin may record messages ({names} do)")
    return found[0][1] if found else None


def check_plugin(name: str, plugin: Any) -> None:
    """Raise PluginError for the first method of `plugin` that looks like a hook but is
    none, or that is a hook but cannot take one context argument, then for the first side
    door (hooks/side_doors.py) that breaks its declaration. Hooks are looked up on the
    instance (a plugin may set them in __init__); None hides a hook."""
    for attribute in dir(plugin):
        if not attribute.startswith(("on_", "auth_on_")):
            continue
        method = getattr(plugin, attribute, None)
        if attribute not in HOOKS:
            if callable(method):
                raise PluginError(name, _not_a_hook(attribute))
        elif method is not None:
            problem = _call_problem(attribute, method)
            if problem is not None:
                raise PluginError(name, problem)
    problem = side_door_problem(plugin)
    if problem is not None:
        raise PluginError(name, problem)


def _not_a_hook(attribute: str) -> str:
    close = difflib.get_close_matches(attribute, HOOKS, n=1)
    if close:
        return f"method {attribute} is not a hook; did you mean {close[0]}?"
    return (
        f"method {attribute} is not a hook; on_* and auth_on_* names are kept for hooks "
        "(see docs/plugins.md), so rename it (a helper can start with _)"
    )


def _call_problem(hook: str, method: Any) -> str | None:
    """What stops `method` from being called as method(context), or None."""
    if not callable(method):
        return f"hook {hook} is not callable (it is {type(method).__name__})"
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # some builtins have none: they are trusted
        return None
    try:
        signature.bind(None)
    except TypeError:
        return f"hook {hook}{bare(signature)} must take one positional argument, the context"
    return None


class Hooks:
    """Every hook's chain, built from plugins in call order (each checked first)."""

    def __init__(
        self, plugins: Iterable[tuple[str, Any]] = (), tasks: set[asyncio.Task] | None = None
    ) -> None:
        self.plugins = list(plugins)
        for name, plugin in self.plugins:
            check_plugin(name, plugin)
        # Running async event hooks (a broker keeps one set across rebuilt chains).
        self.tasks: set[asyncio.Task] = set() if tasks is None else tasks
        self._chains = {name: self._build(name) for name in HOOKS}
        self.recorder = _recorder(self.plugins)
        self._versions = {
            spec.v4_fallback: (self._chains[spec.v4_fallback], self._chains[name])
            for name, spec in HOOKS.items()
            if spec.v4_fallback is not None
        }

    def _build(self, name: str) -> Chain:
        spec = HOOKS[name]
        impls = []
        for plugin_name, plugin in self.plugins:
            method = getattr(plugin, name, None)
            if method is None and spec.v4_fallback is not None:
                method = getattr(plugin, spec.v4_fallback, None)
            if method is not None:
                impls.append((plugin_name, method, inspect.iscoroutinefunction(method)))
        return Chain(name, tuple(impls))

    def chain(self, name: str) -> Chain:
        return self._chains[name]

    def versions(self, name: str) -> tuple[Chain, Chain]:
        """The chains of the hook pair `name` / `name_m5` as (MQTT 3, MQTT 5): a call site
        resolves them once and picks one with `[protocol_level == 5]`."""
        try:
            return self._versions[name]
        except KeyError:
            raise KeyError(f"{name!r} is not the MQTT 3 name of a hook pair") from None

    def notify(self, name: str, context: Any) -> None:
        """Fire an event hook (callers build `context` only when the chain is non-empty)."""
        self._chains[name].notify(context, self.tasks)

    @property
    def crashes(self) -> int:
        return sum(chain.crashes for chain in self._chains.values())


__all__ = ["Chain", "Error", "Hooks", "Next", "Ok", "PluginError", "check_plugin"]
