"""ACL files: the parser and the compiled matcher. Pure: no I/O, no clock, no asyncio.

The syntax is VerneMQ's vmq_acl plus Courier's tokenized lines (see docs/plugins/acl.md):

    # comment
    topic [read|write] <filter> [label <name>]      before any `user` line: everyone
    user <username>                                  the `topic` lines after it: that user
    pattern [read|write] <filter> [label <name>]     %u %c %m levels, for everyone
    token [read|write] <filter> [label <name>]       also %(u|c, <delim>, <N>), %(claim, <name>)

A request (a PUBLISH topic for write, a SUBSCRIBE filter for read) is checked against the
"all" rules, then the user's, then the patterns, then the tokens; the first table with a
match decides, and within a table the earliest line wins (its label is the one reported).
Matching goes level by level with the request's own wildcards taken as plain levels, so
ACL `a/+` also allows subscribing to `a/#`, and a trailing `#` matches its parent level.

Compiled once per load: the fixed rules of each table go into a trie; the rules with a
substitution are resolved once per client (`RuleSet.view`). A substituted value is always
a literal level: a value containing `/`, `+` or `#` (a client id `+`, say) makes the rule
not apply to that client rather than turn into a wildcard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.topics import acl_matches, valid_topic_filter

Access = Literal["read", "write"]
Kind = Literal["topic", "pattern", "token"]

_TOKEN = re.compile(r"%\(\s*(u|c)\s*,\s*(:|-|\|)\s*,\s*([0-9]+)\s*\)")
_CLAIM = re.compile(r"%\(\s*claim\s*,\s*([^\s,()]+)\s*\)")
_ACCESS = re.compile(r"(read|write)\s+(\S.*)")
_LABEL = re.compile(r"(?:^|\s)label(?:\s+|$)")
_SIMPLE_SLOTS: dict[str, Literal["u", "c", "m"]] = {"%u": "u", "%c": "c", "%m": "m"}
_KINDS: dict[str, Kind] = {"topic": "topic", "pattern": "pattern", "token": "token"}
_ACCESSES: dict[str, Access] = {"read": "read", "write": "write"}


class AclSyntaxError(ValueError):
    """A line the parser cannot take; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class Slot:
    """A level substituted per client: %u, %c, %m, %(u|c, delim, N) or %(claim, name)."""

    source: Literal["u", "c", "m", "claim"]
    text: str  # as written, for messages
    delim: str | None = None
    index: int = 0  # 1-based piece of the username / client id
    claim: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    kind: Kind
    access: Access
    filter: str  # as written
    levels: tuple[str | Slot, ...]
    line: int
    user: str | None = None  # topic lines after a `user` line
    label: str | None = None

    @property
    def slotted(self) -> bool:
        return any(type(level) is Slot for level in self.levels)


# -- parsing -----------------------------------------------------------------------------


def parse(text: str) -> list[Rule]:
    """Every rule of an ACL file, in file order; AclSyntaxError on the first bad line."""
    rules: list[Rule] = []
    user: str | None = None
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t\r\n")
        if not line or line.startswith("#"):
            continue
        keyword, *more = line.split(None, 1)
        rest = more[0] if more else ""
        if keyword == "user":
            if not rest:
                raise AclSyntaxError(number, "`user` needs a username")
            user = rest
        elif kind := _KINDS.get(keyword):
            rules.extend(_rules(kind, rest, user if kind == "topic" else None, number))
        else:
            raise AclSyntaxError(
                number, f"unknown keyword {keyword!r} (expected topic, user, pattern or token)"
            )
    return rules


def _rules(kind: Kind, rest: str, user: str | None, number: int) -> list[Rule]:
    accesses: tuple[Access, ...] = ("read", "write")
    if access := _ACCESS.fullmatch(rest):  # `topic read` alone is the topic "read", as in VerneMQ
        accesses, rest = (_ACCESSES[access[1]],), access[2]
    label = None
    found = _LABEL.search(rest)
    if found:
        rest, names = rest[: found.start()].rstrip(" \t"), rest[found.end() :].split()
        if len(names) != 1:
            raise AclSyntaxError(number, "`label` takes exactly one name")
        label = names[0]
    if not rest:
        raise AclSyntaxError(number, f"`{kind}` needs a topic filter")
    if not valid_topic_filter(rest):
        raise AclSyntaxError(number, f"invalid topic filter {rest!r}")
    levels = tuple(_level(kind, level, number) for level in rest.split("/"))
    return [Rule(kind, access, rest, levels, number, user, label) for access in accesses]


