"""An application message as it travels through the broker, and its cached wire forms."""

from __future__ import annotations

from broker.protocol import Properties, Property, Publish, PublishTemplate

MQTT5 = 5


class Message:
    """One published message. Shared by every subscriber queue it is routed to.

    `wire` caches encoded PUBLISH packets per wire form (protocol level, QoS, retain flag,
    subscription ids), so a message fanned out to many subscribers is encoded once per
    form, not once per subscriber.
    """

    __slots__ = (
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
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties or {}
        self.sender = sender  # client id of the publisher, for No Local
        self.wire: dict[tuple, PublishTemplate] = {}
        # The PUBLISH as the publisher sent it: for subscribers of the same protocol family
        # at the same QoS and without subscription ids it is the outbound encoding already.
        self.raw = raw
        self.raw_level = raw_level

    def template(
        self, level: int, qos: int, retain: bool, subscription_ids: tuple[int, ...]
    ) -> PublishTemplate:
        key = (level, qos, retain, subscription_ids)
        template = self.wire.get(key)
        if template is None:
            if (
                self.raw is not None
                and qos == self.qos
                and not subscription_ids
                and (level == MQTT5) == (self.raw_level == MQTT5)  # 3.1 and 3.1.1 agree
            ):
                template = PublishTemplate(self.raw, retain)
            else:
                properties = self.properties if level == MQTT5 else {}
                if subscription_ids and level == MQTT5:
                    properties = {
                        **properties,
                        Property.SUBSCRIPTION_IDENTIFIER: list(subscription_ids),
                    }
                packet = Publish(self.topic, self.payload, qos, retain, False, None, properties)
                template = PublishTemplate.encode(packet, level)
            self.wire[key] = template
        return template
