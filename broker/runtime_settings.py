"""`nautilus admin set KEY=VALUE ...` and `show settings`: the settings a running node
may change, each with when the change takes effect. Not persisted, as VerneMQ's `set`:
the config file is the truth at the next start.

Only settings the broker reads again where they act are here (a limit copied into each
session when it is made acts on the sessions made after; one checked per packet acts at
once). The others, read once at start (listeners, the store, max_message_size, which
the WebSocket listeners size their frames by, ...), need a restart.

A change is checked whole before any of it is applied: a bad key or value (ValueError
naming the key, with the config file's own checks) changes nothing.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_type_hints

from broker.config import BrokerSettings, ClusterSettings, LogSettings, build_section

if TYPE_CHECKING:
    from broker.config import Config

log = logging.getLogger("nautilus.admin")

NEW_CONNECTIONS = "new connections (their CONNECT)"
NEW_SESSIONS = "sessions made from then on (a session that exists keeps its value)"
AT_ONCE = "at once"


@dataclass(frozen=True, slots=True)
class Setting:
    section: str  # of the config file
    key: str
    effect: str  # when a change takes effect

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


_SETTINGS = [
    Setting("broker", "allow_anonymous", NEW_CONNECTIONS),
    Setting("broker", "max_client_id_size", NEW_CONNECTIONS),
    Setting("broker", "max_keepalive", NEW_CONNECTIONS),
    Setting("broker", "max_message_rate", "new connections (each keeps the rate it began with)"),
    Setting("broker", "persistent_client_expiration", NEW_CONNECTIONS),
    Setting("broker", "max_inflight_messages", NEW_SESSIONS),
    Setting("broker", "max_online_messages", NEW_SESSIONS),
    Setting("broker", "max_offline_messages", NEW_SESSIONS),
    Setting("broker", "queue_type", NEW_SESSIONS),
    Setting("broker", "retry_interval", NEW_SESSIONS),
    Setting("broker", "topic_max_depth", "at once (every PUBLISH and SUBSCRIBE)"),
    Setting("broker", "max_subscriptions_per_client", "at once (every SUBSCRIBE)"),
    Setting("broker", "upgrade_outgoing_qos", AT_ONCE),
    Setting(
        "broker",
        "shared_subscription_policy",
        "at once (a client a plugin gave a policy of its own keeps it)",
    ),
    Setting("cluster", "allow_register_during_netsplit", AT_ONCE),
    Setting("cluster", "allow_publish_during_netsplit", AT_ONCE),
    Setting("cluster", "allow_subscribe_during_netsplit", AT_ONCE),
    Setting("cluster", "allow_unsubscribe_during_netsplit", AT_ONCE),
    Setting("cluster", "allow_register_during_outage", AT_ONCE),
    Setting("log", "level", AT_ONCE),
]
SETTINGS = {setting.name: setting for setting in _SETTINGS}
# `set max_message_rate=10` as VerneMQ spells it: a [broker] or [cluster] key alone.
_SHORT = {s.key: s for s in _SETTINGS if s.section != "log"}
_SECTIONS = {"broker": BrokerSettings, "cluster": ClusterSettings, "log": LogSettings}


def setting(name: str) -> Setting:
    found = SETTINGS.get(name) or _SHORT.get(name)
    if found is None:
        raise ValueError(
            f"{name}: not a setting that can change while running "
            f"(those are: {', '.join(SETTINGS)}; the others need a restart)"
        )
    return found


def parse(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """`KEY=VALUE` texts -> {full name: checked value}; ValueError names the key."""
    if not pairs:
        raise ValueError("set: give KEY=VALUE (one or more)")
    values = {}
    for name, text in pairs:
        found = setting(name)
        values[found.name] = _value(found, text)
    return check(values)


def check(values: dict[str, Any]) -> dict[str, Any]:
    """Values as the config file would take them (ConfigError, a ValueError, names the
    key): what a node applies, and what another node sent it."""
    checked = {}
    for name, value in values.items():
        found = setting(name)
        section = build_section(_SECTIONS[found.section], {found.key: value}, found.section)
        checked[found.name] = getattr(section, found.key)
    return checked


def _value(found: Setting, text: str) -> Any:
    """A value typed as its key wants: TOML's true, 10, "x"; on / off too (VerneMQ's)."""
    hint = get_type_hints(_SECTIONS[found.section])[found.key]
    if hint is str or not text:
        return text
    if hint is bool and text.lower() in ("on", "off"):
        return text.lower() == "on"
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a word, for a choice: "lifo", "random"


def apply(config: Config, values: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """Change this node's settings (all of them checked first): a row for each."""
    rows = []
    for name, value in check(values).items():
        found = SETTINGS[name]
        section = getattr(config, found.section)
        previous = getattr(section, found.key)
        setattr(section, found.key, value)
        if name == "log.level":
            logging.getLogger().setLevel(value.upper())
        log.warning("setting %s changed from %r to %r (not persisted)", name, previous, value)
        rows.append({"node": node, "setting": name, "value": value, "previous": previous})
    return rows


def show(config: Config, node: str) -> list[dict[str, Any]]:
    return [
        {
            "node": node,
            "setting": s.name,
            "value": getattr(getattr(config, s.section), s.key),
            "takes_effect": s.effect,
        }
        for s in _SETTINGS
    ]
