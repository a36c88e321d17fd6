"""The subscription trie: which sessions want a topic, at what QoS, with which options.

Strategy: one trie node per filter level; '+' and '#' are ordinary child keys looked up on
purpose while matching. A node's `subscribers` maps a subscriber (a Session) to its
SubOptions for the filter ending there. `match` folds every matching subscription of one
subscriber into one Route (one copy per client, at the highest granted QoS, with every
subscription identifier [MQTT-3.3.4-2/3]) and caches the routes per topic until the next
subscribe or unsubscribe: on a busy broker subscriptions change rarely and topics repeat.

Shared subscriptions (`$share/<group>/<filter>`) live in the same trie: the node of
<filter> keeps its groups by name in `groups`, each a SharedGroup holding its member
sessions. `match` never sees them; `match_shared` returns the groups a topic reaches
(cached the same way) and is only called while some group exists, so ordinary fan-out
does no extra work.

The router only matches: it never delivers. What a subscriber gets (QoS, retain flag,
subscription ids) is decided by the broker from the Route or the group's options.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from random import random
from typing import Any

MATCH_CACHE_SIZE = 65536
SHARE_PREFIX = "$share/"


def _wildcards_at_root(topic: str) -> bool:
    """Wildcards at the first level never match topics starting with '$' [MQTT-4.7.2-1],
    nor a mountpoint's topics ("\0<mountpoint>/...": broker/mountpoints.py)."""
    return not topic.startswith(("$", "\0"))


def _wildcards_below_root(levels: list[str]) -> bool:
    """A mountpoint's first level is its name: the '$' rule applies to the level after
    it, the first of the tree's own topic."""
    return not (levels[0][:1] == "\0" and len(levels) > 1 and levels[1][:1] == "$")


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, filter) of a `$share/<group>/<filter>` filter, None for any other filter.
    The parts are not validated here (see topics.valid_shared_filter)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, _, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    return group, rest


