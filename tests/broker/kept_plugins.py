"""Plugins for the kept-decision tests (tests/broker/test_kept_decisions.py), loaded by
`module = "tests.broker.kept_plugins:..."`; each counts how often it is asked."""

from __future__ import annotations

import dataclasses

from hooks import FOREVER, Error, Next, Ok, PublishContext, Result
from plugins.acl import AclPlugin


class Gate:
    """auth_on_publish: allows the topics in `allowed`, refuses the others; its answers
    hold `cache_for` seconds (None: it says nothing, so it is asked every time)."""

    def __init__(self) -> None:
        self.allowed = {"open", "sentinel"}
        self.cache_for: float | None = FOREVER
        self.asked = 0

    def auth_on_publish(self, ctx: PublishContext) -> Result:
        self.asked += 1
        if ctx.topic in self.allowed:
            return Ok(cache_for=self.cache_for)
        return Error(cache_for=self.cache_for)


class Asked:
    """auth_on_publish: no opinion, for ever (the next plugin decides); counts the times
    the chain is asked."""

    def __init__(self) -> None:
        self.asked = 0

    def auth_on_publish(self, ctx: PublishContext) -> Result:
        self.asked += 1
        return Next(cache_for=FOREVER)


class UnkeptAcl(AclPlugin):
    """The acl plugin, its publish answers without their promise: asked every time."""

    def auth_on_publish(self, ctx: PublishContext) -> Result:
        return dataclasses.replace(super().auth_on_publish(ctx), cache_for=None)
