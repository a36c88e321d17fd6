"""An application message as it travels through the broker, and its cached wire forms."""

from __future__ import annotations

from broker.protocol import Properties, Publish, PublishTemplate

MQTT5 = 5


class Message:
    """One published message. Shared by every subscriber queue it is routed to.

    `wire` caches encoded PUBLISH packets per wire form (protocol level, QoS, retain flag,
    subscription ids), so a message fanned out to many subscribers is encoded once per
    form, not once per subscriber.
    """

    __slots__ = ("payload", "properties", "qos", "retain", "sender", "topic", "wire")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        properties: Properties | None = None,
        sender: str | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties or {}
        self.sender = sender  # client id of the publisher, for No Local
        self.wire: dict[tuple, PublishTemplate] = {}

    def template(
        self, level: int, qos: int, retain: bool, subscription_ids: tuple[int, ...]
    ) -> PublishTemplate:
        key = (level, qos, retain, subscription_ids)
        template = self.wire.get(key)
        if template is None:
            properties = self.properties if level == MQTT5 else {}
            if subscription_ids and level == MQTT5:
                properties = {**properties, 0x0B: list(subscription_ids)}
            packet = Publish(self.topic, self.payload, qos, retain, False, None, properties)
            template = self.wire[key] = PublishTemplate(packet, level)
        return template
