"""`nautilus admin ...`: the admin API from the command line (in the spirit of vmq-admin),
talking to a running broker's HTTP server.

    nautilus admin [--url URL] [--key KEY] [--json] COMMAND ...
      session show [--FIELD ...] [--FIELD=VALUE | --FIELD=~REGEX ...] [--limit N]
                                             sessions across the cluster, VerneMQ's
                                             vmq_ql (fields: docs/operations.md)
      session disconnect CONDITIONS [--cleanup]
      session unsubscribe CONDITIONS         the subscriptions matched (--topic=F, ...)
      set KEY=VALUE ...                      on every node, until the next start
      show settings                          what `set` may change, each node's value
      listener show | start ADDRESS | stop ADDRESS [--kill-sessions]
      sessions [--client-id TEXT] [--online | --offline]
      client CLIENT_ID                       subscriptions and queue
      disconnect CLIENT_ID [--cleanup]       --cleanup: delete the session too
      retained [--topic FILTER] [--limit N]
      retained-delete TOPIC                  (these four: [--mountpoint M], the topic tree)
      metrics [--reset]
      plugins
      plugin-enable NAME | plugin-disable NAME
      cluster                                the nodes, their links, the routing score
                                             (also `nautilus cluster status`)
      cluster-show                           the members (also `nautilus cluster show`)
      cluster-join ADDRESS                   metadata = "swc": join the cluster of the
                                             node at ADDRESS (`nautilus cluster join`)
      cluster-leave [NODE]                   metadata = "swc": NODE (default: this node)
                                             leaves the cluster (`nautilus cluster leave`)
      trace client CLIENT_ID [--mountpoint M] [--rate-max N] [--rate-interval MS]
                   [--trunc-payload BYTES]   what the client sends and receives, the hooks
                                             called for it, its session's events, live,
                                             on every node (docs/operations.md)
      trace stop-all                         every trace ends, on every node

The key comes from --key or NAUTILUS_API_KEY (make one with `nautilus api-key add`).
Rows print as aligned columns, or as the API's JSON with --json.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from broker.admin_queries import DEFAULT_FIELDS
from broker.http import trace_cli
from broker.trace_spec import TraceSpec

Query = list[tuple[str, str]]  # an API request's arguments, in order

DEFAULT_URL = "http://127.0.0.1:8888"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nautilus admin", description="Ask a running broker through its admin API."
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the broker's HTTP ({DEFAULT_URL})")
    parser.add_argument("--key", help="an API key (default: $NAUTILUS_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    sessions = commands.add_parser("sessions", help="sessions, online and offline")
    sessions.add_argument("--client-id", default="", help="client ids containing this")
    online = sessions.add_mutually_exclusive_group()
    online.add_argument("--online", action="store_const", const="true", dest="online")
    online.add_argument("--offline", action="store_const", const="false", dest="online")
    client = commands.add_parser("client", help="one client's subscriptions and queue")
    client.add_argument("client_id")
    disconnect = commands.add_parser("disconnect", help="close a client's connection")
    disconnect.add_argument("client_id")
    disconnect.add_argument("--cleanup", action="store_true", help="delete its session too")
    retained = commands.add_parser("retained", help="retained messages")
    retained.add_argument("--topic", default="#", help="a topic filter (default #)")
    retained.add_argument("--limit", type=int, default=1000)
    retained_delete = commands.add_parser("retained-delete", help="clear a retained message")
    retained_delete.add_argument("topic")
    for command in (client, disconnect, retained, retained_delete):
        command.add_argument("--mountpoint", default="", help='the topic tree (default: "")')
    retain = commands.add_parser("retain", help="retained messages: delete-expired")
    retain.add_argument("action", choices=["delete-expired"], help="sweep the expired ones")
    metrics = commands.add_parser("metrics", help="counters and gauges")
    metrics.add_argument("--reset", action="store_true", help="counters back to 0")
    commands.add_parser("plugins", help="plugins and whether their hooks are called")
    commands.add_parser("plugin-enable").add_argument("name")
    commands.add_parser("plugin-disable").add_argument("name")
    auth = commands.add_parser(
        "auth", help="auth decisions kept (publish decisions, auth_db's ACLs)"
    )
    auth.add_argument("action", choices=["invalidate"], help="re-read them now")
    whose = auth.add_mutually_exclusive_group(required=True)
    whose.add_argument("--client-id", help="the connected client with this id")
    whose.add_argument("--username", help="the connected clients of this user")
    whose.add_argument("--all", action="store_true", help="every connected client")
    bridge = commands.add_parser("bridge", help="the bridges to other brokers")
    bridge.add_argument("action", choices=["show", "start", "stop"])
    bridge.add_argument("name", nargs="?", default="", help="start, stop: the bridge")
    session = commands.add_parser(
        "session",
        help="query sessions across the cluster, disconnect them, remove subscriptions",
        description="Terms: --FIELD (show it), --FIELD=VALUE, --FIELD=~REGEX (conditions), "
        "--limit N; disconnect: --cleanup; --json.",
    )
    session.add_argument("action", choices=["show", "disconnect", "unsubscribe"])
    session.add_argument("terms", nargs=argparse.REMAINDER, help="--FIELD[=[~]VALUE] ...")
    setting = commands.add_parser("set", help="change settings on every node (not persisted)")
    setting.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    show = commands.add_parser("show", help="show settings: what `set` may change")
    show.add_argument("what", choices=["settings"])
    listener = commands.add_parser("listener", help="this node's MQTT listeners")
    listener.add_argument("action", choices=["show", "start", "stop"])
    listener.add_argument("address", nargs="?", default="", help="start, stop: which one")
    listener.add_argument(
        "--kill-sessions", action="store_true", help="stop: close its connections too"
    )
    commands.add_parser("cluster", help="the cluster's nodes, links and routing score")
    commands.add_parser("cluster-show", help="the cluster's members")
    commands.add_parser("cluster-join", help="join a cluster (swc)").add_argument("address")
    leave = commands.add_parser("cluster-leave", help="a member leaves the cluster (swc)")
    leave.add_argument("node", nargs="?", default="", help="default: this node")
    trace = commands.add_parser("trace", help="follow a client live (VerneMQ's trace)")
    tracing = trace.add_subparsers(dest="action", required=True)
    trace_client = tracing.add_parser("client", help="stream the client's packets, hooks, events")
    trace_client.add_argument("client_id")
    default = TraceSpec("")  # VerneMQ's defaults
    trace_client.add_argument("--mountpoint", default="", help='its mountpoint (default "")')
    trace_client.add_argument("--rate-max", type=int, default=default.rate_max, help="lines ...")
    trace_client.add_argument(
        "--rate-interval", type=int, default=default.rate_interval, help="... per ms"
    )
    trace_client.add_argument(
        "--trunc-payload", type=int, default=default.trunc_payload, help="bytes shown"
    )
    tracing.add_parser("stop-all", help="end every trace, on every node")
    args = parser.parse_args(argv)
    try:
        _check(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _tree(args: argparse.Namespace) -> dict[str, str]:
    """The --mountpoint argument, when one is given."""
    return {"mountpoint": args.mountpoint} if args.mountpoint else {}


def _check(args: argparse.Namespace) -> None:
    """What argparse cannot see (ValueError): a session command's terms, set's pairs."""
    if args.command == "session":
        if "--json" in args.terms:  # VerneMQ puts it after the terms
            args.terms = [term for term in args.terms if term != "--json"]
            args.json = True
        args.query = session_terms(args.terms)
    elif args.command == "set":
        args.query = [_pair(text) for text in args.settings]
    elif args.command == "listener" and args.action != "show" and not args.address:
        raise ValueError(f"listener {args.action}: which listener (its ADDRESS or index)")


def _pair(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise ValueError(f"set: expected KEY=VALUE, got {text!r}")
    return key, value


def session_terms(terms: list[str]) -> Query:
    """`--FIELD`, `--FIELD=VALUE`, `--limit N` -> the API's arguments (the server checks
    the names and values)."""
    query: Query = []
    words = iter(terms)
    for term in words:
        if not term.startswith("--") or term == "--":
            raise ValueError(f"session: expected --FIELD or --FIELD=VALUE, got {term!r}")
        name, equals, value = term[2:].partition("=")
        if name == "limit" and not equals:
            value = next(words, "")
        elif name == "cleanup":
            value = "true"
        query.append((name, value))
    return query


def request_of(args: argparse.Namespace) -> tuple[str, dict[str, str] | Query]:
    """The API path and query of a command."""
    match args.command:
        case "session":
            query = args.query
            if args.action == "show" and not any(value == "" for _, value in query):
                query = [(name, "") for name in DEFAULT_FIELDS] + query  # VerneMQ's columns
            return f"session/{args.action}", query
        case "set":
            return "set", args.query
        case "show":
            return "settings/show", {}
        case "listener":
            query = {"address": args.address} if args.address else {}
            if args.kill_sessions:
                query["kill_sessions"] = "true"
            return f"listener/{args.action}", query
        case "sessions":  # every field; --client-id: ids containing TEXT, as ever
            query = {"client_id": "~" + re.escape(args.client_id)} if args.client_id else {}
            if args.online is not None:
                query["online"] = args.online
            return "session/show", query
        case "client":
            return "session/client", {"client_id": args.client_id, **_tree(args)}
        case "disconnect":
            query = {"client_id": args.client_id, **_tree(args)}
            if args.cleanup:
                query["cleanup"] = "true"
            return "session/disconnect", query
        case "retained":
            query = {"topic": args.topic, "limit": str(args.limit)}
            return "retain/show", {**query, **_tree(args)}
        case "retained-delete":
            return "retain/delete", {"topic": args.topic, **_tree(args)}
        case "retain":
            return "retain/delete-expired", {}
        case "metrics":
            return ("metrics/reset" if args.reset else "metrics/show"), {}
        case "plugins":
            return "plugin/show", {}
        case "cluster":
            return "cluster/status", {}
        case "cluster-show":
            return "cluster/show", {}
        case "cluster-join":
            return "cluster/join", {"address": args.address}
        case "cluster-leave":
            return "cluster/leave", ({"node": args.node} if args.node else {})
        case "auth":
            if args.all:
                return "auth/invalidate", {"all": "true"}
            if args.client_id:
                return "auth/invalidate", {"client_id": args.client_id}
            return "auth/invalidate", {"username": args.username}
        case "bridge":
            if args.action == "show":
                return "bridge/show", {}
            return f"bridge/{args.action}", {"name": args.name}
        case "trace" if args.action == "client":
            return "trace/client", {
                "client_id": args.client_id,
                "mountpoint": args.mountpoint,
                "rate_max": str(args.rate_max),
                "rate_interval": str(args.rate_interval),
                "trunc_payload": str(args.trunc_payload),
            }
        case "trace":
            return "trace/stop-all", {}
        case "plugin-enable" | "plugin-disable":
            return f"plugin/{args.command.removeprefix('plugin-')}", {"name": args.name}
    raise AssertionError(args.command)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        print(
            f"nautilus admin: --url: expected http://HOST:PORT, got {args.url!r}", file=sys.stderr
        )
        return 2
    key = args.key or os.environ.get("NAUTILUS_API_KEY", "")
    path, query = request_of(args)
    url = f"{args.url.rstrip('/')}/api/v1/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    token = base64.b64encode(f"{key}:".encode()).decode("ascii")
    request = urllib.request.Request(
        url, method="POST", headers={"Authorization": f"Basic {token}"}
    )
    try:
        if path == "trace/client":
            return trace_cli.follow(request, args.json)
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            reason = json.load(exc).get("error", exc.reason)
        except ValueError:
            reason = exc.reason
        print(f"nautilus admin: {exc.code}: {reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"nautilus admin: cannot reach {args.url}: {reason}", file=sys.stderr)
        return 1
    rows = answer.get("table", [])
    for failed in answer.get("errors", []):  # a cluster-wide command: nodes without answer
        print(f"nautilus admin: node {failed['node']}: {failed['error']}", file=sys.stderr)
    if answer.get("truncated"):
        print("nautilus admin: more rows matched (--limit N shows more)", file=sys.stderr)
    if args.json:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    elif args.command == "cluster" and rows:
        print_cluster(rows[0])
    elif args.command in ("client", "metrics") and rows:
        print_record(rows[0])
    else:
        print_table(rows)
    return 1 if answer.get("errors") else 0


def print_cluster(status: dict[str, Any]) -> None:
    """The metadata's state and routing score, then a row per node."""
    score = status["routing_score"]
    share = score["local_share"]
    local = "-" if share is None else f"{share:.0%} local"
    print(
        f"node {status['node']}, metadata {status['metadata']}, routing score {local} "
        f"({score['local']} local / {score['remote']} remote matches)"
    )
    swc = status.get("swc")
    if swc:
        unreachable = ", ".join(swc["unreachable"]) or "none"
        stopped = ", ".join(swc.get("stopped", ()))  # (a node of an older version: none)
        print(
            f"swc: {swc['groups_synced']} of {swc['groups']} groups synced, oldest exchange "
            f"{swc['oldest_exchange_s']:.1f} s ago, unreachable members: {unreachable}"
            + (f", stopped members: {stopped}" if stopped else "")
        )
    if status.get("leaving"):
        print(f"leaving the cluster: {status['leaving']}")
    print_table(status["nodes"])


def print_record(row: dict[str, Any]) -> None:
    """One object (a client, the metrics): a `key  value` line per field."""
    width = max(len(key) for key in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {_cell(value)}".rstrip())


def print_table(rows: list[dict[str, Any]]) -> None:
    """Rows as aligned columns, a header first (the same shape for one row or many)."""
    if not rows:
        print("(none)")
        return
    columns = list(rows[0])
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)
