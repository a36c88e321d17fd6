"""Import boundaries: each layer of the broker imports only the layers below it, and the
packages around the core import only what they may (DESIGN.md, "Layout").

Layers of broker/, lowest first (a module may import its own layer and lower ones):

  0 protocol       the sans-I/O codec
  1 foundations    topics, clock, metrics, config, subscription_trie (it only matches),
                   authorization, deciders (who decides what, as configured),
                   enhanced_auth, hook_callers, tls (listeners' contexts), tls_stream
                   and layer (TLS over memory BIOs: a listener's after a PROXY header,
                   the cluster listener's),
                   logs, episodes (a repeated line logged once per episode),
                   connection_cap (a listener's max_connections), descriptors (the
                   process's file descriptors), optional
                   (importing what needs an optional library)
  2 values         message (Message, Delivery), client_state (ClientState), outlet, flow, retain,
                   inflight (a session's in-flight window), read_gate (whether a
                   connection reads now)
  3 store          the message stores
  4 sessions       session (and its parts: session_state, acknowledgements,
                   delivery_hooks, durability), session_queue, multi_session (write to
                   an Outlet, never to a connection)
  5 registry       client id -> session; routing (a message to its subscribers); ingress
                   (every message's one way into routing); cluster (this node among
                   others: it hands sessions to and from other nodes)
  6 client         the per-client engine (client.engine: one client's MQTT, no I/O)
                   and the packet handlers it runs (client.connect, client.publish,
                   client.subscribe; client.handlers: which handles each packet), plugins,
                   systree
  7 connection     the asyncio shell around an engine (connection), its writer,
                   proxy_protocol (the header before it), websocket (the framing
                   around it)
  8 broker         server (the Broker), __main__, check_config, admin (operations),
                   http (the server)

Traces (broker/trace/) span layers: one trace and how its lines show things (trace,
text, hook_calls) sit at 1, a traced connection's tap at 7, the node's tracer at 8.

Type-only imports (under `if TYPE_CHECKING:`) count like the others: a part names what is
above it through a protocol it owns, a role (the engine's `ClientServices`, the
cluster's ports, the registry's `Routing`, the peers' roles, the admin side's
`SessionDirectory` and its other roles), which the Broker provides, never by importing it.

Nor may modules import each other in a circle, type-only imports and imports inside
functions included (test_no_import_cycles).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "broker.protocol": 0,
    "broker.topics": 1,
    "broker.mountpoints": 1,  # the names of a topic tree's topics and sessions
    "broker.clock": 1,
    "broker.keepalive": 1,  # one timer for every connection's keepalive
    "broker.metrics": 1,
    "broker.config": 1,
    "broker.subscription_trie": 1,
    "broker.authorization": 1,
    "broker.deciders": 1,  # who decides CONNECT / PUBLISH / SUBSCRIBE, and the traps
    "broker.enhanced_auth": 1,
    "broker.hook_callers": 1,
    "broker.logs": 1,
    "broker.episodes": 1,  # a repeated condition logged once per episode
    "broker.connection_cap": 1,  # a listener's max_connections, and its episodes
    "broker.descriptors": 1,  # RLIMIT_NOFILE, and the listeners running out of it
    "broker.optional": 1,  # importing what needs an optional library, when it is needed
    "broker.tls": 1,
    "broker.binding": 1,  # listening addresses claimed at start-up, errors naming the key
    "broker.message": 2,
    "broker.client_state": 2,  # ClientState: what the broker knows of one client
    "broker.outlet": 2,
    "broker.flow": 2,
    "broker.read_gate": 2,  # whether a connection reads now, and why not
    "broker.retain": 2,
    "broker.inflight": 2,  # a session's in-flight window: packet ids, no I/O
    "broker.store": 3,
    "broker.session": 4,
    "broker.session_state": 4,  # what a session holds (its fields), which its parts share
    "broker.acknowledgements": 4,  # a session's PUBACK/PUBREC/PUBCOMP/PUBREL, resends
    "broker.delivery_hooks": 4,  # a session's on_deliver (awaited ones deferred), events
    "broker.durability": 4,  # a session's in-flight read back from the store; handing on
    "broker.session_queue": 4,  # a session's queue, in memory and in the store
    "broker.multi_session": 4,
    "broker.peers": 5,  # what the core tells the other nodes (the cluster, or Alone)
    "broker.routing": 5,  # a message to the sessions that subscribed to it
    "broker.ingress": 5,  # every message's one way into routing
    "broker.registry": 5,
    "broker.cluster": 5,  # membership, links, the routing view of other nodes
    "broker.client": 6,  # the per-client engine (one client's MQTT, no I/O), its handlers
    "broker.plugins": 6,
    "broker.systree": 6,
    "broker.trace_spec": 1,  # what an operator asks to trace
    "broker.trace": 1,  # one trace (options, rate limit, lines), and how lines show things
    "broker.trace.tap": 7,  # a traced connection: what it reads and writes
    "broker.trace.tracer": 8,  # the node's traces, switched on while there is one
    "broker.writer": 7,  # a connection's outgoing bytes, batched per loop turn
    "broker.connection": 7,
    "broker.proxy_protocol": 7,
    "broker.websocket": 7,
    "broker.tls_stream": 1,  # TLS over memory BIOs (the listeners', the cluster listener's)
    "broker.layer": 1,  # what a layer between a socket and its protocol is (TLS, WebSocket)
    "broker.server": 8,
    "broker.admin": 8,
    "broker.http": 8,
    "broker.__main__": 8,
    "broker.check_config": 8,  # nautilus check-config
    "broker": 8,  # broker/__init__.py
}


def layer_of(module: str) -> int:
    """The layer of a module (a package's submodules share the package's layer)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in LAYERS:
            return LAYERS[name]
    raise AssertionError(f"{module} has no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, whether only under `if TYPE_CHECKING:`) for each import."""
    tree = ast.parse(path.read_text())
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                type_only.update(id(n) for n in ast.walk(inner))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in type_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from broker.client import connect`: that module
                submodule = f"{node.module}.{alias.name}"
                is_module = any(
                    (ROOT / submodule.replace(".", "/")).with_suffix(suffix).exists()
                    for suffix in (".py", "")
                )
                found.append((submodule if is_module else node.module, id(node) in type_only))
    return found


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", python_files("broker"), ids=lambda p: module_name(p))
def test_broker_layers_import_only_downwards(path):
    own = layer_of(module_name(path))
    upward = [
        module
        for module, _ in imports(path)
        if module.startswith("broker") and layer_of(module) > own
    ]
    assert not upward, f"{module_name(path)} (layer {own}) imports from above: {upward}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the broker modules it imports (type-only imports, and imports inside
    functions, included)."""
    modules = {module_name(path): path for path in python_files("broker")}

    def owner(name: str) -> str:  # `broker.cluster.frames.encode` is broker.cluster.frames
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = {
            owner(imported) for imported, _ in imports(path) if imported.startswith("broker")
        } - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    found = [sorted(c) for c in cycles(import_graph())]
    assert not found, f"modules that import each other in a circle: {found}"


def test_the_cycle_finder_finds_a_circle_through_a_type_only_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_broker_module_has_a_layer():
    for path in python_files("broker"):
        layer_of(module_name(path))


@pytest.mark.parametrize("path", python_files("hooks"), ids=lambda p: module_name(p))
def test_the_hook_contract_does_not_depend_on_the_broker(path):
    assert not [m for m, _ in imports(path) if m.split(".")[0] in {"broker", "plugins"}]


# What plugins may use; a metadata backend (plugins/redis_subs) implements the cluster's
# interface, broker/cluster/metadata.py; a plugin's own TLS server (the event relay's)
# uses the listeners' contexts and their TLS engine, broker/tls.py and tls_stream.py, and
# says which key to change when its address cannot be had with broker/binding.py's
# BindError.
PUBLIC = (
    "broker.binding",
    "broker.config",
    "broker.protocol",
    "broker.topics",
    "broker.mountpoints",
    "broker.cluster.metadata",
    "broker.tls",
    "broker.tls_stream",
)


@pytest.mark.parametrize(
    "path", python_files("plugins") + python_files("event_relay"), ids=lambda p: module_name(p)
)
def test_plugins_use_only_the_contract_and_the_brokers_public_values(path):
    # A plugin (and the event relay, which is one) sees the hook contract and a few value
    # modules: config errors, protocol constants, topic rules. Never sessions,
    # connections or the Broker, and no other plugin.
    # Its own package: plugins/<name>/, or the whole of event_relay/.
    parts = module_name(path).split(".")
    own = parts[:1] if parts[0] == "event_relay" else parts[:2]
    for module, _ in imports(path):
        top = module.split(".")[0]
        if top == "broker":
            assert module.startswith(PUBLIC), f"{module_name(path)} imports {module}"
        elif top in {"plugins", "event_relay"}:
            assert module.split(".")[: len(own)] == own, f"{module_name(path)} imports {module}"


@pytest.mark.parametrize("path", python_files("spark_consumers"), ids=lambda p: module_name(p))
def test_the_spark_jobs_talk_to_the_relay_over_tcp_only(path):
    core = [m for m, _ in imports(path) if m.split(".")[0] in {"broker", "hooks", "plugins"}]
    assert not core, f"{module_name(path)} imports {core}"


# testing/ holds the real servers (Redis, the databases, Mosquitto, carbon) that the tests
# and the benchmarks share: the benchmarks take them from there, not from tests/; testing/
# needs neither the tests nor pytest (a benchmark runs without them); and what is shipped
# (setup.cfg's packages) imports none of it.
SHIPPED = ("broker", "hooks", "plugins", "event_relay", "spark_consumers")


def importers_of(packages: tuple[str, ...], forbidden: set[str]) -> list[str]:
    """`file imports module` for each import, in `packages`, of a module under `forbidden`."""
    return [
        f"{path.relative_to(ROOT)} imports {module}"
        for package in packages
        for path in python_files(package)
        for module, _ in imports(path)
        if module.split(".")[0] in forbidden
    ]


def test_the_benchmarks_and_testing_import_nothing_from_the_tests():
    found = importers_of(("bench", "testing"), {"tests", "pytest"})
    assert not found, "move what is shared to testing/: " + ", ".join(found)


def test_the_shipped_packages_import_nothing_from_testing():
    found = importers_of(SHIPPED, {"testing"})
    assert not found, ", ".join(found)


def test_an_import_inside_a_function_counts(tmp_path):
    # As bench/auth_db.py's of the tests' servers were: made when a mode started one.
    probe = tmp_path / "probe.py"
    probe.write_text("def start():\n    from tests.cluster import conftest\n")
    assert imports(probe) == [("tests.cluster.conftest", False)]


# What a config must ask for before it is imported (broker/optional.py): a ws/wss or
# proxy_protocol listener, [http], [cluster], a plugin.
OPTIONAL = (
    "websockets",
    "proxyprotocol",
    "aiohttp",
    "redis",
    "event_relay",
    "broker.cluster",
    "broker.http",
)
TCP_ONLY = """
import asyncio, json, sys
import broker.server
from broker.config import config_from_dict
imported = sorted(sys.modules)

async def serve():
    config = config_from_dict({
        "listeners": [{"type": "tcp", "address": "127.0.0.1:0"}],
        "http": {"enabled": False},
        "store": {"backend": "memory"},
    })
    node = broker.server.Broker(config)
    await node.start()
    assert node.listening[0][1] > 0
    await node.stop()

asyncio.run(serve())
print(json.dumps({"import broker.server": imported, "a TCP-only broker": sorted(sys.modules)}))
"""


def test_optional_pieces_are_imported_only_when_the_config_asks(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NAUTILUS_")}
    result = subprocess.run(
        [sys.executable, "-c", TCP_ONLY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    for when, modules in json.loads(result.stdout).items():
        loaded = [m for m in modules if any(m == o or m.startswith(f"{o}.") for o in OPTIONAL)]
        assert not loaded, f"{when} imports {loaded}"


# Routing's entry points for a new message: only the ingress calls them (broker/ingress.py:
# every message takes its steps, whatever brought it).
_ROUTING_ENTRY = re.compile(r"routing\.(publish|publish_run|publish_forwarded)\b")


def test_only_the_ingress_calls_routings_publish_entry_points():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("broker", "plugins", "event_relay", "bench")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "broker" / "ingress.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _ROUTING_ENTRY.search(line)
    ]
    assert not found, "route through the Ingress instead: " + ", ".join(found)


# A protocol is a port: what one part needs of another, in one role. Over 10 members it is
# the whole of the other part under another name (test_no_protocol_has_more_than_ten).
MOST_MEMBERS = 10
# Wider today, and being split (#40): each comes off this list when it is narrowed.
BEING_SPLIT: set[str] = set()


def protocol_classes() -> dict[str, tuple[ast.ClassDef, dict[str, str]]]:
    """Every typing.Protocol class of broker/ and hooks/, by `module.Class`, with its
    module's imported names (name -> `module.Name`) to find the bases it inherits."""
    found = {}
    for path in python_files("broker") + python_files("hooks"):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        names = {
            alias.asname or alias.name: f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            for alias in node.names
        }
        for node in tree.body:
            bases = [ast.unparse(base) for base in getattr(node, "bases", [])]
            if isinstance(node, ast.ClassDef) and "Protocol" in bases:
                found[f"{module}.{node.name}"] = (node, names)
    return found


def members(name: str, protocols: dict[str, tuple[ast.ClassDef, dict[str, str]]]) -> set[str]:
    """A protocol's members: its own (attributes and methods) and its bases'."""
    node, names = protocols[name]
    own = {
        item.target.id if isinstance(item, ast.AnnAssign) else item.name
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        or (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))
    }
    for base in (ast.unparse(b) for b in node.bases):
        inherited = names.get(base, f"{name.rpartition('.')[0]}.{base}")
        if inherited in protocols:
            own |= members(inherited, protocols)
    return own


def test_no_protocol_has_more_than_ten_members():
    protocols = protocol_classes()
    wide = {
        name: len(found)
        for name in protocols
        if len(found := members(name, protocols)) > MOST_MEMBERS and name not in BEING_SPLIT
    }
    assert not wide, f"split these protocols by role (at most {MOST_MEMBERS} members): {wide}"


def test_the_member_count_includes_what_a_protocol_inherits():
    protocols = protocol_classes()
    directory = members("broker.admin.SessionDirectory", protocols)
    assert directory == {"settings", "registry", "connections"}
    assert members("broker.admin.CommandRunner", protocols) > directory
    # a base imported from another module counts too
    assert members("broker.client.engine.ClientOutlet", protocols) > members(
        "broker.outlet.Outlet", protocols
    )


def test_the_client_engines_unit_tests_build_no_broker():
    """The engine is served by a port (ClientServices): its tests assemble it from the
    real parts, bytes in and answers out, without broker/server.py or a connection."""
    path = ROOT / "tests" / "unit" / "test_client_engine.py"
    imported = {
        node.module
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
    }
    assert not imported & {"broker.server", "broker.connection"}, imported


# Modules that grew past what a newcomer reads in one sitting were split by job (#40):
# they stay under this many lines.
SMALL_ENOUGH = {"broker/cluster/node.py": 450, "broker/session.py": 450}


@pytest.mark.parametrize("path", sorted(SMALL_ENOUGH))
def test_split_modules_stay_small(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= SMALL_ENOUGH[path], f"{path} has {lines} lines: split it by job"