@dataclass(slots=True, frozen=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


def shared_options(
    qos: int,
    no_local: bool = False,
    retain_as_published: bool = False,
    retain_handling: int = 0,
    subscription_id: int | None = None,
) -> SubOptions:
    """SubOptions, one object for all the subscriptions with the same ones (they are
    immutable, and most clients subscribe alike): 72 bytes a subscription saved. With a
    subscription identifier, one of their own (the identifiers are too many to keep)."""
    if subscription_id is not None:
        return SubOptions(qos, no_local, retain_as_published, retain_handling, subscription_id)
    return _common_options(qos, no_local, retain_as_published, retain_handling)


@functools.cache  # at most 3 x 2 x 2 x 3 of them
def _common_options(
    qos: int, no_local: bool, retain_as_published: bool, retain_handling: int
) -> SubOptions:
    return SubOptions(qos, no_local, retain_as_published, retain_handling)


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


class SharedGroup:
    """The members of one shared subscription (a share name on one filter)."""

    __slots__ = ("_cursor", "_local", "_order", "filter", "held", "members", "name")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        self.filter = topic_filter
        self.members: dict[Any, SubOptions] = {}  # Session -> its subscription options
        self._order: tuple[Any, ...] = ()  # the members, kept as a tuple for pick()
        self._local: tuple[Any, ...] = ()  # those on this node (a cluster has others)
        self._cursor = 0
        self.held = False  # publishers wait for some member to drain (broker/flow.py)

    def __repr__(self) -> str:
        return f"<SharedGroup {self.name!r} {self.filter!r} members={len(self.members)}>"

    def add(self, member: Any, options: SubOptions) -> bool:
        """Add or update a member; True when it is new."""
        is_new = member not in self.members
        self.members[member] = options
        self._reorder()
        return is_new

    def _reorder(self) -> None:
        self._order = tuple(self.members)
        self._local = tuple(m for m in self._order if getattr(m, "local", True))

    def remove(self, member: Any) -> bool:
        """Remove a member; False when it was not one."""
        if self.members.pop(member, None) is None:
            return False
        self._reorder()
        return True

    def pick(self, policy: str) -> Any | None:
        """The member that gets the next message. `round_robin` starts from the member
        after the last one picked, the others from a random member; from there the first
        online member whose queue is below its high-water mark gets it, else the first
        online member, else (nobody online) the starting member's queue. So a slow member
        does not hold the group's publishers back while another member has room.
        In a cluster, `local_only` picks among this node's members only, `prefer_local`
        among them while one is online (then among all)."""
        members = self._order
        local = self._local
        if len(local) != len(members) and (
            policy == "local_only" or (policy == "prefer_local" and any(m.online for m in local))
        ):
            members = local
        count = len(members)
        if not count:
            return None
        start = self._cursor % count if policy == "round_robin" else int(random() * count)
        member = members[start]  # the common case first: it is online and has room
        if member.online and not member.full():
            self._cursor = start + 1
            return member
        fallback = None
        for index in range(start, start + count):
            member = members[index - count if index >= count else index]
            if member.online:
                if not member.full():
                    self._cursor = index + 1
                    return member
                if fallback is None:
                    fallback = member
        self._cursor = start + 1
        return members[start] if fallback is None else fallback

    # -- as broker.flow sees a group that holds publishers (flow.Subscriber) -------------

    @property
    def client_id(self) -> str:
        return f"$share/{self.name}/{self.filter}"

    @property
    def progress(self) -> int:
        return sum(member.progress for member in self._order)

    @property
    def stuck(self) -> bool:
        return False  # a group is never stuck itself: its members are

    @stuck.setter
    def stuck(self, stuck: bool) -> None:
        """No member delivered anything for slow_subscriber_timeout: every full one is
        stuck (each stops being stuck once it delivers again)."""
        for member in self._order:
            if member.online and member.full():
                member.stuck = stuck

    def watched(self) -> tuple[Any, ...]:
        return tuple(member for member in self._order if member.online)

    def full(self) -> bool:
        """Whether a publisher must wait before routing to this group (flow control):
        some member is online and every online member is at its high-water mark."""
        online = False
        for member in self._order:
            if member.online:
                if not member.full():
                    return False
                online = True
        return online


# Nothing below a node, subscribed at it or grouped at it: one empty dict shared by every
# node until it holds something of its own (a client that subscribes to a topic of its
# own makes nodes of its own, and three empty dicts each would cost 192 bytes a node).
# Never written to: a node replaces it with a dict of its own first (the methods below).
_NONE: dict[Any, Any] = {}


class _Node:
    __slots__ = ("children", "groups", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = _NONE
        self.subscribers: dict[Any, SubOptions] = _NONE
        self.groups: dict[str, SharedGroup] = _NONE

    def child(self, level: str) -> _Node:
        """The node below this one at `level`, made if there is none."""
        children = self.children
        if children is _NONE:
            children = self.children = {}
        node = children.get(level)
        if node is None:
            # The level's string is shared: a client's own topic repeats its levels
            # ("devices/<id>/state": every client's "state" is one string).
            node = children[sys.intern(level)] = _Node()
        return node

    def subscribe(self, subscriber: Any, options: SubOptions) -> bool:
        """Subscribe at this node; True when the subscriber was not subscribed here."""
        subscribers = self.subscribers
        if subscribers is _NONE:
            subscribers = self.subscribers = {}
        is_new = subscriber not in subscribers
        subscribers[subscriber] = options
        return is_new

    def add_group(self, group: SharedGroup) -> None:
        if self.groups is _NONE:
            self.groups = {}
        self.groups[group.name] = group


class SubscriptionTrie:
    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, list[Route]] = {}
        self._shared_cache: dict[str, list[SharedGroup]] = {}
        self.subscription_count = 0
        self.group_count = 0  # shared groups in the trie

    def subscribe(self, subscriber: Any, topic_filter: str, options: SubOptions) -> bool:
        """Add or replace a subscription; True when it is new [MQTT-3.8.4-3].
        A `$share/<group>/<filter>` filter makes the subscriber a member of that group."""
        shared = parse_shared(topic_filter)
        node = self._root
        for level in (topic_filter if shared is None else shared[1]).split("/"):
            node = node.child(level)
        if shared is None:
            is_new = node.subscribe(subscriber, options)
            self._cache.clear()
        else:
            group = node.groups.get(shared[0])
            if group is None:
                group = SharedGroup(*shared)
                node.add_group(group)
                self.group_count += 1
            is_new = group.add(subscriber, options)
            self._shared_cache.clear()
        self.subscription_count += is_new
        return is_new

    def unsubscribe(self, subscriber: Any, topic_filter: str) -> bool:
        """Remove a subscription; False when there was none. Empty branches are pruned."""
        shared = parse_shared(topic_filter)
        levels = (topic_filter if shared is None else shared[1]).split("/")
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        node = path[-1]
        if shared is None:
            if node.subscribers.pop(subscriber, None) is None:
                return False
            self._cache.clear()
        else:
            group = node.groups.get(shared[0])
            if group is None or not group.remove(subscriber):
                return False
            if not group.members:
                del node.groups[shared[0]]
                self.group_count -= 1
            self._shared_cache.clear()
        self.subscription_count -= 1
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.children or node.subscribers or node.groups:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def group(self, topic_filter: str) -> SharedGroup | None:
        """The SharedGroup of a `$share/<group>/<filter>` filter, if it has members."""
        shared = parse_shared(topic_filter)
        if shared is None:
            return None
        node = self._root
        for level in shared[1].split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.groups.get(shared[0])

    def match_shared(self, topic: str) -> list[SharedGroup]:
        """The shared groups whose filter matches `topic`."""
        groups = self._shared_cache.get(topic)
        if groups is None:
            found: dict[int, SharedGroup] = {}
            self._collect(
                self._root, topic.split("/"), 0, _wildcards_at_root(topic), found, self._add_groups
            )
            groups = list(found.values())
            if len(self._shared_cache) >= MATCH_CACHE_SIZE:
                self._shared_cache.clear()
            self._shared_cache[topic] = groups
        return groups

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
        self._collect(self._root, levels, 0, _wildcards_at_root(topic), by_subscriber, self._add)
        return [route.fold() for route in by_subscriber.values()]

    def _collect(
        self, node: _Node, levels: list[str], depth: int, wildcards: bool, out: dict, add
    ) -> None:
        children = node.children
        if wildcards:
            hash_node = children.get("#")
            if hash_node is not None:  # '#' also matches the parent level [MQTT-4.7.1-2]
                add(hash_node, out)
        if depth == len(levels):
            add(node, out)
            return
        exact = children.get(levels[depth])
        if exact is not None:
            below = True if depth else _wildcards_below_root(levels)
            self._collect(exact, levels, depth + 1, below, out, add)
        if wildcards:
            plus = children.get("+")
            if plus is not None:
                self._collect(plus, levels, depth + 1, True, out, add)

    @staticmethod
    def _add_groups(node: _Node, out: dict) -> None:
        for group in node.groups.values():
            out[id(group)] = group

    @staticmethod
    def _add(node: _Node, out: dict) -> None:
        for subscriber, options in node.subscribers.items():
            route = out.get(subscriber)
            if route is None:
                out[subscriber] = Route(subscriber, [options])
            else:
                route.options.append(options)
