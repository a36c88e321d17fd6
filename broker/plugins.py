"""Loading plugins from `[plugins.<name>]` config tables, and from the top-level tables
that configure one plugin each (`[event_relay]`, `[[bridges]]`).

A table with `enabled = true` loads a plugin:
- built-in plugins by their short name: `[plugins.acl]` imports the package `plugins.acl`
  and uses the class it exports as `PLUGIN`;
- third-party plugins by `module = "package.module:Class"`.

A plugin class may define `Config`, a dataclass of its keys with their defaults; the
table's other keys are validated against it with the same rules and messages as the rest
of the config (`plugins.acl.acl_file: expected str, got int`). The plugin is built as
`Class(config)`. Order: plugins with a `priority` first, lowest number first; then config
order. Each built plugin is held to the hook contract (hooks.check_plugin): a misspelt
hook, a hook with the wrong signature or a side door (hooks/spec.py SIDE_DOORS: start,
stop, before_ack, metrics, metadata, metadata_backend, invalidate, bridges, placement,
reload_tls, recorder) that breaks its declaration stops start-up like a config error,
naming the plugin. The broker resolves the side doors once (hooks.plugin_doors).

A top-level table of the config's PLUGIN_TABLES configures the plugin of its name. Which
class that is, the broker does not say: the distribution that ships the plugin declares
it as an entry point of the group `nautilus.tables` (setup.cfg: `event_relay =
event_relay.plugin:EventRelay`), as it declares its `nautilus` subcommands. The class
makes its section from the whole config with a classmethod, `table_section(config)`
(None: the config leaves it off); its module is imported only when the config has its
table. These plugins come after the [plugins.*] ones (priorities first, as always).

A plugin whose module is there but a library it imports is missing or broken
(broker/optional.py) does not stop start-up: one ERROR line names the library and the fix,
and an `Unavailable` stand-in takes the plugin's place, refusing every auth decision the
plugin might have made. An unknown plugin (its own module not found) is a config error.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any, Literal

from broker import optional
from broker.config import PLUGIN_TABLES, Config, ConfigError, build_section, plugin_tables
from hooks import Error, Lifecycle, PluginError, check_plugin

log = logging.getLogger("nautilus.plugins")

RESERVED_KEYS = ("enabled", "priority", "module")
TABLES_GROUP = "nautilus.tables"  # entry points: a plugin table's name = its plugin class


def load_plugins(
    sections: dict[str, dict[str, Any]], own_tables: dict[str, dict[str, Any]] | None = None
) -> list[tuple[str, Any]]:
    """Build the enabled plugins, in call order, as (name, instance) pairs: those of
    [plugins.<name>] `sections`, then those of `own_tables` (a top-level table's name ->
    its plugin's section, as configured_plugins makes them)."""
    tables = [(f"plugins.{name}", name, section) for name, section in sections.items()]
    tables += [(table, table, section) for table, section in (own_tables or {}).items()]
    loaded = []
    for position, (where, name, section) in enumerate(tables):
        enabled = section.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}.enabled: expected true or false, got {enabled!r}")
        if not enabled:
            if "enabled" not in section and section.keys() - set(RESERVED_KEYS):
                # Settings, but no switch: VerneMQ's "no_matching_hook_found" trap (its
                # issue 369) is a plugin left off by a forgotten `enabled`. Said, not fatal.
                log.warning("%s has settings but no `enabled = true`: the plugin is off", where)
            continue
        if where != name and name in PLUGIN_TABLES:  # [plugins.bridges]: names must differ
            raise ConfigError(f"{where}: {name!r} is the plugin of the [{name}] table")
        priority = section.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise ConfigError(f"{where}.priority: expected an integer, got {priority!r}")
        order = (0, priority, position) if priority is not None else (1, 0, position)
        try:
            plugin = _build(name, section, where)
        except optional.MissingLibrary as exc:
            log.error("%s", exc)
            loaded.append((order, name, Unavailable(str(exc))))
            continue
        try:
            check_plugin(name, plugin)
        except PluginError as exc:
            raise ConfigError(f"{where}: {exc.problem}") from None
        loaded.append((order, name, plugin))
    loaded.sort(key=lambda item: item[0])
    for _, name, plugin in loaded:
        if not isinstance(plugin, Unavailable):
            log.info("plugin %s enabled", name)
    return [(name, plugin) for _, name, plugin in loaded]


def configured_plugins(config: Config) -> list[tuple[str, Any]]:
    """The plugins a whole config enables: [plugins.*], then those of the plugin tables."""
    return load_plugins(config.plugins, _own_tables(config))


