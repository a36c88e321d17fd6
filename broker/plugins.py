"""Loading plugins from `[plugins.<name>]` config tables.

A table with `enabled = true` loads a plugin:
- built-in plugins by their short name: `[plugins.acl]` imports the package `plugins.acl`
  and uses the class it exports as `PLUGIN`;
- third-party plugins by `module = "package.module:Class"`.

A plugin class may define `Config`, a dataclass of its keys with their defaults; the
table's other keys are validated against it with the same rules and messages as the rest
of the config (`plugins.acl.acl_file: expected str, got int`). The plugin is built as
`Class(config)`; optional `start()` and `stop()` methods (sync or async) run with the
broker. Order: plugins with a `priority` first, lowest number first; then config order.
Each built plugin is held to the hook contract (hooks.check_plugin): a misspelt hook or a
hook with the wrong signature stops start-up like a config error, naming the plugin.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from broker.config import Config, ConfigError, build_section
from hooks import PluginError, check_plugin

log = logging.getLogger("nautilus.plugins")

RESERVED_KEYS = ("enabled", "priority", "module")
# The event relay is a plugin configured by its own top-level table, [event_relay].
EVENT_RELAY = "event_relay.plugin:EventRelay"


def load_plugins(
    sections: dict[str, dict[str, Any]],
    event_relay: dict[str, Any] | None = None,
    node_name: str = "nautilus",
) -> list[tuple[str, Any]]:
    """Build the enabled plugins, in call order, as (name, instance) pairs. The event
    relay (when [event_relay] or [event_relay.sidecar] is enabled) comes first, so that
    its on_deliver sees every delivery before a plugin may take it."""
    tables = [(f"plugins.{name}", name, section) for name, section in sections.items()]
    relay = _relay_section(event_relay or {}, node_name)
    if relay is not None:
        tables.insert(0, ("event_relay", "event_relay", relay))
    loaded = []
    for position, (where, name, section) in enumerate(tables):
        enabled = section.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}.enabled: expected true or false, got {enabled!r}")
        if not enabled:
            continue
        priority = section.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise ConfigError(f"{where}.priority: expected an integer, got {priority!r}")
        cls = _plugin_class(name, section.get("module"), where)
        settings = {k: v for k, v in section.items() if k not in RESERVED_KEYS}
        config_cls = getattr(cls, "Config", None)
        if config_cls is not None:
            plugin = cls(build_section(config_cls, settings, where))
        elif settings:
            raise ConfigError(f"unknown config key '{where}.{next(iter(settings))}'")
        else:
            plugin = cls()
        try:
            check_plugin(name, plugin)
        except PluginError as exc:
            raise ConfigError(f"{where}: {exc.problem}") from None
        order = (0, priority, position) if priority is not None else (1, 0, position)
        loaded.append((order, name, plugin))
    loaded.sort(key=lambda item: item[0])
    for _, name, _ in loaded:
        log.info("plugin %s enabled", name)
    return [(name, plugin) for _, name, plugin in loaded]


def configured_plugins(config: Config) -> list[tuple[str, Any]]:
    """The plugins a whole config enables: [plugins.*] and the event relay."""
    return load_plugins(config.plugins, config.event_relay, config.broker.node_name)


def _relay_section(table: dict[str, Any], node_name: str) -> dict[str, Any] | None:
    """[event_relay] as a plugin table, or None when neither the relay server nor the
    sidecar push is enabled. Its `enabled` turns on the server (`serve`)."""
    serve = table.get("enabled", False)
    if not isinstance(serve, bool):
        raise ConfigError(f"event_relay.enabled: expected true or false, got {serve!r}")
    sidecar = table.get("sidecar", {})
    push = isinstance(sidecar, dict) and sidecar.get("enabled", False) is True
    settings = {key: value for key, value in table.items() if key != "enabled"}
    settings.setdefault("node_name", node_name)
    if not (serve or push):
        if settings.keys() - {"node_name"}:  # keys of a relay that is off: checked all the
            # same, so that a misspelt `enabled` is an error, not a relay silently off
            relay = _plugin_class("event_relay", EVENT_RELAY, "event_relay")
            build_section(relay.Config, settings, "event_relay")  # type: ignore[attr-defined]
        return None
    return {"enabled": True, "module": EVENT_RELAY, "priority": -1, "serve": serve, **settings}


def _plugin_class(name: str, module: Any, where: str) -> type:
    if module is None:
        path, attribute = f"plugins.{name}", "PLUGIN"
    elif isinstance(module, str) and module.count(":") == 1:
        path, attribute = module.split(":")
    else:
        raise ConfigError(f"{where}.module: expected 'package.module:Class', got {module!r}")
    try:
        imported = importlib.import_module(path)
    except ImportError as exc:
        what = "no built-in plugin of that name" if module is None else str(exc)
        raise ConfigError(f"{where}: cannot load plugin: {what}") from None
    cls = getattr(imported, attribute, None)
    if not inspect.isclass(cls):
        raise ConfigError(f"{where}: {path} has no plugin class {attribute!r}")
    return cls


async def call_all(plugins: list[tuple[str, Any]], method: str) -> None:
    """Run each plugin's start() or stop(), awaiting the async ones."""
    for _, plugin in plugins:
        function = getattr(plugin, method, None)
        if function is not None:
            result = function()
            if inspect.isawaitable(result):
                await result