def _level(kind: Kind, level: str, number: int) -> str | Slot:
    if kind == "topic" or not level.startswith("%"):
        return level
    if level in _SIMPLE_SLOTS:
        return Slot(_SIMPLE_SLOTS[level], level)
    if kind == "pattern":
        return level  # VerneMQ: anything else is a plain level
    if match := _TOKEN.fullmatch(level):
        source, delim, index = match.groups()
        if int(index) < 1:
            raise AclSyntaxError(number, f"{level!r}: pieces are counted from 1")
        user_or_client: Literal["u", "c"] = "u" if source == "u" else "c"
        return Slot(user_or_client, level, delim=delim, index=int(index))
    if match := _CLAIM.fullmatch(level):
        return Slot("claim", level, claim=match[1])
    raise AclSyntaxError(
        number, f"bad token level {level!r} (expected %(u|c, <: - |>, <N>) or %(claim, <name>))"
    )


# -- matching ----------------------------------------------------------------------------


class _Node:
    __slots__ = ("children", "end", "hash", "plus")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.plus: _Node | None = None
        self.hash: Rule | None = None  # `#` here: matches the rest, or nothing more
        self.end: Rule | None = None  # a filter ending here


class Trie:
    """Fixed ACL filters; `best` finds the earliest-line rule matching a request."""

    __slots__ = ("root", "size")

    def __init__(self) -> None:
        self.root = _Node()
        self.size = 0

    def add(self, levels: Iterable[str], rule: Rule) -> None:
        """Add in file order: on a duplicate filter the earlier rule stays."""
        self.size += 1
        node = self.root
        for level in levels:
            if level == "#":
                if node.hash is None:
                    node.hash = rule
                return
            if level == "+":
                if node.plus is None:
                    node.plus = _Node()
                node = node.plus
            else:
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Node()
                node = child
        if node.end is None:
            node.end = rule

    def best(self, request: list[str]) -> Rule | None:
        return _walk(self.root, request, 0, None) if self.size else None


def _earlier(a: Rule | None, b: Rule | None) -> Rule | None:
    if a is None:
        return b
    if b is None or a.line <= b.line:
        return a
    return b


def _walk(node: _Node, request: list[str], i: int, best: Rule | None) -> Rule | None:
    n = len(request)
    while True:
        if node.hash is not None:
            best = _earlier(node.hash, best)
        if i == n:
            return _earlier(node.end, best)
        if node.plus is not None:
            best = _walk(node.plus, request, i + 1, best)
        child = node.children.get(request[i])
        if child is None:
            return best
        node, i = child, i + 1


@dataclass(slots=True)
class _Table:
    """One table of one access: fixed filters in a trie, substituted ones in file order."""

    fixed: Trie
    slotted: list[Rule]


