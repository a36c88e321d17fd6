"""Who decides a CONNECT, a PUBLISH and a SUBSCRIBE, as configured: the plugins in each
deciding chain, and the settings that take a chain out of the decision.

The trap this exists for: `[broker] allow_anonymous = true` (the default, for a broker
on loopback) means auth_on_register is never called (VerneMQ's rule), so enabling
auth_jwt or passwd while forgetting that key leaves every client in, a bad token
included, while the log says `plugin auth_jwt enabled`. `warnings` names such
combinations; start-up logs them and `nautilus check-config` prints them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from broker.config import PLUGIN_TABLES, Config

# What a client asks for -> the hooks that decide it (v4 and MQTT 5 names).
DECISIONS = {
    "CONNECT": ("auth_on_register", "auth_on_register_m5"),
    "PUBLISH": ("auth_on_publish", "auth_on_publish_m5"),
    "SUBSCRIBE": ("auth_on_subscribe", "auth_on_subscribe_m5"),
    "AUTH": ("on_auth_m5",),  # MQTT 5 enhanced authentication
}


def table(name: str) -> str:
    """The config table a plugin comes from: `plugins.auth_jwt`, or a table of its own
    (`event_relay`, `bridges`), whose name the plugin has."""
    return name if name in PLUGIN_TABLES else f"plugins.{name}"


def deciders(plugins: list[tuple[str, Any]]) -> dict[str, list[str]]:
    """Each decision's chain: the names of the plugins implementing one of its hooks, in
    the order they are called."""
    return {
        decision: [
            name
            for name, plugin in plugins
            if any(getattr(plugin, hook, None) is not None for hook in hooks)
        ]
        for decision, hooks in DECISIONS.items()
    }


def explain(config: Config, plugins: list[tuple[str, Any]]) -> dict[str, str]:
    """Each decision in a sentence: who makes it, or what happens without a plugin."""
    chains = deciders(plugins)
    said = {decision: ", then ".join(names) for decision, names in chains.items()}
    if config.broker.allow_anonymous:
        connect = "nobody: broker.allow_anonymous = true lets every client in"
        if chains["CONNECT"]:
            connect += f" (auth_on_register of {', '.join(chains['CONNECT'])} is never called)"
    elif chains["CONNECT"]:
        connect = f"{said['CONNECT']}; refused unless one says Ok"
    else:
        connect = "nobody: every client is refused (no_matching_hook_found)"
    lines = {"CONNECT": connect}
    for decision in ("PUBLISH", "SUBSCRIBE"):
        if chains[decision]:
            lines[decision] = f"{said[decision]}; refused unless one says Ok"
        else:
            lines[decision] = "nobody: every client may, on every topic"
    if chains["AUTH"]:
        lines["AUTH"] = f"{said['AUTH']} (MQTT 5 enhanced authentication)"
    return lines


def warnings(config: Config, plugins: list[tuple[str, Any]]) -> list[str]:
    """What in this config most likely does not do what its author meant."""
    connect = deciders(plugins)["CONNECT"]
    anonymous = config.broker.allow_anonymous
    if anonymous and connect:
        names = ", ".join(table(name) for name in connect)
        return [
            f"broker.allow_anonymous = true switches off the CONNECT check of {names}: "
            "auth_on_register is never called, so any client connects, with a wrong "
            "password or token, or none; set [broker] allow_anonymous = false to "
            "authenticate clients"
        ]
    if anonymous:
        return [
            f"{where} ({listener.type} {listener.address}) lets anyone connect: "
            "broker.allow_anonymous = true and no plugin authenticates clients"
            for where, listener in _listeners(config)
            if not _loopback(listener.address) and not listener.use_identity_as_username
        ]
    if not connect and not all(each.use_identity_as_username for each in config.listeners):
        return [
            "broker.allow_anonymous = false and no plugin implements auth_on_register: "
            "every client is refused (no_matching_hook_found), but those a certificate "
            "authenticates (use_identity_as_username); enable an auth plugin "
            "(passwd, auth_jwt, auth_db, webhooks)"
        ]
    return []


def _listeners(config: Config) -> list[tuple[str, Any]]:
    return [(f"listeners[{i}]", listener) for i, listener in enumerate(config.listeners)]


def _loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may be any interface
        return False
