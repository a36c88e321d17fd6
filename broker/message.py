"""An application message as it travels through the broker, its cached wire forms, and
the Delivery of it to one subscriber.

Time: a message with an MQTT 5 Message Expiry Interval gets a deadline on the broker's one
clock (the event loop's `time()`), given by whoever creates it (`now`). Nothing here reads
a clock of its own, so tests can drive expiry with a fake clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from broker.mountpoints import outside
from broker.protocol import MQTT5, Properties, Property, Publish, PublishTemplate

if TYPE_CHECKING:
    from broker.subscription_trie import SharedGroup


class Message:
    """One published message. Shared by every subscriber queue it is routed to.

    `wire` caches encoded PUBLISH packets per wire form (protocol level, QoS, retain flag,
    subscription ids), so a message fanned out to many subscribers is encoded once per
    form, not once per subscriber. A message with an MQTT 5 Message Expiry Interval is
    encoded per send instead: it carries the time it has left [MQTT-3.3.2-6].
    """

    __slots__ = (
        "acl_name",
        "expires_at",
        "payload",
        "properties",
        "qos",
        "raw",
        "raw_level",
        "retain",
        "sender",
        "topic",
        "wire",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        properties: Properties | None = None,
        sender: str | None = None,
        raw: bytes | None = None,
        raw_level: int = 0,
        *,
        now: float | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = {} if properties is None else properties
        self.sender = sender  # subscriber id of the publisher, for No Local
        self.acl_name = ""  # the label of the ACL rule that let it in (events report it)
        self.wire: dict[tuple, PublishTemplate] = {}
        # The PUBLISH as the publisher sent it: for subscribers of the same protocol family
        # at the same QoS and without subscription ids it is the outbound encoding already.
        self.raw = raw
        self.raw_level = raw_level
        self.expires_at: float | None = None
        interval = properties.get(Property.MESSAGE_EXPIRY_INTERVAL) if properties else None
        if interval is not None:
            if now is None:
                raise ValueError("a message with an expiry interval needs the clock's `now`")
            self.expires_at = now + interval
            self.raw = None  # its interval is the original one, not what is left

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def template(
        self, level: int, qos: int, retain: bool, subscription_ids: tuple[int, ...], now: float
    ) -> PublishTemplate:
        """The encoding for a subscriber of `level` (without Topic Alias), cached per form.
        (`now` matters only for a message that expires: it carries the time left.)"""
        if self.expires_at is not None:
            return self._encode(level, qos, retain, subscription_ids, now)
        key = (level, qos, retain, subscription_ids)
        template = self.wire.get(key)
        if template is None:
            raw = self.as_received(level, qos, subscription_ids)
            if raw is not None:
                template = PublishTemplate(raw, retain)
            else:
                template = self._encode(level, qos, retain, subscription_ids, now)
            self.wire[key] = template
        return template

    def as_received(self, level: int, qos: int, subscription_ids: tuple[int, ...]) -> bytes | None:
        """The PUBLISH as the publisher sent it, if a subscriber of `level` at `qos` with
        these subscription ids gets the same bytes (but for its packet id and flags)."""
        raw = self.raw
        if (
            raw is not None
            and qos == self.qos
            and not subscription_ids
            and (level == MQTT5) == (self.raw_level == MQTT5)  # 3.1 and 3.1.1 agree
        ):
            return raw
        return None

    def aliased(
        self,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        now: float,
        alias: int,
        known: bool,
    ) -> PublishTemplate:
        """The MQTT 5 encoding with a Topic Alias: the topic itself only the first time."""
        return self._encode(MQTT5, qos, retain, subscription_ids, now, alias, known)

    def _encode(
        self,
        level: int,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        now: float,
        alias: int | None = None,
        alias_known: bool = False,
    ) -> PublishTemplate:
        properties = self.properties if level == MQTT5 else {}
        if level == MQTT5 and (subscription_ids or self.expires_at is not None or alias):
            properties = dict(properties)
            if subscription_ids:
                properties[Property.SUBSCRIPTION_IDENTIFIER] = list(subscription_ids)
            if self.expires_at is not None:
                # Whole seconds left, rounded up; rounded to the microsecond first, since
                # (t + 3600) - t may be 3600.00000000006 in floats, which is not 3601.
                left = math.ceil(round(self.expires_at - now, 6))
                properties[Property.MESSAGE_EXPIRY_INTERVAL] = max(left, 1)
            if alias:
                properties[Property.TOPIC_ALIAS] = alias
        topic = "" if alias_known else outside(self.topic)  # as its tree's clients know it
        packet = Publish(topic, self.payload, qos, retain, False, None, properties)
        return PublishTemplate.encode(packet, level)


class Delivery:
    """One message on its way to one subscriber: the QoS and retain flag it goes out with,
    the subscription identifiers to carry, and the shared group it came through, if any
    (so that a session that ends can hand it back to the group)."""

    __slots__ = ("group", "message", "qos", "retain", "seq", "sub_ids")

    def __init__(
        self,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...] = (),
        group: SharedGroup | None = None,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.group = group
        self.seq = -1  # its sequence number in the subscriber's stored queue; -1: not stored

    def __repr__(self) -> str:
        return f"<Delivery {self.message.topic!r} qos={self.qos}>"

    def replace(self, message: Message) -> Delivery:
        """The same delivery of another message (a plugin rewrote it)."""
        delivery = Delivery(message, self.qos, self.retain, self.sub_ids, self.group)
        delivery.seq = self.seq  # still the same entry in the store
        return delivery


class TopicAliases:
    """Topic Aliases the broker assigned towards one MQTT 5 client [3.3.2.3.4].

    The first `room` distinct topics get aliases 1..room for the life of the connection;
    later topics go out in full. An alias counts as known only once a PUBLISH that set
    it was really sent (`learned`), so a dropped message never leaves the client without
    a mapping it is later expected to have.
    """

    __slots__ = ("by_topic", "room")

    def __init__(self, room: int) -> None:
        self.room = room
        self.by_topic: dict[str, int] = {}

    def lookup(self, topic: str) -> tuple[int | None, bool]:
        """(alias, whether the client knows it already); (None, False): send in full."""
        alias = self.by_topic.get(topic)
        if alias is not None:
            return alias, True
        if len(self.by_topic) < self.room:
            return len(self.by_topic) + 1, False
        return None, False

    def learned(self, topic: str, alias: int) -> None:
        self.by_topic[topic] = alias
