"""The ACL plugin: auth_on_publish and auth_on_subscribe (and their _m5 twins) from a file.

Publish: Ok when a rule allows writing the topic, else NEXT (VerneMQ's vmq_acl never
denies on its own: with no other plugin, the exhausted chain refuses). Subscribe, the
Courier way: each filter is checked on its own; Ok with a `topics` modifier refusing the
filters no rule allows to be read (0x87, which MQTT 3 clients see as 0x80), NEXT when none
is allowed. The only Error is a label's publish rate limit: `rate_limit_exceeded`.
The rule that allowed a publish travels as Courier's `matched_acl` modifier (its label
and pattern; the event relay reports it and samples by it), and an allowed subscription's
rule is noted on its TopicRequest.

Per message the work is a dict lookup: each connection keeps its rules with the
substitutions resolved (in ctx.attributes, rebuilt when the rules change), and decisions
are cached per (client, topic) in bounded dicts cleared on every reload.

A publish decision holds until the rules change (`cache_for=FOREVER`, hooks/decisions.py),
or until the client's token expires (the `exp` of its claims), so the broker keeps it per
connection and stops asking; every reload calls `forget_decisions()`. A decision under a
label's rate limit is not kept: each message must be counted here.
"""

from __future__ import annotations

import dataclasses
import logging
from time import monotonic, time

from broker.config import ConfigError
from broker.protocol import ReasonCode
from hooks import (
    FOREVER,
    NEXT,
    Error,
    MatchedAcl,
    Metric,
    Next,
    Ok,
    PublishContext,
    Result,
    SubscribeContext,
    forget_decisions,
)
from plugins.acl.reloader import Reloader, describe, load
from plugins.acl.rules import ClientView, RuleSet
from plugins.acl.schema import Config as AclConfig

log = logging.getLogger("nautilus.plugins.acl")

CACHE_SIZE = 100_000  # decisions kept per access; the oldest goes first
VIEW = "acl.view"  # this plugin's entry in ctx.attributes
CLAIMS = "jwt_claims"  # where auth_jwt leaves the token's claims
REFUSED = int(ReasonCode.NOT_AUTHORIZED)
RATE_LIMITED = Error("rate_limit_exceeded", int(ReasonCode.QUOTA_EXCEEDED))
_OK = Ok()
NO_RULE = Next(cache_for=FOREVER)  # no rule allows it: so until the rules change


