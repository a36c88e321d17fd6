"""The hook chains the core calls, resolved once when the broker starts.

A call site picks its chain by attribute (and, for a hook with an MQTT 5 twin, by
`[protocol_level == 5]`) instead of building a hook name from strings per call; an empty
chain is falsy, so a hook nobody implements costs one attribute load and a truth test.

While a trace is on (broker/trace/), every chain is resolved through its `watch`, which
may put another chain in its place; when the last trace ends, the plugins' own again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hooks import Chain, Hooks, MessageRecorder

Pair = tuple[Chain, Chain]  # (the MQTT 3 chain, the MQTT 5 chain)


class HookCallers:
    __slots__ = (
        "_hooks",
        "_watch",
        "auth_on_publish",
        "auth_on_register",
        "auth_on_subscribe",
        "on_auth_m5",
        "on_client_gone",
        "on_client_offline",
        "on_client_wakeup",
        "on_deliver",
        "on_delivery_complete",
        "on_message_drop",
        "on_offline_message",
        "on_publish",
        "on_register",
        "on_register_failed",
        "on_session_expired",
        "on_subscribe",
        "on_unsubscribe",
        "recorder",
        "tasks",
    )

    def __init__(self, hooks: Hooks) -> None:
        self.tasks: set[asyncio.Task[Any]] = hooks.tasks  # async event hooks in progress
        self._watch: Callable[[Chain], Chain] | None = None
        self.load(hooks)

    def load(self, hooks: Hooks) -> None:
        """(Re)resolve every chain from `hooks`: in place, so that whoever holds this
        object (every session does) sees a plugin enabled or disabled at run time."""
        self._hooks = hooks
        watch = self._watch

        def pair(name: str) -> Pair:
            v4, v5 = hooks.versions(name)
            return (watch(v4), watch(v5)) if watch is not None else (v4, v5)

        def one(name: str) -> Chain:
            chain = hooks.chain(name)
            return watch(chain) if watch is not None else chain

        self.auth_on_register: Pair = pair("auth_on_register")
        self.auth_on_publish: Pair = pair("auth_on_publish")
        self.auth_on_subscribe: Pair = pair("auth_on_subscribe")
        self.on_register: Pair = pair("on_register")
        self.on_publish: Pair = pair("on_publish")
        self.on_subscribe: Pair = pair("on_subscribe")
        self.on_unsubscribe: Pair = pair("on_unsubscribe")
        self.on_deliver: Pair = pair("on_deliver")
        self.on_auth_m5 = one("on_auth_m5")
        self.on_register_failed = one("on_register_failed")
        self.on_client_wakeup = one("on_client_wakeup")
        self.on_client_offline = one("on_client_offline")
        self.on_client_gone = one("on_client_gone")
        self.on_session_expired = one("on_session_expired")
        self.on_offline_message = one("on_offline_message")
        self.on_message_drop = one("on_message_drop")
        self.on_delivery_complete = one("on_delivery_complete")
        # A plugin's fast path for the per-message events (hooks/recorder.py), or None.
        self.recorder: MessageRecorder | None = hooks.recorder

    def watch(self, watch: Callable[[Chain], Chain] | None) -> None:
        """From now on, call `watch(chain)` in place of each chain (a tracer's); None:
        the chains themselves again."""
        self._watch = watch
        self.load(self._hooks)

    def notify(self, chain: Chain, context: Any) -> None:
        """Fire an event chain (build `context` only after checking the chain is not
        empty: `if chains.x: chains.notify(chains.x, context)`)."""
        chain.notify(context, self.tasks)
