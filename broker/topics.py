"""Topic names and topic filters: validation rules of MQTT section 4.7."""

from __future__ import annotations

from functools import lru_cache


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH topic: non-empty, no wildcards [MQTT-4.7.3-1, MQTT-3.3.2-2]. (Depth is a
    broker limit, `topic_max_depth`, checked where it is counted.)"""
    return bool(topic) and "+" not in topic and "#" not in topic


@lru_cache(maxsize=4096)
def valid_topic_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE filter: '+' alone in its level, '#' alone and last [MQTT-4.7.1-1/2]."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a topic name matches a filter, with the '$' rule [MQTT-4.7.2-1] (which keeps
    a mountpoint's topics, "\0<mountpoint>/...", from the default tree's wildcards too)."""
    if topic.startswith(("$", "\0")) and topic_filter[:1] in ("+", "#"):
        return False
    if topic[:1] == "\0":  # a mountpoint's: the rule again, for its own first level
        tree, _, rest = topic.partition("/")
        inner = topic_filter.removeprefix(tree + "/")
        if inner == topic_filter:
            return False
        return topic_matches(inner, rest)
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(topic_levels) or (level != "+" and level != topic_levels[i]):
            return False
    return len(filter_levels) == len(topic_levels)


def acl_matches(acl: tuple[str, ...], request: list[str]) -> bool:
    """VerneMQ's vmq_topic:match, which ACLs use: the request's levels (a subscription's
    wildcards as plain levels: `a/+` is allowed by `a/+` or `a/#`, not by `a/b`) against
    an ACL filter's."""
    n = len(request)
    for i, level in enumerate(acl):
        if level == "#":
            return True  # also when the request ends here: `a/#` matches `a`
        if i >= n or (level != "+" and level != request[i]):
            return False
    return len(acl) == n
