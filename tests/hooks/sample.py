"""Test plugins, loaded by the broker from `module = "tests.hooks.sample:<Class>"`.

`Recorder` implements every hook (or the ones its config names), records each call with
a deep copy of its context, and answers as its config says. The broker calls hooks on its
own thread; the test thread waits on the recorded calls with a timeout, never a sleep:

    plugins={"rec": {"enabled": True, "module": "tests.hooks.sample:Recorder",
                     "answers": {"auth_on_publish": {"result": "error"}}}}

Config keys:
- `hooks`: the hooks it implements (default: all). A v5 client's `_m5` hook is then served
  by the v4 method when only the v4 name is listed.
- `async_hooks`: the hooks implemented as `async` methods (which await a few loop turns).
- `answers`: hook name -> an answer or a list of them, the first matching one applying.
  An answer is "ok", "next", "error", "raise", "none", or a table:
  `{result, modifiers, reason, reason_code, client_id, topic}` where `client_id` and
  `topic` restrict the answer to contexts with that value. No answer (or no match) is
  Ok(). The `_m5` hook uses the v4 hook's answers unless it has its own.

The other classes exercise plugin loading.
"""

from __future__ import annotations

import asyncio
import copy
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from hooks import HOOKS, NEXT, Error, Ok

TIMEOUT = 5.0


@dataclass
class Call:
    hook: str
    context: Any  # a deep copy, taken when the hook was called


class Recorder:
    @dataclass
    class Config:
        hooks: list[str] = field(default_factory=lambda: list(HOOKS))
        async_hooks: list[str] = field(default_factory=list)
        answers: dict[str, Any] = field(default_factory=dict)

    def __init__(self, config: Recorder.Config) -> None:
        self.config = config
        self.calls: list[Call] = []
        self._cond = threading.Condition()
        for name in HOOKS:
            if name not in config.hooks:
                setattr(self, name, None)  # hides the hook: the broker skips a None
            elif name in config.async_hooks:
                setattr(self, name, self._async_impl(name))
            else:
                setattr(self, name, self._sync_impl(name))

    # -- the hook implementations ---------------------------------------------------------

    def _sync_impl(self, name: str):
        def hook(context):
            self._record(name, context)
            return self._answer(name, context)

        hook.__name__ = name
        return hook

    def _async_impl(self, name: str):
        async def hook(context):
            self._record(name, context)
            for _ in range(random.randint(0, 5)):  # a few loop turns, no wall-clock wait
                await asyncio.sleep(0)
            return self._answer(name, context)

        hook.__name__ = name
        return hook

    def _record(self, name: str, context: Any) -> None:
        with self._cond:
            self.calls.append(Call(name, copy.deepcopy(context)))
            self._cond.notify_all()

    def _answer(self, name: str, context: Any) -> Any:
        answers = self.config.answers
        rules = answers.get(name)
        if rules is None and HOOKS[name].v4_fallback is not None:
            rules = answers.get(HOOKS[name].v4_fallback)
        if rules is None:
            return Ok()
        for rule in rules if isinstance(rules, list) else [rules]:
            rule = {"result": rule} if isinstance(rule, str) else rule
            if all(
                getattr(context, key, None) == rule[key]
                for key in ("client_id", "topic")
                if key in rule
            ):
                return _result(rule)
        return Ok()

    # -- for the tests (any thread) -----------------------------------------------------

    def wait(self, hook: str, timeout: float = TIMEOUT, **match: Any) -> Any:
        """The context of the first call of `hook` whose context has these values."""
        return self.wait_count(hook, 1, timeout, **match)[0]

    def wait_count(self, hook: str, count: int, timeout: float = TIMEOUT, **match: Any):
        """The contexts of the first `count` matching calls of `hook`."""
        with self._cond:
            found = self._cond.wait_for(lambda: len(self._matching(hook, match)) >= count, timeout)
            calls = self._matching(hook, match)
        assert found, f"{hook} {match or ''} called {len(calls)} times, expected {count}"
        return calls[:count]

    def contexts(self, hook: str, **match: Any) -> list[Any]:
        """The contexts of every call so far of `hook` matching these values."""
        with self._cond:
            return self._matching(hook, match)

    def names(self, **match: Any) -> list[str]:
        """The hooks called so far, in order, whose context has these values."""
        with self._cond:
            return [
                call.hook
                for call in self.calls
                if all(getattr(call.context, k, None) == v for k, v in match.items())
            ]

    def _matching(self, hook: str, match: dict[str, Any]) -> list[Any]:
        return [
            call.context
            for call in self.calls
            if call.hook == hook
            and all(getattr(call.context, k, None) == v for k, v in match.items())
        ]


def _result(rule: dict[str, Any]) -> Any:
    kind = rule.get("result", "ok")
    if kind == "ok":
        return Ok(rule.get("modifiers", {}))
    if kind == "next":
        return NEXT
    if kind == "error":
        return Error(rule.get("reason", "not_authorized"), rule.get("reason_code"))
    if kind == "none":
        return None
    if kind == "raise":
        raise RuntimeError("the Recorder was told to crash")
    raise ValueError(f"unknown answer {kind!r}")


# -- plugins for the loading tests -------------------------------------------------------


class NoConfig:
    """A plugin without a Config class: it takes no keys."""

    def on_publish(self, context) -> None:
        pass


class Misspelled:
    """A hook name with a typo, which stops the loader."""

    def auth_on_publsh(self, context):
        return Ok()

    def on_publish(self, context) -> None:
        pass


class TwoArguments:
    """A hook that cannot be called with the context alone, which stops the loader."""

    def on_publish(self, context, extra) -> None:
        pass


class WithLifecycle:
    """start() and stop() (what the broker calls besides hooks) and helpers are no hooks."""

    def __init__(self) -> None:
        self.started = 0

    def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.started -= 1

    def auth_on_publish(self, context):
        return Ok() if self._own_topic(context) else NEXT

    def _own_topic(self, context) -> bool:
        return context.topic.startswith(f"{context.client_id}/")


NOT_A_CLASS = object()


class AsyncBeforeAck:
    """A side door the broker would call without awaiting it, which stops the loader."""

    async def before_ack(self) -> bool:
        return True


class KeepsBeforeAck:
    """Keeps something before each acknowledgement: its before_ack calls are counted."""

    def __init__(self) -> None:
        self.before_ack_calls = 0

    def before_ack(self) -> bool:
        self.before_ack_calls += 1
        return True
