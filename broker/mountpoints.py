"""Mountpoints: separate topic trees on one broker (VerneMQ's multitenancy).

A client is on the default tree ("") unless its listener's `mountpoint` or a plugin's
auth_on_register puts it on another. Inside the broker the tree is part of two names, so
that everything keyed by them keeps the trees apart without knowing of mountpoints:

- a topic or filter of mountpoint `m` is `"\\0m/" + topic`: one more first level, which no
  client can write (MQTT strings carry no U+0000) and which wildcards at the first level
  skip, as they skip `$` topics (broker/subscription_trie.py, broker/topics.py). The router, the
  retained messages, the store and the cluster match and keep these names as they are.
- a session's id (`Session.client_id`, the registry's, the store's and the cluster's key)
  is `"m\\0" + client_id`: VerneMQ's subscriber id {Mountpoint, ClientId}. On the default
  tree both names are what the client sent: nothing changes for a broker without
  mountpoints.

What a client, a plugin, an event or an operator sees is the topic and client id as the
client knows them, with the mountpoint beside them: `inside` and `outside` translate at
those edges.
"""

from __future__ import annotations

from broker.subscription_trie import SHARE_PREFIX, parse_shared

_FORBIDDEN = ("/", "+", "#", "\0")


def problem(mountpoint: str) -> str | None:
    """Why `mountpoint` cannot name a tree, or None. A "/" would make one tree a branch of
    another ("a" would see "a/b"'s topics)."""
    for character in _FORBIDDEN:
        if character in mountpoint:
            return f"a mountpoint cannot contain {character!r}: {mountpoint!r}"
    if mountpoint.startswith("$"):
        return f"a mountpoint cannot start with '$': {mountpoint!r}"
    return None


def subscriber_id(mountpoint: str, client_id: str) -> str:
    """The session's key: the client id, on a mountpoint prefixed by it."""
    return f"{mountpoint}\0{client_id}" if mountpoint else client_id


def split_subscriber_id(key: str) -> tuple[str, str]:
    """(mountpoint, client id) of a session's key."""
    mountpoint, separator, client_id = key.partition("\0")
    return (mountpoint, client_id) if separator else ("", key)


def inside(mountpoint: str, topic: str) -> str:
    """A client's topic name or filter as the broker keeps it ($share/<group>/<filter>:
    the filter goes into the tree, the group stays a group of that filter)."""
    if not mountpoint:
        return topic
    shared = parse_shared(topic)
    if shared is not None:
        group, topic_filter = shared
        return f"{SHARE_PREFIX}{group}/\0{mountpoint}/{topic_filter}"
    return f"\0{mountpoint}/{topic}"


def outside(topic: str) -> str:
    """The topic (or filter) as the client of its tree knows it."""
    if topic[:1] == "\0":
        return topic.partition("/")[2]
    shared = parse_shared(topic) if "/\0" in topic else None
    if shared is not None:
        group, topic_filter = shared
        return f"{SHARE_PREFIX}{group}/{outside(topic_filter)}"
    return topic
