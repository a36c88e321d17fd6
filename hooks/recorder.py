"""The message recorder: a fast path beside the hooks for a plugin that records every
message event (the event relay).

on_publish, on_deliver and on_delivery_complete run per message and per delivery: as
hooks, each call builds a PublishContext and goes through a chain, which costs more than
the broker's own work for a delivery. A plugin whose `recorder` attribute is a
MessageRecorder gets those three events as plain calls with the broker's own objects
instead, and no context is built for it (so it does not implement the hooks of the same
names; the other plugins' are called as always). One plugin at most may have a recorder.

The objects passed are the broker's: read them, never change them (a recorder may hold
on to a message or a session until the loop turn ends, to know what belongs to one run):
- `client` (published) and `session` (delivered, completed) have `client_id`,
  `username` and `session_id` (the connection's UUID);
- `message` has `topic`, `payload`, `qos`, `retain` and `acl_name` (the publisher's ACL
  label, "" without one);
- `delivery` has `message`, `qos`, `retain` and `seq` (>= 0 when the store keeps it).
"""

from __future__ import annotations

from typing import Any, Protocol

from hooks.spec import MatchedAcl


class MessageRecorder(Protocol):
    def published(self, client: Any, message: Any, matched_acl: MatchedAcl | None) -> None:
        """A PUBLISH was allowed and is about to be routed (on_publish)."""

    def delivered(self, session: Any, delivery: Any) -> None:
        """The broker hands `delivery` to the subscriber's connection (on_deliver)."""

    def completed(self, session: Any, delivery: Any) -> None:
        """The subscriber acknowledged a QoS 1 delivery (PUBACK) or received a QoS 2
        one (PUBREC) (on_delivery_complete)."""
