"""The message recorder: a fast path beside the hooks for a plugin that records every
message event (the event relay).

on_publish, on_deliver and on_delivery_complete run per message and per delivery: as
hooks, each call builds a PublishContext and goes through a chain, which costs more than
the broker's own work for a delivery. A plugin whose `recorder` attribute is a
MessageRecorder gets those three events as plain calls with the broker's own objects
instead, and no context is built for it (so it does not implement the hooks of the same
names; the other plugins' are called as always). One plugin at most may have a recorder.
A QoS 0 flood's run of messages to one topic is told in one call, `published_run`: the
broker makes no objects for those messages.

The objects passed are the broker's: read them, never change them (a recorder may hold
on to a message or a session until the loop turn ends, to know what belongs to one run).
What a recorder may read of them is below, one protocol per object, so that the type
checker holds the broker's classes (ClientState, Session, Message, Delivery) to it. The
compiled recorder (event_relay/_recorder.c) reads these fields by name, at their slot
offsets: a field renamed in the broker must be renamed here, and tests/hooks checks that
the C file reads no other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hooks.spec import MatchedAcl


class RecordedClient(Protocol):
    """The publisher (`published`) or the receiving session (`delivered`, `completed`)."""

    @property
    def client_id(self) -> str: ...

    @property
    def mountpoint(self) -> str:
        """Its topic tree ("": the default)."""

    @property
    def username(self) -> str | None: ...

    @property
    def session_id(self) -> str:
        """The connection's UUID (the last connection's, for an offline session)."""


class RecordedMessage(Protocol):
    @property
    def topic(self) -> str:
        """As the broker keeps it: on a mountpoint "\\0<mountpoint>/<topic>"
        (broker/mountpoints.py `outside` gives the client's topic)."""

    @property
    def payload(self) -> bytes: ...

    @property
    def qos(self) -> int: ...

    @property
    def retain(self) -> bool: ...

    @property
    def acl_name(self) -> str:
        """The label of the publisher's ACL rule that let it in; "" without one."""


class RecordedDelivery(Protocol):
    @property
    def message(self) -> RecordedMessage: ...

    @property
    def qos(self) -> int:
        """The QoS it goes out with (at most the message's)."""

    @property
    def retain(self) -> bool: ...

    @property
    def seq(self) -> int:
        """Its place in the subscriber's stored queue; -1 when the store does not keep it."""


class MessageRecorder(Protocol):
    def published(
        self, client: RecordedClient, message: RecordedMessage, matched_acl: MatchedAcl | None
    ) -> None:
        """A PUBLISH was allowed and is about to be routed (on_publish)."""

    def delivered(self, session: RecordedClient, delivery: RecordedDelivery) -> None:
        """The broker hands `delivery` to the subscriber's connection (on_deliver)."""

    def completed(self, session: RecordedClient, delivery: RecordedDelivery) -> None:
        """The subscriber acknowledged a QoS 1 delivery (PUBACK) or received a QoS 2
        one (PUBREC) (on_delivery_complete)."""

    def published_run(
        self,
        client: RecordedClient,
        topic: str,
        payloads: Sequence[bytes],
        receivers: Sequence[RecordedClient],
        matched_acl: MatchedAcl | None,
    ) -> None:
        """A run of QoS 0 messages from `client` to `topic`, unretained, without
        properties, that no authorization plugin changed (None: none ran; else the ACL
        rule its kept answer names, whose label is each message's acl_name), each
        delivered at QoS 0, unstored, to every one of `receivers` in turn: the broker's
        fast path for QoS 0 floods, which makes no Message or Delivery for them. It means
        exactly this, and must record the same: for each payload, published(client,
        message, matched_acl), then delivered(receiver, delivery) for each receiver."""


# The methods a recorder must have, as the broker calls them (checked when plugins load).
RECORDER_METHODS = ("published", "delivered", "completed", "published_run")
