"""Hook chains that write the calls made for traced clients to their traces.

While a trace is on, the tracer swaps each hook chain a plugin implements for a
`WatchedChain` around it (broker/hook_callers.py's `watch`): a call whose context names
a traced client (its mountpoint and client id) is written with its arguments and result,
any other costs one dict lookup. Chains nobody implements stay as they are (empty,
skipped by the broker as before), except on_message_drop, whose `DropWatch` is never
empty while tracing, so that a traced session's drops are written even when no plugin
listens (a drop builds its context only then: a cost on drops alone, not on deliveries).
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.trace import text
from broker.trace.trace import HOOK, SESSION, Trace
from hooks import Chain, Result

Watched = dict[tuple[str, str], list[Trace]]  # (mountpoint, client id) -> its traces


class WatchedChain(Chain):
    """`inner`'s implementations, called as it calls them, with the calls made for
    traced clients written to their traces."""

    __slots__ = ("inner", "watched")

    def __init__(self, inner: Chain, watched: Watched) -> None:
        super().__init__(inner.name, inner.impls)
        self.inner = inner  # it counts the crashes
        self.watched = watched

    def traces(self, context: Any) -> list[Trace] | None:
        return self.watched.get((context.mountpoint, context.client_id))

    def run_sync(self, context: Any) -> Result:
        traces = self.traces(context)
        if not traces:
            return self.inner.run_sync(context)
        calls = _calls(self.name, context, traces)  # as called: a plugin may change it
        verdict = self.inner.run_sync(context)
        for trace, call in calls:
            trace.write(HOOK, f"{call} -> {text.result(verdict, trace.spec.trunc_payload)}")
        return verdict

    async def run(self, context: Any) -> Result:
        traces = self.traces(context)
        if not traces:
            return await self.inner.run(context)
        calls = _calls(self.name, context, traces)
        for trace, call in calls:  # now: the answer may take a while (a webhook)
            trace.write(HOOK, call)
        verdict = await self.inner.run(context)
        for trace, _ in calls:
            shown = text.result(verdict, trace.spec.trunc_payload)
            trace.write(HOOK, f"{self.name} -> {shown}")
        return verdict

    def notify(self, context: Any, tasks: set[asyncio.Task]) -> None:
        traces = self.traces(context)
        if traces:
            for trace, call in _calls(self.name, context, traces):
                trace.write(HOOK, call)
        self.inner.notify(context, tasks)


class DropWatch(WatchedChain):
    """on_message_drop while tracing: a traced session's drop is written as a session
    event (and as a hook call, when a plugin implements the hook)."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True  # the session builds the drop's context, and calls notify

    def notify(self, context: Any, tasks: set[asyncio.Task]) -> None:
        traces = self.traces(context)
        if traces:
            for trace in list(traces):  # (a line may end a trace: its rate limit)
                trunc = trace.spec.trunc_payload
                trace.write(
                    SESSION,
                    f"message dropped ({context.reason}): topic={context.topic!r} "
                    f"qos={context.qos} payload={text.payload(context.payload, trunc)}",
                )
        if self.inner:
            super().notify(context, tasks)


def watch(chain: Chain, watched: Watched) -> Chain:
    """The chain to call while tracing, in place of `chain`."""
    if chain.name == "on_message_drop":
        return DropWatch(chain, watched)
    return WatchedChain(chain, watched) if chain else chain


def _calls(hook: str, context: Any, traces: list[Trace]) -> list[tuple[Trace, str]]:
    return [(t, text.hook_call(hook, context, t.spec.trunc_payload)) for t in traces]