class AclPlugin:
    Config = AclConfig

    def __init__(self, config: AclConfig) -> None:
        self.config = config
        for label, limit in config.publish_rate_limits.items():
            if limit < 1:
                raise ConfigError(
                    f"plugins.acl.publish_rate_limits.{label}: must be 1 or more, got {limit}"
                )
        try:
            stamp, self.rules = load(config.acl_file)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"plugins.acl.acl_file: {describe(config.acl_file, exc)}") from None
        self.reloader = Reloader(config.acl_file, config.acl_reload_interval, stamp, self.swap)
        # Decisions per (view key, topic): read -> the allowing rule or None; write ->
        # (NEXT or Ok with the allowing rule, the label whose rate limit applies or None).
        self._reads: dict[tuple[str, str], MatchedAcl | None] = {}
        self._writes: dict[tuple[str, str], tuple[Result, str | None]] = {}
        self._limits = dict(config.publish_rate_limits)
        self._counts: dict[str, int] = {}
        self._window_end = 0.0
        self.rate_limited = 0  # messages refused by a rate limit

    def start(self) -> None:
        log.info("acl file %s: %d rules", self.config.acl_file, len(self.rules))
        self.reloader.start()

    def stop(self) -> None:
        self.reloader.stop()

    def swap(self, rules: RuleSet) -> None:
        """Use these rules from now on (the reloader calls this on the loop)."""
        self.rules = rules
        self._reads, self._writes = {}, {}
        forget_decisions()  # the broker's kept publish decisions were made by the old rules

    # -- hooks -------------------------------------------------------------------------

    def auth_on_publish(self, ctx: PublishContext) -> Result:
        view = self._view(ctx)
        verdict = self._writes.get((view.key, ctx.topic))
        if verdict is None:
            verdict = self._decide_write(view, ctx.topic)
        result, limited = verdict
        if limited is not None:  # counted per message: never kept by the broker
            return result if self._admit(limited) else RATE_LIMITED
        expires = _expiry(ctx.attributes.get(CLAIMS))
        if expires is None:
            return result
        return dataclasses.replace(result, cache_for=max(expires - time(), 0.0))

    def auth_on_subscribe(self, ctx: SubscribeContext) -> Result:
        view = self._view(ctx)
        granted = []
        allowed = 0
        for request in ctx.topics:
            matched = self._readable(view, request.topic)
            if matched is not None:
                request.matched_acl = matched
                granted.append((request.topic, request.qos))
                allowed += 1
            else:
                granted.append((request.topic, REFUSED))
        if allowed == len(granted):
            return _OK
        return Ok({"topics": granted}) if allowed else NEXT

    # -- internals ---------------------------------------------------------------------

    def _view(self, ctx: PublishContext | SubscribeContext) -> ClientView:
        attributes = ctx.attributes
        view = attributes.get(VIEW)
        if (
            view is None
            or view.rules is not self.rules
            or view.claims is not attributes.get(CLAIMS)
            or view.client_id != ctx.client_id
            or view.username != ctx.username
            or view.mountpoint != ctx.mountpoint
        ):
            view = attributes[VIEW] = self.rules.view(
                ctx.client_id, ctx.username, ctx.mountpoint, attributes.get(CLAIMS)
            )
        return view

    def _decide_write(self, view: ClientView, topic: str) -> tuple[Result, str | None]:
        """(NEXT, None), or (Ok naming the rule, the label whose rate limit applies or
        None); cached."""
        rule = view.check("write", topic)
        if rule is None:
            verdict: tuple[Result, str | None] = (NO_RULE, None)
        else:
            matched = MatchedAcl(rule.label or "", view.pattern(rule))
            if rule.label in self._limits:
                verdict = (Ok({"matched_acl": matched}), rule.label)
            else:
                verdict = (Ok({"matched_acl": matched}, cache_for=FOREVER), None)
        _remember(self._writes, (view.key, topic), verdict)
        return verdict

    def _readable(self, view: ClientView, topic: str) -> MatchedAcl | None:
        """The rule that allows reading `topic`, or None; cached."""
        key = (view.key, topic)
        if key in self._reads:
            return self._reads[key]
        rule = view.check("read", topic)
        matched = None if rule is None else MatchedAcl(rule.label or "", view.pattern(rule))
        _remember(self._reads, key, matched)
        return matched

    def metrics(self) -> list[Metric]:
        """For /metrics (hooks.Metric)."""
        return [
            Metric("acl_rate_limited", self.rate_limited, help="publishes refused by a rate limit"),
            Metric("acl_rules", len(self.rules), "gauge", help="rules loaded from acl_file"),
        ]

    def _admit(self, label: str) -> bool:
        """Count one message for `label`; False once over its limit in this second."""
        now = monotonic()
        if now >= self._window_end:
            self._counts.clear()
            self._window_end = now + 1.0
        count = self._counts[label] = self._counts.get(label, 0) + 1
        if count > self._limits[label]:
            self.rate_limited += 1
            return False
        return True


def _expiry(claims: object) -> float | None:
    """When the client's token expires (its `exp`, seconds since the epoch), if it has
    one: no decision is kept past it."""
    if not isinstance(claims, dict):
        return None
    exp = claims.get("exp")
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        return float(exp)
    return None


def _remember(cache: dict, key: tuple[str, str], verdict: object) -> None:
    if len(cache) >= CACHE_SIZE:
        del cache[next(iter(cache))]  # the oldest
    cache[key] = verdict