class RuleSet:
    """A compiled ACL file. Immutable once built: a reload builds a new one."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        self._all = {a: _Table(Trie(), []) for a in ("read", "write")}
        self._users: dict[Access, dict[str, _Table]] = {"read": {}, "write": {}}
        self._pattern = {a: _Table(Trie(), []) for a in ("read", "write")}
        self._token = {a: _Table(Trie(), []) for a in ("read", "write")}
        claims: set[str] = set()
        for rule in self.rules:
            if rule.kind == "pattern":
                table = self._pattern[rule.access]
            elif rule.kind == "token":
                table = self._token[rule.access]
            elif rule.user is None:
                table = self._all[rule.access]
            else:
                users = self._users[rule.access]
                table = users.get(rule.user) or users.setdefault(rule.user, _Table(Trie(), []))
            if rule.slotted:
                table.slotted.append(rule)
                claims.update(s.claim for s in rule.levels if type(s) is Slot and s.claim)
            else:
                table.fixed.add(rule.levels, rule)  # type: ignore[arg-type]  # not slotted: all str
        self.claims = tuple(sorted(claims))  # the claims some rule looks at

    @classmethod
    def from_text(cls, text: str) -> RuleSet:
        return cls(parse(text))

    def __len__(self) -> int:
        return len(self.rules)

    def view(
        self,
        client_id: str,
        username: str | None = None,
        mountpoint: str = "",
        claims: Mapping[str, Any] | None = None,
    ) -> ClientView:
        """The rules as they apply to one client: substitutions resolved once."""
        return ClientView(self, client_id, username, mountpoint, claims)

    def check(
        self,
        access: Access,
        topic: str,
        client_id: str,
        username: str | None = None,
        mountpoint: str = "",
        claims: Mapping[str, Any] | None = None,
    ) -> Rule | None:
        """The rule that allows `access` to `topic` for this client, or None."""
        return self.view(client_id, username, mountpoint, claims).check(access, topic)


class ClientView:
    """One client's tables, checked in order all -> user -> pattern -> token."""

    __slots__ = ("claims", "client_id", "key", "mountpoint", "read", "rules", "username", "write")

    def __init__(
        self,
        rules: RuleSet,
        client_id: str,
        username: str | None,
        mountpoint: str,
        claims: Mapping[str, Any] | None,
    ) -> None:
        self.rules = rules
        self.client_id = client_id
        self.username = username
        self.mountpoint = mountpoint
        self.claims = claims
        used = tuple(_claim(claims, name) for name in rules.claims)
        # What the decisions depend on, as one string (its hash is computed once).
        self.key = repr((client_id, username, mountpoint, used))
        self.read: tuple | None = None  # resolved on the first check of that access
        self.write: tuple | None = None

    def _resolve(self, access: Access) -> tuple[tuple[Trie, list], ...]:
        tables = self._tables(access)
        setattr(self, access, tables)
        return tables

    def _tables(self, access: Access) -> tuple[tuple[Trie, list], ...]:
        rules = self.rules
        tables = [rules._all[access]]
        if self.username is not None and self.username in rules._users[access]:
            tables.append(rules._users[access][self.username])
        tables += [rules._pattern[access], rules._token[access]]
        resolved = []
        for table in tables:
            slotted = []
            for rule in table.slotted:
                levels = self._substitute(rule.levels)
                if levels is not None:
                    slotted.append((levels, rule))
            if table.fixed.size or slotted:
                resolved.append((table.fixed, slotted))
        return tuple(resolved)

    def _substitute(self, levels: tuple[str | Slot, ...]) -> tuple[str, ...] | None:
        out = []
        for level in levels:
            if isinstance(level, Slot):
                value = self._value(level)
                if value is None or "/" in value or "+" in value or "#" in value:
                    return None  # the rule does not apply to this client
                out.append(value)
            else:
                out.append(level)
        return tuple(out)

    def _value(self, slot: Slot) -> str | None:
        source = slot.source
        if source == "claim":
            return _claim(self.claims, slot.claim)  # type: ignore[arg-type]  # set with "claim"
        if source == "m":
            return self.mountpoint
        value = self.username if source == "u" else self.client_id
        if value is None or slot.delim is None:
            return value
        # Erlang's string:nth_lexeme: empty pieces are skipped; out of range: no value.
        pieces = [piece for piece in value.split(slot.delim) if piece]
        return pieces[slot.index - 1] if slot.index <= len(pieces) else None

    def pattern(self, rule: Rule) -> str:
        """The rule's filter as it applies to this client (%u, %c, %m... substituted)."""
        if not rule.slotted:
            return rule.filter
        levels = self._substitute(rule.levels)
        return rule.filter if levels is None else "/".join(levels)

    def check(self, access: Access, topic: str) -> Rule | None:
        """The earliest rule of the first table that matches, or None."""
        request = topic.split("/")
        tables = self.write if access == "write" else self.read
        if tables is None:
            tables = self._resolve(access)
        for fixed, slotted in tables:
            best = fixed.best(request)
            for levels, rule in slotted:
                if best is not None and rule.line > best.line:
                    break
                if acl_matches(levels, request):
                    best = rule
                    break
            if best is not None:
                return best
        return None


def _claim(claims: Mapping[str, Any] | None, name: str) -> str | None:
    if claims is None or name not in claims:
        return None
    value = claims[name]
    return None if value is None else str(value)
