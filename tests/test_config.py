"""Unit tests of broker.config: the schema, docs/configuration.md, errors and env overrides.

The docs test parses the Markdown tables of docs/configuration.md and holds them against the
dataclasses both ways (every documented key exists with exactly its documented default,
every field is documented), so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest

from broker.config import (
    BrokerSettings,
    Config,
    ConfigError,
    Duration,
    ListenerSettings,
    LogSettings,
    StoreSettings,
    config_from_dict,
    load_config,
)
from event_relay.config import RelayConfig, SidecarConfig

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

EXAMPLE = """\
[broker]
allow_anonymous = true
[[listeners]]
type = "tcp"
address = "127.0.0.1:1883"
[store]
backend = "memory"
"""


# --------------------------------------------------------------------------- helpers


@dataclasses.dataclass
class DocSection:
    is_list: bool  # documented as [[name]] rather than [name]
    rows: dict[str, tuple[str, str]]  # key -> (default as written, meaning)


_HEADING = re.compile(r"^##+ `(\[\[?)([\w.]+)\]\]?`\s*$")
_ROW = re.compile(r"^\| `(\w+)` \| `([^`]+)` \| (.+) \|$")


def documented_sections() -> dict[str, DocSection]:
    """The `## [section]` tables of docs/configuration.md; malformed rows fail loudly."""
    sections: dict[str, DocSection] = {}
    current: DocSection | None = None
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        if heading := _HEADING.match(line):
            if heading[2] not in SECTIONS:  # the event relay's: its own test, below
                current = None
                continue
            current = sections[heading[2]] = DocSection(heading[1] == "[[", {})
        elif line.startswith("#"):
            current = None
        elif current is not None and line.startswith("|"):
            if line.startswith(("| key |", "|---")):
                continue
            row = _ROW.match(line)
            assert row, f"docs/configuration.md: table row not understood: {line!r}"
            assert row[1] not in current.rows, f"key {row[1]!r} documented twice"
            current.rows[row[1]] = (row[2], row[3])
    return sections


def section_class(name: str) -> tuple[type, bool]:
    """The dataclass behind a Config section (`cluster.swc`: a table inside one), and
    whether the section is a list of them."""
    owner: type = Config
    *outer, last = name.split(".")
    for part in outer:
        owner = get_type_hints(owner)[part]
    hint = get_type_hints(owner)[last]
    if get_origin(hint) is list:
        return get_args(hint)[0], True
    return hint, False


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def toml_value(text: str) -> Any:
    return tomllib.loads(f"v = {text}")["v"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nautilus.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def config_error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    return str(info.value)


# --------------------------------------------------------------------------- docs vs schema


# [plugins.<name>] tables belong to the plugins; docs/plugins.md documents their keys.
# [event_relay] is validated by the relay (event_relay/config.py): checked on its own;
# [[bridges]] by the bridge plugin (plugins/bridge/config.py), documented in docs/bridge.md.
OWN_CHECKS = ("plugins", "event_relay", "bridges")
TOP = [f.name for f in dataclasses.fields(Config) if f.name not in OWN_CHECKS]
# Tables inside a section (`[cluster.swc]`) are documented as sections of their own.
SECTIONS = TOP + [
    f"{name}.{f.name}"
    for name in TOP
    for f in dataclasses.fields(section_class(name)[0])
    if dataclasses.is_dataclass(get_type_hints(section_class(name)[0])[f.name])
]


def test_docs_document_every_section_and_only_those():
    docs = documented_sections()
    fields = SECTIONS
    assert sorted(docs) == sorted(fields)
    for name in fields:
        assert docs[name].is_list == section_class(name)[1], name
        assert docs[name].rows, f"[{name}] has an empty table"


@pytest.mark.parametrize("section", SECTIONS)
def test_docs_and_dataclass_agree_on_keys_and_defaults(section):
    doc = documented_sections()[section]
    cls, _ = section_class(section)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert list(doc.rows) == list(fields), "documented keys differ from the dataclass fields"
    hints = get_type_hints(cls)
    for key, (written, meaning) in doc.rows.items():
        documented = toml_value(written)
        actual = field_default(fields[key])
        if dataclasses.is_dataclass(actual):  # a table of its own, documented below
            assert documented == {} and f"[{section}.{key}]" in meaning, f"{section}.{key}"
            continue
        assert actual == documented, f"{section}.{key}: default {actual!r}, docs say {written}"
        assert isinstance(actual, bool) == isinstance(documented, bool), f"{section}.{key}"
        assert isinstance(actual, type(documented)), f"{section}.{key}: type differs"
        # A *duration* in the docs is a Duration in the schema, and the other way round.
        is_duration = meaning.startswith("*duration*")
        assert is_duration == (hints[key] is Duration), f"{section}.{key}: duration marking"
        # Every allowed choice of a Literal key is named in its documentation.
        if get_origin(hints[key]) is Literal:
            for choice in get_args(hints[key]):
                assert f'`"{choice}"`' in meaning, f"{section}.{key}: choice {choice!r} missing"


RELAY_SAMPLE = "sample.<hook>.<label>"  # how the docs name the sample table's keys


def _relay_rows(heading: str) -> dict[str, tuple[str, str]]:
    """key -> (default as written, meaning) of the table under `heading`."""
    rows: dict[str, tuple[str, str]] = {}
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading) + 1
    for line in lines[start:]:
        if line.startswith("#"):
            break
        row = re.match(r"^\| `([^`]+)` \| (.+?) \| (.+) \|$", line)
        if row and not line.startswith(("| key |", "|---")):
            rows[row[1]] = (row[2], row[3])
    return rows


@pytest.mark.parametrize(
    ("heading", "cls", "renamed"),
    [
        (
            "## `[event_relay]`",
            RelayConfig,
            {"enabled": "serve", "sample.<hook>.<label>": "sample"},
        ),
        ("### `[event_relay.sidecar]`", SidecarConfig, {}),
    ],
)
def test_the_relay_docs_and_its_dataclasses_agree(heading, cls, renamed):
    rows = _relay_rows(heading)
    keys = [renamed.get(key, key) for key in rows]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "sidecar"}
    assert sorted(keys) == sorted(fields)
    for key, (written, _) in rows.items():
        if not written.startswith("`"):  # "all 13 event types", "none", ...
            continue
        default = field_default(fields[renamed.get(key, key)])
        if written.startswith("`["):  # `[broker] node_name`
            assert default == "", key
            continue
        assert default == toml_value(written.strip("`")), key


def test_documented_defaults_written_out_give_the_default_config():
    sections: dict[str, Any] = {}
    for name, doc in documented_sections().items():
        table = {key: toml_value(written) for key, (written, _) in doc.rows.items()}
        *outer, last = name.split(".")
        into = sections
        for part in outer:  # [cluster.swc] goes inside [cluster]
            into = into.setdefault(part, {})
        into.setdefault(last, {})
        into[last] = [table] if doc.is_list else {**table, **into[last]}
    assert config_from_dict(sections) == Config()


def test_defaults():
    config = load_config(None, environ={})
    assert config == Config()
    assert config.broker == BrokerSettings()
    assert config.listeners == [ListenerSettings(type="tcp", address="127.0.0.1:1883")]
    assert config.listeners[0].host_port == ("127.0.0.1", 1883)
    assert config.store == StoreSettings(backend="leveldb", path="./data", sync=True)
    assert config.log == LogSettings(level="info")
    assert config_from_dict({}) == Config()


def test_docs_example_is_the_issue_example():
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text, re.S)
    assert block
    assert tomllib.loads(block[1]) == tomllib.loads(EXAMPLE)


# --------------------------------------------------------------------------- reading files


def test_load_config_reads_the_example_file(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE), environ={})
    assert config.broker.allow_anonymous is True
    assert config.listeners == [ListenerSettings(type="tcp", address="127.0.0.1:1883")]
    assert config.store.backend == "memory"
    # Everything not in the file keeps its default.
    assert config.broker == BrokerSettings()
    assert config.store.path == "./data"
    assert config.log == LogSettings()


def test_load_config_reads_every_key(tmp_path):
    text = """\