def _own_tables(config: Config) -> dict[str, dict[str, Any]]:
    """The sections of the plugins the config's plugin tables turn on, by table. A class
    that cannot be imported for a missing library gets a section all the same: the
    loader puts the stand-in in its place (it cannot say whether the table turns it on)."""
    declared = {entry.name: entry.value for entry in entry_points(group=TABLES_GROUP)}
    sections = {}
    for table in plugin_tables(config):
        module = declared.get(table)
        if module is None:
            raise ConfigError(
                f"{table}: no installed plugin reads this table (the {TABLES_GROUP} entry "
                "points of nautilus-mqtt are missing: install it again, `pip install -e .` "
                "in a checkout)"
            )
        try:
            cls = _plugin_class(table, module, table)
        except optional.MissingLibrary:
            sections[table] = {"enabled": True, "module": module}
            continue
        make_section = getattr(cls, "table_section", None)
        if make_section is None:
            raise ConfigError(f"{table}: {module} has no classmethod table_section(config)")
        section = make_section(config)
        if section is not None:
            sections[table] = {**section, "enabled": True, "module": module}
    return sections


def _build(name: str, section: dict[str, Any], where: str) -> Any:
    """The plugin of one enabled table. MissingLibrary when a library it imports cannot
    be imported, when its module is imported or as it is built (a part it imports only
    when its config asks for it, as the event relay's sidecar push does)."""
    module = section.get("module")
    cls = _plugin_class(name, module, where)
    settings = {k: v for k, v in section.items() if k not in RESERVED_KEYS}
    config_cls = getattr(cls, "Config", None)
    try:
        if config_cls is not None:
            return cls(build_section(config_cls, settings, where))
        if settings:
            raise ConfigError(f"unknown config key '{where}.{next(iter(settings))}'")
        return cls()
    except ImportError as exc:
        path = module.split(":")[0] if module else f"plugins.{name}"
        missing = optional.missing(exc, _skipped(where), _own(path))
        if missing is None:
            raise
        raise missing from exc


def _skipped(where: str) -> str:
    """What the log line says of a plugin skipped for a missing library."""
    refused = "CONNECT without allow_anonymous, PUBLISH, SUBSCRIBE"
    return f"{where} skipped (refused in its place: {refused})"


def _own(path: str) -> tuple[str, ...]:
    """The packages whose ImportErrors are a plugin's own, not a library's."""
    return (*optional.OWN, path.split(".")[0])


def _plugin_class(name: str, module: Any, where: str) -> type:
    if module is None:
        path, attribute = f"plugins.{name}", "PLUGIN"
    elif isinstance(module, str) and module.count(":") == 1:
        path, attribute = module.split(":")
    else:
        raise ConfigError(f"{where}.module: expected 'package.module:Class', got {module!r}")
    # A library it imports that cannot be imported: MissingLibrary (the caller skips
    # the plugin). Its own modules not found, or an error in them: a config error.
    try:
        imported = optional.load(path, _skipped(where), _own(path))
    except ImportError as exc:
        unknown = isinstance(exc, ModuleNotFoundError) and _is_prefix(exc.name, path)
        what = "no built-in plugin of that name" if module is None and unknown else str(exc)
        raise ConfigError(f"{where}: cannot load plugin: {what}") from None
    cls = getattr(imported, attribute, None)
    if not inspect.isclass(cls):
        raise ConfigError(f"{where}: {path} has no plugin class {attribute!r}")
    return cls


def _is_prefix(name: str | None, path: str) -> bool:
    """Whether module `name` is `path` or one of its parent packages."""
    return name is not None and (path == name or path.startswith(name + "."))


class Unavailable:
    """Stands in for a plugin that could not be loaded (a library it needs is missing or
    broken). Which hooks the plugin has is unknown, so this one refuses every auth
    decision it might have made: a client's CONNECT (when `allow_anonymous` is false),
    PUBLISH, SUBSCRIBE and enhanced authentication. Without it a missing library could let
    in what the plugin would have refused (with no plugin implementing auth_on_publish or
    auth_on_subscribe, everything is allowed). Its events are not called at all."""

    def __init__(self, problem: str) -> None:
        self.problem = problem  # the ERROR line logged at start-up

    def __repr__(self) -> str:
        return f"<Unavailable: {self.problem}>"

    def _refuse(self, context: Any) -> Error:
        return Error("plugin_unavailable")  # CONNACK / PUBACK / SUBACK: not authorized

    auth_on_register = auth_on_register_m5 = _refuse
    auth_on_publish = auth_on_publish_m5 = _refuse
    auth_on_subscribe = auth_on_subscribe_m5 = _refuse
    on_auth_m5 = _refuse


async def call_all(lifecycles: Iterable[Lifecycle], method: Literal["start", "stop"]) -> None:
    """Run each plugin's start() or stop() (hooks.plugin_doors' lifecycles), awaiting the
    async ones."""
    for lifecycle in lifecycles:
        function = lifecycle.start if method == "start" else lifecycle.stop
        if function is not None:
            result = function()
            if inspect.isawaitable(result):
                await result
