"""A database row's ACLs (VerneMQ's vmq_diversity_cache), as plain values: parsed from
the row's JSON, with `%m`, `%u` and `%c` replaced by the client's, and matched against a
PUBLISH or a subscription.

An ACL object: `pattern` (an MQTT filter, wildcards allowed, `%m`/`%u`/`%c` levels
substituted), `max_qos` (default 2), and for publishing `max_payload_size` (default: no
limit) and `allowed_retain` (default true), and `modifiers` (what an allowed PUBLISH is
changed into: topic, qos, retain, payload). A request is allowed by the first ACL whose
pattern matches it and whose limits it keeps; none: refused. A subscription's filter is
matched as VerneMQ does: its wildcards are plain levels (`a/+` is allowed by `a/+` or
`a/#`, not by `a/b`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.topics import acl_matches

MAX_QOS = 2
NO_LIMIT = 1 << 28  # MQTT's largest payload: "no limit"
_PUBLISH_MODIFIERS = {"topic", "qos", "retain", "payload"}


class AclError(ValueError):
    """A row's ACL the plugin cannot use (says which and why)."""


@dataclass(frozen=True, slots=True)
class Acl:
    levels: tuple[str, ...]
    max_qos: int = MAX_QOS
    max_payload_size: int = NO_LIMIT
    allowed_retain: bool = True
    modifiers: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pattern(self) -> str:
        return "/".join(self.levels)

    def allows_publish(self, levels: list[str], qos: int, size: int, retain: bool) -> bool:
        return (
            qos <= self.max_qos
            and size <= self.max_payload_size
            and (self.allowed_retain or not retain)
            and acl_matches(self.levels, levels)
        )

    def allows_subscribe(self, levels: list[str], qos: int) -> bool:
        return qos <= self.max_qos and acl_matches(self.levels, levels)


@dataclass(frozen=True, slots=True)
class Acls:
    """One client's: what it may publish and subscribe to."""

    publish: tuple[Acl, ...] = ()
    subscribe: tuple[Acl, ...] = ()

    def for_publish(self, topic: str, qos: int, size: int, retain: bool) -> Acl | None:
        levels = topic.split("/")
        return next((a for a in self.publish if a.allows_publish(levels, qos, size, retain)), None)

    def for_subscribe(self, topic: str, qos: int) -> Acl | None:
        levels = topic.split("/")
        return next((a for a in self.subscribe if a.allows_subscribe(levels, qos)), None)


def parse_acls(
    value: Any, kind: str, mountpoint: str, client_id: str, username: str
) -> tuple[Acl, ...]:
    """A row's publish_acl or subscribe_acl (`kind`): JSON text, a list already decoded
    (a driver's json type), or null (nothing allowed)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise AclError(f"{kind}: not JSON ({exc})") from None
    if not isinstance(value, list):
        raise AclError(f"{kind}: expected a JSON array of ACL objects, got {type(value).__name__}")
    names = {"%m": mountpoint, "%u": username, "%c": client_id}
    return tuple(_acl(item, kind, names) for item in value)


def _acl(item: Any, kind: str, names: Mapping[str, str]) -> Acl:
    if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
        raise AclError(f"{kind}: an ACL object needs a string pattern, got {item!r}")
    levels = tuple(names.get(level, level) for level in item["pattern"].split("/"))
    fields: dict[str, Any] = {"levels": levels}
    max_qos = item.get("max_qos", MAX_QOS)
    if type(max_qos) not in (int, float) or not 0 <= max_qos <= MAX_QOS:
        raise AclError(f"{kind} {item['pattern']!r}: max_qos must be 0, 1 or 2, got {max_qos!r}")
    fields["max_qos"] = int(max_qos)
    if kind == "publish_acl":
        size = item.get("max_payload_size", NO_LIMIT)
        if type(size) not in (int, float) or not 0 <= size <= NO_LIMIT:
            raise AclError(f"{kind} {item['pattern']!r}: max_payload_size must be 0..{NO_LIMIT}")
        fields["max_payload_size"] = int(size)
        retain = item.get("allowed_retain", True)
        if not isinstance(retain, bool):
            raise AclError(f"{kind} {item['pattern']!r}: allowed_retain must be true or false")
        fields["allowed_retain"] = retain
        fields["modifiers"] = _publish_modifiers(item.get("modifiers"), item["pattern"])
    elif item.get("modifiers"):
        raise AclError(f"{kind} {item['pattern']!r}: subscribe modifiers are not supported")
    return Acl(**fields)


def _publish_modifiers(value: Any, pattern: str) -> dict[str, Any]:
    if not value:
        return {}
    if not isinstance(value, dict) or not set(value) <= _PUBLISH_MODIFIERS:
        raise AclError(
            f"publish_acl {pattern!r}: modifiers must be an object of "
            f"{', '.join(sorted(_PUBLISH_MODIFIERS))}, got {value!r}"
        )
    modifiers = dict(value)
    if "payload" in modifiers:
        modifiers["payload"] = str(modifiers["payload"]).encode()
    if "qos" in modifiers and modifiers["qos"] not in (0, 1, 2):
        raise AclError(f"publish_acl {pattern!r}: modifier qos must be 0, 1 or 2")
    if "retain" in modifiers and not isinstance(modifiers["retain"], bool):
        raise AclError(f"publish_acl {pattern!r}: modifier retain must be true or false")
    return modifiers
