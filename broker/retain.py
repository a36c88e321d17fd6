"""Retained messages: the last retained message per topic [MQTT-3.3.1-5..7]."""

from __future__ import annotations

from collections.abc import Callable

from broker.message import Message
from broker.topics import topic_matches


class RetainedMessages:
    def __init__(self, on_expired: Callable[[str], None] = lambda topic: None) -> None:
        self._by_topic: dict[str, Message] = {}
        self._on_expired = on_expired  # the store deletes its copy too

    def __len__(self) -> int:
        return len(self._by_topic)

    def update(self, message: Message) -> None:
        """Store, replace, or (empty payload) clear the topic's retained message."""
        if message.payload:
            self._by_topic[message.topic] = message
        else:
            self._by_topic.pop(message.topic, None)

    def delete_expired(self, now: float) -> int:
        """Forget every retained message whose expiry has passed, `$` topics included
        (the others go as they are matched); how many."""
        expired = [topic for topic, message in self._by_topic.items() if message.expired(now)]
        for topic in expired:
            del self._by_topic[topic]
            self._on_expired(topic)
        return len(expired)

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        if "+" not in topic_filter and "#" not in topic_filter:
            message = self._by_topic.get(topic_filter)
            found = [message] if message is not None else []
        else:
            found = [m for t, m in self._by_topic.items() if topic_matches(topic_filter, t)]
        expired = [m for m in found if m.expired(now)]
        for message in expired:  # a retained message expires too [MQTT-3.3.2-5]
            del self._by_topic[message.topic]
            self._on_expired(message.topic)
        return [m for m in found if m not in expired] if expired else found
