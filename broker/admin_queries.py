"""Session queries, as VerneMQ's vmq_ql: `session show [--FIELD ...] [--FIELD=VALUE |
--FIELD=~REGEX ...] [--limit N]`, compiled to SELECT fields WHERE ... LIMIT n and run over
one node's sessions (broker/admin.py runs it on every node and joins the rows).

A session is one row; asking for (or filtering on) a subscription field (topic, qos, rap,
no_local) makes it one row per subscription, as VerneMQ does, and a session without any
then has no row. `=` compares with the field's type (true/false, numbers, text; an
absent value, an offline session's peer_host say, equals nothing); `=~` searches the
value's text with a Python regular expression. Every condition must hold. No field asked
for: every session field (the admin API), or DEFAULT_FIELDS (the command's table).

Queries travel between nodes as plain data (`Query.wire`, `Query.from_wire`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.mountpoints import outside

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.session import Session

# Field -> what it holds (docs/operations.md has the same list).
SESSION_FIELDS = {
    "client_id": "the client id",
    "is_online": "a connection is attached",
    "is_offline": "no connection is attached",
    "node": "the node that holds the session",
    "mountpoint": 'its topic tree ("": the default one)',
    "user": "the user name of its connection (offline: of its last one)",
    "peer_host": "the client's address (online only)",
    "peer_port": "the client's port (online only)",
    "protocol": "MQTT protocol level: 3, 4 (3.1.1) or 5 (online only)",
    "clean_session": "it ends with its connection (session expiry 0)",
    "session_expiry": "seconds it outlives its connection (null: forever)",
    "session_started_at": "unix time its connection was accepted (online only)",
    "queue_size": "messages queued for it (in memory and on disk)",
    "online_messages": "messages queued while it is online",
    "offline_messages": "messages queued while it is offline",
    "waiting_acks": "messages sent and not yet acknowledged",
    "num_sessions": "connections attached (several with allow_multiple_sessions)",
    "num_subscriptions": "its subscriptions",
}
SUBSCRIPTION_FIELDS = {
    "topic": "a subscription's topic filter",
    "qos": "its maximum QoS",
    "rap": "retain as published (MQTT 5)",
    "no_local": "no local (MQTT 5)",
}
FIELDS = {**SESSION_FIELDS, **SUBSCRIPTION_FIELDS}
DEFAULT_FIELDS = ("client_id", "is_online", "mountpoint", "peer_host", "peer_port", "user")
DEFAULT_LIMIT = 1000
_BOOLEANS = {"is_online", "is_offline", "clean_session", "rap", "no_local"}
_NUMBERS = {
    "peer_port",
    "protocol",
    "session_expiry",
    "session_started_at",
    "queue_size",
    "online_messages",
    "offline_messages",
    "waiting_acks",
    "num_sessions",
    "num_subscriptions",
    "qos",
}
_TRUE, _FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")


@dataclass(slots=True)
class Query:
    fields: list[str] = field(default_factory=list)  # empty: every session field
    equal: list[tuple[str, Any]] = field(default_factory=list)  # (field, typed value)
    match: list[tuple[str, re.Pattern[str]]] = field(default_factory=list)
    limit: int = DEFAULT_LIMIT

    @property
    def filtered(self) -> bool:
        return bool(self.equal or self.match)

    @property
    def per_subscription(self) -> bool:
        """Whether a row is a subscription (a subscription field is asked for)."""
        named = [*self.fields, *(n for n, _ in self.equal), *(n for n, _ in self.match)]
        return any(name in SUBSCRIPTION_FIELDS for name in named)

    def nodes(self) -> set[str] | None:
        """The nodes `node=...` names (None: any node may hold matching sessions)."""
        named = {str(value) for name, value in self.equal if name == "node"}
        return named or None

    def holds(self, row: dict[str, Any]) -> bool:
        return all(row.get(name) == value for name, value in self.equal) and all(
            pattern.search(_text(row.get(name))) for name, pattern in self.match
        )

    def project(self, row: dict[str, Any]) -> dict[str, Any]:
        names = self.fields or SESSION_FIELDS
        return {name: row.get(name) for name in names}

    def wire(self, limit: int | None = None) -> dict[str, Any]:
        """The query as an ADMIN frame carries it (`limit` instead of its own)."""
        return {
            "fields": self.fields,
            "equal": [list(pair) for pair in self.equal],
            "match": [[name, pattern.pattern] for name, pattern in self.match],
            "limit": self.limit if limit is None else limit,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Query:
        terms = [(name, "") for name in data["fields"]]
        terms += [(name, _untyped(value)) for name, value in data["equal"]]
        terms += [(name, "~" + pattern) for name, pattern in data["match"]]
        return parse(terms, data["limit"])


def parse(terms: Iterable[tuple[str, str]], limit: int = DEFAULT_LIMIT) -> Query:
    """A query from `--name[=value]` terms, dashes gone: `name` alone asks for the field,
    `name=~re` matches, `name=value` compares; `limit=N`. ValueError names the field."""
    query = Query(limit=limit)
    for name, value in terms:
        if name == "limit":
            query.limit = _limit(value)
            continue
        if name == "online":  # the admin API's argument before these queries
            name, value = "is_online", value or "true"
        if name not in FIELDS:
            raise ValueError(f"unknown field {name!r} (fields: {', '.join(FIELDS)})")
        if value == "":
            query.fields.append(name)
        elif value.startswith("~"):
            query.match.append((name, _pattern(name, value[1:])))
        else:
            query.equal.append((name, _typed(name, value)))
    return query


def _limit(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"limit: expected a number of rows (1 or more), got {value!r}")
    return int(value)


def _pattern(name: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{name}: bad regular expression {pattern!r}: {exc}") from None


def _typed(name: str, value: str) -> Any:
    if name in _BOOLEANS:
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    if name in _NUMBERS:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    return value


def _untyped(value: Any) -> str:
    """A typed value back to the text `_typed` reads."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _text(value: Any) -> str:
    """What a regular expression searches: true / false, numbers as digits, "" for none."""
    if value is None:
        return ""
    return _untyped(value)