[broker]
allow_anonymous = false
max_client_id_size = 23
connect_timeout = "30s"
max_inflight_messages = 0
max_online_messages = -1
max_offline_messages = 0
queue_type = "lifo"
max_message_size = 1024
persistent_client_expiration = "1w"
receive_max_broker = 1

[[listeners]]
address = "127.0.0.1:0"

[[listeners]]
type = "tcp"
address = "[::1]:1884"

[store]
backend = "leveldb"
path = "/var/lib/nautilus"
sync = false

[log]
level = "debug"
"""
    config = load_config(write(tmp_path, text), environ={})
    assert config.broker == BrokerSettings(
        allow_anonymous=False,
        max_client_id_size=23,
        connect_timeout=30,
        max_inflight_messages=0,
        max_online_messages=-1,
        max_offline_messages=0,
        queue_type="lifo",
        max_message_size=1024,
        persistent_client_expiration=604800,
        receive_max_broker=1,
    )
    assert [listener.host_port for listener in config.listeners] == [
        ("127.0.0.1", 0),
        ("::1", 1884),
    ]
    assert config.store == StoreSettings(backend="leveldb", path="/var/lib/nautilus", sync=False)
    assert config.log.level == "debug"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0),
        (45, 45),
        ('"45"', 45),
        ('"30s"', 30),
        ('"5m"', 300),
        ('"1h"', 3600),
        ('"1d"', 86400),
        ('"1w"', 604800),
        ('" 2 h "', 7200),
    ],
)
def test_durations(tmp_path, value, seconds):
    path = write(tmp_path, f"[broker]\nconnect_timeout = {value}\n")
    timeout = load_config(path, environ={}).broker.connect_timeout
    assert timeout == seconds
    assert isinstance(timeout, Duration)


# --------------------------------------------------------------------------- bad files


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(str(missing))) as info:
        load_config(str(missing), environ={})
    assert "not found" in str(info.value)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path))):
        load_config(str(tmp_path), environ={})


@pytest.mark.parametrize(
    "text",
    [
        "[broker\nallow_anonymous = true\n",
        "[broker]\nallow_anonymous = yes\n",
        "[broker]\nallow_anonymous = true\nallow_anonymous = false\n",
        "[broker]\nconnect_timeout = 1h\n",
    ],
    ids=["unclosed-header", "bare-word", "duplicate-key", "unquoted-duration"],
)
def test_invalid_toml(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: invalid TOML")
    assert "\n" not in message


# --------------------------------------------------------------------------- bad keys and values


@pytest.mark.parametrize(
    ("data", "key"),
    [
        # unknown keys and sections: a typo must not fall back to a default
        ({"broker": {"allow_anonymus": True}}, "broker.allow_anonymus"),
        ({"brokr": {}}, "brokr"),
        ({"listeners": [{"port": 1883}]}, "listeners[0].port"),
        ({"listeners": [{}, {"adress": "127.0.0.1:1"}]}, "listeners[1].adress"),
        ({"store": {"backend": "memory", "fsync": True}}, "store.fsync"),
        ({"log": {"path": "x.log"}}, "log.path"),
        ({"http": {"port": 8888}}, "http.port"),
        ({"http": {"address": "8888"}}, "http.address"),
        ({"log": {"format": "xml"}}, "log.format"),
        ({"log": {"file_backups": -1}}, "log.file_backups"),
        # wrong types
        ({"broker": {"allow_anonymous": "yes"}}, "broker.allow_anonymous"),
        ({"broker": {"allow_anonymous": 1}}, "broker.allow_anonymous"),
        ({"broker": {"max_inflight_messages": "many"}}, "broker.max_inflight_messages"),
        ({"broker": {"max_inflight_messages": True}}, "broker.max_inflight_messages"),
        ({"broker": {"max_client_id_size": 1.5}}, "broker.max_client_id_size"),
        ({"store": {"path": 1}}, "store.path"),
        ({"store": {"sync": "true"}}, "store.sync"),
        ({"listeners": [{"address": 1883}]}, "listeners[0].address"),
        ({"broker": 1}, "broker"),
        ({"broker": [{"allow_anonymous": True}]}, "broker"),
        ({"listeners": {"type": "tcp"}}, "listeners"),
        ({"listeners": [1]}, "listeners[0]"),
        # literal choices
        ({"broker": {"queue_type": "stack"}}, "broker.queue_type"),
        ({"broker": {"queue_type": "FIFO"}}, "broker.queue_type"),
        ({"store": {"backend": "sqlite"}}, "store.backend"),
        ({"log": {"level": "verbose"}}, "log.level"),
        ({"listeners": [{"type": "udp"}]}, "listeners[0].type"),
        # durations
        ({"broker": {"connect_timeout": "10x"}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": "1.5h"}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": "h"}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": ""}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": -1}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": "-1s"}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": 1.5}}, "broker.connect_timeout"),
        ({"broker": {"connect_timeout": True}}, "broker.connect_timeout"),
        ({"broker": {"persistent_client_expiration": "forever"}}, "persistent_client_expiration"),
        # limits
        ({"broker": {"max_client_id_size": -1}}, "broker.max_client_id_size"),
        ({"broker": {"max_inflight_messages": -1}}, "broker.max_inflight_messages"),
        ({"broker": {"max_message_size": -1}}, "broker.max_message_size"),
        ({"broker": {"max_online_messages": -2}}, "broker.max_online_messages"),
        ({"broker": {"max_offline_messages": -2}}, "broker.max_offline_messages"),
        ({"broker": {"receive_max_broker": 0}}, "broker.receive_max_broker"),
        ({"broker": {"receive_max_broker": 65536}}, "broker.receive_max_broker"),
        # addresses
        ({"listeners": [{"address": "localhost"}]}, "listeners[0].address"),
        ({"listeners": [{"address": "127.0.0.1"}]}, "listeners[0].address"),
        ({"listeners": [{"address": "127.0.0.1:"}]}, "listeners[0].address"),
        ({"listeners": [{"address": "127.0.0.1:mqtt"}]}, "listeners[0].address"),
        ({"listeners": [{"address": "127.0.0.1:65536"}]}, "listeners[0].address"),
        ({"listeners": [{"address": "127.0.0.1:-1"}]}, "listeners[0].address"),
        ({"listeners": [{}, {"address": "localhost:1883:"}]}, "listeners[1].address"),
        pytest.param(
            {"listeners": [{"address": "::1"}]}, "listeners[0].address", id="ipv6-no-port"
        ),
        pytest.param({"listeners": [{"address": ":1883"}]}, "listeners[0].address", id="no-host"),
        ({"listeners": []}, "listeners"),
    ],
)
def test_bad_key_or_value_names_the_key(data, key):
    message = config_error(data)
    assert key in message
    assert "\n" not in message


def test_error_message_matches_the_docs_example():
    message = config_error({"broker": {"max_inflight_messages": "many"}})
    assert f"nautilus: {message}" in DOCS.read_text(encoding="utf-8")


def test_bad_value_in_file_names_the_key(tmp_path):
    path = write(tmp_path, EXAMPLE + '\n[log]\nlevel = "loud"\n')
    with pytest.raises(ConfigError, match=r"^log\.level: 'loud' is not one of"):
        load_config(path, environ={})


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"broker": {"max_online_messages": -1, "max_offline_messages": -1}}, -1),
        ({"broker": {"receive_max_broker": 1}}, 1),
        ({"broker": {"receive_max_broker": 65535}}, 65535),
        ({"listeners": [{"address": "127.0.0.1:65535"}]}, ("127.0.0.1", 65535)),
        ({"listeners": [{"address": "[::1]:0"}]}, ("::1", 0)),
    ],
)
def test_limits_at_their_edges_are_accepted(data, expected):
    config = config_from_dict(data)
    if "listeners" in data:
        assert config.listeners[0].host_port == expected
    else:
        assert expected in dataclasses.astuple(config.broker)


# --------------------------------------------------------------------------- environment


def test_env_overrides_the_file(tmp_path):
    environ = {
        "NAUTILUS_BROKER__ALLOW_ANONYMOUS": "false",
        "NAUTILUS_STORE__BACKEND": "memory",
        "NAUTILUS_BROKER__CONNECT_TIMEOUT": "1h",
        "NAUTILUS_BROKER__MAX_INFLIGHT_MESSAGES": "50",
        "NAUTILUS_BROKER__PERSISTENT_CLIENT_EXPIRATION": "2d",
        "NAUTILUS_STORE__PATH": "/srv/nautilus",
        "NAUTILUS_LOG__LEVEL": '"warning"',
    }
    path = write(tmp_path, EXAMPLE.replace('"memory"', '"leveldb"'))
    config = load_config(path, environ=environ)
    assert config.broker.allow_anonymous is False
    assert config.store.backend == "memory"
    assert config.broker.connect_timeout == 3600
    assert config.broker.max_inflight_messages == 50
    assert config.broker.persistent_client_expiration == 2 * 86400
    assert config.store.path == "/srv/nautilus"
    assert config.log.level == "warning"
    # Keys the environment does not name keep the file's value (or the default).
    assert config.listeners == [ListenerSettings(type="tcp", address="127.0.0.1:1883")]
    assert config.store.sync is True


def test_env_without_file():
    environ = {"NAUTILUS_BROKER__ALLOW_ANONYMOUS": "false", "NAUTILUS_STORE__BACKEND": "memory"}
    config = load_config(None, environ=environ)
    assert config.broker.allow_anonymous is False
    assert config.store.backend == "memory"
    assert config.listeners == Config().listeners


def test_unrelated_env_is_ignored():
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "NAUTILUS": "x",
        "NAUTILUS_HOME": "/opt/nautilus",  # no "__": not a key
        "MOSQUITTO_BROKER__ALLOW_ANONYMOUS": "false",
    }
    assert load_config(None, environ=environ) == Config()


def test_single_underscore_after_a_section_is_reported():
    # A typo for NAUTILUS_BROKER__ALLOW_ANONYMOUS must not silently keep the default.
    with pytest.raises(ConfigError, match=r"NAUTILUS_BROKER_ALLOW_ANONYMOUS.*two underscores"):
        load_config(None, environ={"NAUTILUS_BROKER_ALLOW_ANONYMOUS": "false"})


def test_env_value_for_a_text_key_stays_text():
    config = load_config(None, environ={"NAUTILUS_STORE__PATH": "inf"})
    assert config.store.path == "inf"


@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"NAUTILUS_BROKER__ALLOW_ANONYMUS": "false"}, "broker.allow_anonymus"),
        ({"NAUTILUS_BROKR__ALLOW_ANONYMOUS": "false"}, "brokr"),
        ({"NAUTILUS_BROKER__ALLOW_ANONYMOUS": "nope"}, "broker.allow_anonymous"),
        ({"NAUTILUS_BROKER__QUEUE_TYPE": "stack"}, "broker.queue_type"),
        ({"NAUTILUS_BROKER__CONNECT_TIMEOUT": "1 fortnight"}, "broker.connect_timeout"),
        ({"NAUTILUS_BROKER__MAX_INFLIGHT_MESSAGES": "-5"}, "broker.max_inflight_messages"),
        ({"NAUTILUS_STORE__BACKEND": "redis"}, "store.backend"),
        ({"NAUTILUS_LISTENERS__ADDRESS": "0.0.0.0:1883"}, "NAUTILUS_LISTENERS__ADDRESS"),
    ],
)
def test_bad_env_names_the_key(environ, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, environ=environ)
    assert key in str(info.value)


def test_env_into_a_section_that_is_not_a_table(tmp_path):
    path = write(tmp_path, "broker = 1\n")
    with pytest.raises(ConfigError, match="NAUTILUS_BROKER__ALLOW_ANONYMOUS"):
        load_config(path, environ={"NAUTILUS_BROKER__ALLOW_ANONYMOUS": "false"})


def test_env_does_not_touch_the_callers_mapping():
    environ = {"NAUTILUS_STORE__BACKEND": "memory"}
    load_config(None, environ=environ)
    assert environ == {"NAUTILUS_STORE__BACKEND": "memory"}
