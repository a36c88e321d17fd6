"""The subscription trie: which sessions want a topic, at what QoS, with which options.

Strategy: one trie node per filter level; '+' and '#' are ordinary child keys looked up on
purpose while matching. A node's `subscribers` maps a subscriber (a Session) to its
SubOptions for the filter ending there. `match` folds every matching subscription of one
subscriber into one Route (one copy per client, at the highest granted QoS, with every
subscription identifier [MQTT-3.3.4-2/3]) and caches the routes per topic until the next
subscribe or unsubscribe: on a busy broker subscriptions change rarely and topics repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MATCH_CACHE_SIZE = 65536


@dataclass(slots=True, frozen=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


@dataclass(slots=True)
class Route:
    """One subscriber's share of a topic: every subscription of it that matched."""

    subscriber: Any
    options: list[SubOptions]
    qos: int = 0
    subscription_ids: tuple[int, ...] = ()
    retain_as_published: bool = False
    no_local: bool = False  # some matching subscription has No Local set

    def fold(self) -> Route:
        self.qos = max(o.qos for o in self.options)
        self.subscription_ids = tuple(
            o.subscription_id for o in self.options if o.subscription_id is not None
        )
        self.retain_as_published = any(o.retain_as_published for o in self.options)
        self.no_local = any(o.no_local for o in self.options)
        return self

    def without_no_local(self) -> Route | None:
        """The route seen by the publisher itself: No Local subscriptions left out."""
        kept = [o for o in self.options if not o.no_local]
        return Route(self.subscriber, kept).fold() if kept else None


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    subscribers: dict[Any, SubOptions] = field(default_factory=dict)


class Router:
    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, list[Route]] = {}
        self.subscription_count = 0

    def subscribe(self, subscriber: Any, topic_filter: str, options: SubOptions) -> bool:
        """Add or replace a subscription; True when it is new [MQTT-3.8.4-3]."""
        node = self._root
        for level in topic_filter.split("/"):
            node = node.children.setdefault(level, _Node())
        is_new = subscriber not in node.subscribers
        node.subscribers[subscriber] = options
        self.subscription_count += is_new
        self._cache.clear()
        return is_new

    def unsubscribe(self, subscriber: Any, topic_filter: str) -> bool:
        """Remove a subscription; False when there was none. Empty branches are pruned."""
        path = [self._root]
        for level in topic_filter.split("/"):
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        if path[-1].subscribers.pop(subscriber, None) is None:
            return False
        self.subscription_count -= 1
        self._cache.clear()
        levels = topic_filter.split("/")
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.children or node.subscribers:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def match(self, topic: str) -> list[Route]:
        routes = self._cache.get(topic)
        if routes is None:
            routes = self._match(topic)
            if len(self._cache) >= MATCH_CACHE_SIZE:
                self._cache.clear()
            self._cache[topic] = routes
        return routes

    def _match(self, topic: str) -> list[Route]:
        by_subscriber: dict[Any, Route] = {}
        levels = topic.split("/")
        # Wildcards at the first level never match topics starting with '$' [MQTT-4.7.2-1].
        self._collect(self._root, levels, 0, not topic.startswith("$"), by_subscriber)
        return [route.fold() for route in by_subscriber.values()]

    def _collect(
        self, node: _Node, levels: list[str], depth: int, wildcards: bool, out: dict
    ) -> None:
        children = node.children
        if wildcards:
            hash_node = children.get("#")
            if hash_node is not None:  # '#' also matches the parent level [MQTT-4.7.1-2]
                self._add(hash_node, out)
        if depth == len(levels):
            self._add(node, out)
            return
        exact = children.get(levels[depth])
        if exact is not None:
            self._collect(exact, levels, depth + 1, True, out)
        if wildcards:
            plus = children.get("+")
            if plus is not None:
                self._collect(plus, levels, depth + 1, True, out)

    @staticmethod
    def _add(node: _Node, out: dict) -> None:
        for subscriber, options in node.subscribers.items():
            route = out.get(subscriber)
            if route is None:
                out[subscriber] = Route(subscriber, [options])
            else:
                route.options.append(options)