# -- this node's rows ------------------------------------------------------------------


def matching(
    query: Query,
    node: str,
    sessions: Iterable[Session],
    connections: Iterable[Connection],
    per_subscription: bool = False,
) -> Iterator[tuple[Session, dict[str, Any]]]:
    """Each row (a session, or one of its subscriptions) that holds the conditions,
    with its session, by mountpoint and client id."""
    attached = _attached(connections)
    expand = per_subscription or query.per_subscription
    for session in sorted(sessions, key=lambda s: (s.mountpoint, s.client_id)):
        row = session_row(node, session, attached.get(session, []))
        for candidate in _subscription_rows(session, row) if expand else (row,):
            if query.holds(candidate):
                yield session, candidate


def select(
    query: Query, node: str, sessions: Iterable[Session], connections: Iterable[Connection]
) -> list[dict[str, Any]]:
    """`session show` on this node: the rows, projected, at most `limit`."""
    rows = []
    for _, row in matching(query, node, sessions, connections):
        rows.append(query.project(row))
        if len(rows) >= query.limit:
            break
    return rows


def _attached(connections: Iterable[Connection]) -> dict[Session, list[Connection]]:
    """The connections of each registered session (with allow_multiple_sessions a
    connection's session is one member of the registered one: its owner)."""
    attached: dict[Session, list[Connection]] = {}
    for connection in connections:
        session = connection.session
        if session is not None:
            attached.setdefault(session.owner, []).append(connection)
    return attached


def session_row(node: str, session: Session, connections: list[Connection]) -> dict[str, Any]:
    connection = connections[0] if connections else None
    client = connection.client if connection is not None else None
    online = session.online
    queued = len(session.queue) + session.on_disk
    return {
        "client_id": session.client_id,
        "is_online": online,
        "is_offline": not online,
        "node": node,
        "mountpoint": session.mountpoint,
        "user": client.username if client is not None else session.username,
        "peer_host": client.peer[0] if client is not None else None,
        "peer_port": client.peer[1] if client is not None else None,
        "protocol": client.protocol_level if client is not None else None,
        "clean_session": session.expiry == 0,
        "session_expiry": session.expiry,
        "session_started_at": connection.connected_at if connection is not None else None,
        "queue_size": queued,
        "online_messages": queued if online else 0,
        "offline_messages": 0 if online else queued,
        "waiting_acks": len(session.inflight),
        "num_sessions": len(connections),
        "num_subscriptions": len(session.subscriptions),
    }


def _subscription_rows(session: Session, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for topic_filter, options in sorted(session.subscriptions.items()):
        yield {
            **row,
            "topic": outside(topic_filter),  # as its clients know it
            "qos": options.qos,
            "rap": options.retain_as_published,
            "no_local": options.no_local,
        }
