"""plugins/acl/rules.py: the ACL file parser and the matcher, without a broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.topics import acl_matches as matches
from broker.topics import valid_topic_filter
from plugins.acl.rules import AclSyntaxError, RuleSet, Slot, Trie, parse


def check(text: str, access: str, topic: str, client_id: str = "c", username=None, **kw):
    return RuleSet.from_text(text).check(access, topic, client_id, username, **kw)


def allowed(text: str, access: str, topic: str, client_id: str = "c", username=None, **kw):
    return check(text, access, topic, client_id, username, **kw) is not None


# -- parsing -----------------------------------------------------------------------------


def test_parse_every_kind_of_line():
    rules = parse(
        "# comment\n"
        "\n"
        "topic a/b\n"
        "topic read r/#\n"
        "topic write w/+\n"
        "user alice\n"
        "topic alice/# label mine\n"
        "pattern read p/%u/%c\n"
        "token write t/%(c, :, 2) label tok\n"
    )
    summary = [(r.kind, r.access, r.filter, r.user, r.label, r.line) for r in rules]
    assert summary == [
        ("topic", "read", "a/b", None, None, 3),
        ("topic", "write", "a/b", None, None, 3),
        ("topic", "read", "r/#", None, None, 4),
        ("topic", "write", "w/+", None, None, 5),
        ("topic", "read", "alice/#", "alice", "mine", 7),
        ("topic", "write", "alice/#", "alice", "mine", 7),
        ("pattern", "read", "p/%u/%c", None, None, 8),
        ("token", "write", "t/%(c, :, 2)", None, "tok", 9),
    ]
    assert rules[6].levels == ("p", Slot("u", "%u"), Slot("c", "%c"))
    assert rules[7].levels == ("t", Slot("c", "%(c, :, 2)", delim=":", index=2))


def test_whitespace_tabs_and_crlf_are_trimmed():
    rules = parse("  \t topic\tread   a/b  \t\r\n\t# indented comment\r\n   \r\n")
    assert [(r.access, r.filter) for r in rules] == [("read", "a/b")]


def test_filters_may_contain_spaces():
    rules = parse("topic read my topic/x\n")
    assert [r.filter for r in rules] == ["my topic/x"]


def test_topic_read_alone_is_the_topic_read():
    # VerneMQ matches the prefix "topic read " (with its space): without a filter after
    # it, "read" is the filter itself.
    assert [(r.access, r.filter) for r in parse("topic read")] == [
        ("read", "read"),
        ("write", "read"),
    ]


def test_a_label_on_topic_pattern_and_token_lines():
    rules = parse("topic a label one\npattern read b/%c label two\ntoken c/%(u, -, 1) label three")
    assert [r.label for r in rules] == ["one", "one", "two", "three", "three"]


def test_pattern_lines_are_global_wherever_they_appear():
    text = "user alice\npattern read p/%c\n"
    assert allowed(text, "read", "p/bob-client", "bob-client", "bob")
    assert allowed(text, "read", "p/c", "c", None)


def test_user_switches_for_the_topic_lines_after_it():
    text = "topic all/x\nuser alice\ntopic a/x\nuser bob\ntopic b/x\n"
    assert allowed(text, "read", "a/x", username="alice")
    assert not allowed(text, "read", "b/x", username="alice")
    assert allowed(text, "read", "b/x", username="bob")
    assert not allowed(text, "read", "a/x", username="bob")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("topic a\nfoo bar\n", 2, "unknown keyword 'foo'"),
        ("topic a\nTopic b\n", 2, "unknown keyword 'Topic'"),
        ("user\n", 1, "`user` needs a username"),
        ("topic a\n\n# c\ntopic\n", 4, "`topic` needs a topic filter"),
        ("pattern \n", 1, "`pattern` needs a topic filter"),
        ("token read label x\n", 1, "`token` needs a topic filter"),
        ("topic a/#/b\n", 1, "invalid topic filter 'a/#/b'"),
        ("topic read a+/b\n", 1, "invalid topic filter 'a+/b'"),
        ("topic read a/b#\n", 1, "invalid topic filter 'a/b#'"),
        ("topic a label\n", 1, "`label` takes exactly one name"),
        ("topic a label x y\n", 1, "`label` takes exactly one name"),
        ("topic label x\n", 1, "`topic` needs a topic filter"),
        ("token a/%(x, :, 1)\n", 1, "bad token level '%(x, :, 1)'"),
        ("token a/%(u, ;, 1)\n", 1, "bad token level '%(u, ;, 1)'"),
        ("token a/%(u, :, )\n", 1, "bad token level"),
        ("token a/%(u, :, 0)\n", 1, "pieces are counted from 1"),
        ("token a/%p\n", 1, "bad token level '%p'"),
        ("token a/%(claim, )\n", 1, "bad token level"),
        ("x\n", 1, "unknown keyword 'x'"),
    ],
)
def test_bad_lines_name_their_line(text, line, message):
    with pytest.raises(AclSyntaxError) as caught:
        parse(text)
    assert caught.value.line == line
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"line {line}: ")


def test_percent_levels_that_are_not_substitutions_stay_plain():
    # VerneMQ substitutes whole levels only; pattern lines know no %(...) syntax.
    text = "pattern read a%u/%x/%(c, :, 1)\ntoken read t/x%u\n"
    assert allowed(text, "read", "a%u/%x/%(c, :, 1)", "c:d", "u")
    assert allowed(text, "read", "t/x%u", username="u")
    assert not allowed(text, "read", "au/%x/%(c, :, 1)", "c:d", "u")


# -- matching, level by level (vmq_topic:match) ------------------------------------------


@pytest.mark.parametrize(
    ("acl", "request_", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/b", "a", False),
        ("a/b", "a/b/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a", False),
        ("a/+", "a/b/c", False),
        ("a/+", "a/+", True),  # the request's wildcard is a plain level
        ("a/+", "a/#", True),  # quirk: `a/+` allows subscribing to `a/#`
        ("a/b", "a/+", False),
        ("a/b", "a/#", False),
        ("a/#", "a", True),  # a trailing # matches the parent
        ("a/#", "a/b/c", True),
        ("a/#", "a/#", True),
        ("a/#", "b", False),
        ("#", "anything/at/all", True),
        ("#", "$SYS/x", True),  # no $ rule in ACLs (as VerneMQ)
        ("+/#", "a", True),
        ("a/+/#", "a", False),
        ("a/+/#", "a/b", True),
        ("/a", "/a", True),
        ("+/a", "/a", True),  # an empty first level
        ("a//b", "a//b", True),
        ("a/+/b", "a//b", True),
    ],
)
def test_matching(acl, request_, expected):
    assert allowed(f"topic read {acl}", "read", request_) is expected
    assert matches(tuple(acl.split("/")), request_.split("/")) is expected


def test_access_is_separate_for_read_and_write():
    text = "topic read r\ntopic write w\ntopic both\n"
    assert allowed(text, "read", "r") and not allowed(text, "write", "r")
    assert allowed(text, "write", "w") and not allowed(text, "read", "w")
    assert allowed(text, "read", "both") and allowed(text, "write", "both")


def test_the_all_table_applies_to_everyone():
    text = "topic pub/#\nuser alice\ntopic alice/#\n"
    for username in (None, "alice", "bob", "all"):
        assert allowed(text, "write", "pub/x", username=username)


def test_anonymous_clients_have_no_user_table():
    assert not allowed("user None\ntopic x\n", "read", "x", username=None)
    assert allowed("user None\ntopic x\n", "read", "x", username="None")


def test_an_empty_file_allows_nothing():
    assert not allowed("", "read", "a")
    assert not allowed("# only comments\n", "write", "a")


# -- substitutions -----------------------------------------------------------------------


def test_pattern_substitutes_username_client_id_and_mountpoint():
    text = "pattern write %m/%u/%c/#\n"
    assert allowed(text, "write", "/alice/dev1/x", "dev1", "alice")
    assert allowed(text, "write", "mp/alice/dev1", "dev1", "alice", mountpoint="mp")
    assert not allowed(text, "write", "/alice/dev2/x", "dev1", "alice")
    assert not allowed(text, "write", "/bob/dev1/x", "dev1", "alice")


def test_a_pattern_with_percent_u_never_matches_anonymous_clients():
    text = "pattern read u/%u\n"
    assert not allowed(text, "read", "u/", "c", None)
    assert not allowed(text, "read", "u/None", "c", None)


@pytest.mark.parametrize("value", ["+", "#", "a/b", "x+", "#y"])
def test_substituted_values_are_never_wildcards(value):
    # A client id "+" must not make `clients/%c/#` a filter over every client.
    text = "pattern read clients/%c/#\ntoken read t/%(claim, room)\n"
    for request in (f"clients/{value}/x", "clients/+/x", "clients/other/x", "clients/#"):
        assert not allowed(text, "read", request, value)
    for request in ("t/+", "t/#", f"t/{value}"):
        assert not allowed(text, "read", request, claims={"room": value})


@pytest.mark.parametrize(
    ("token", "client_id", "username", "topic", "expected"),
    [
        ("%(c, :, 3)", "device:owner:profile", None, "profile", True),
        ("%(c, :, 1)", "device:owner:profile", None, "device", True),
        ("%( c  , :, 2)", "device:owner:profile", None, "owner", True),
        ("%(c, :, 3)", "device:owner:profile", None, "owner", False),
        ("%(c, :, 4)", "device:owner:profile", None, "", False),  # out of range: no value
        ("%(c, -, 2)", "a-b-c", None, "b", True),
        ("%(c, |, 2)", "a|b", None, "b", True),
        ("%(c, :, 2)", "a::b", None, "b", True),  # empty pieces are skipped (nth_lexeme)
        ("%(c, :, 1)", ":a", None, "a", True),
        ("%(c, :, 1)", "plain", None, "plain", True),  # no delimiter: the whole id
        ("%(u, :, 2)", "c", "user:1:name", "1", True),
        ("%(u, :, 2)", "c:2:x", "user:1:name", "2", False),
        ("%(u, :, 1)", "c", None, "None", False),  # anonymous: never
    ],
)
def test_token_pieces(token, client_id, username, topic, expected):
    text = f"token read example/{token}\n"
    assert allowed(text, "read", f"example/{topic}", client_id, username) is expected


def test_token_lines_also_take_percent_u_c_m():
    text = "token write x/%u/%c/%m/%(c, -, 1)\n"
    assert allowed(text, "write", "x/alice/d-1/mp/d", "d-1", "alice", mountpoint="mp")


def test_claims():
    text = "token read tenants/%(claim, tenant)/#\ntoken write rooms/%(claim,room)/%c\n"
    claims = {"tenant": "acme", "room": 42}
    assert allowed(text, "read", "tenants/acme/x", claims=claims)
    assert not allowed(text, "read", "tenants/other/x", claims=claims)
    assert allowed(text, "write", "rooms/42/c", claims=claims)  # str() of the value
    assert not allowed(text, "read", "tenants/acme/x", claims={"room": 1})  # claim missing
    assert not allowed(text, "read", "tenants/acme/x", claims=None)  # no token at all
    assert not allowed(text, "read", "tenants/None/x", claims={"tenant": None})


def test_a_view_key_covers_what_decisions_depend_on():
    rules = RuleSet.from_text("token read t/%(claim, tenant)\n")
    assert rules.claims == ("tenant",)
    a = rules.view("c", "u", claims={"tenant": "a", "other": 1})
    b = rules.view("c", "u", claims={"tenant": "b"})
    same = rules.view("c", "u", claims={"tenant": "a", "other": 2})
    assert a.key != b.key
    assert a.key == same.key  # claims no rule reads do not split the cache
    assert rules.view("c", "u").key != rules.view("c", "v").key
    assert rules.view("c", None).key != rules.view("c", "None").key


# -- check order and labels --------------------------------------------------------------


def test_check_order_all_user_pattern_token():
    layers = [
        "topic read x/# label all",
        "user alice\ntopic read x/+ label user",
        "pattern read x/%c label pattern",
        "token read x/%(c, :, 1) label token",
    ]
    # With every layer present the "all" table decides; remove it and the next one does.
    for expected in ("all", "user", "pattern", "token"):
        rule = check("\n".join(layers), "read", "x/dev", "dev", "alice")
        assert rule is not None and rule.label == expected
        layers.pop(0)
    assert check("\n".join(layers), "read", "x/dev", "dev", "alice") is None
    # The order holds even when the later tables come first in the file.
    text = "token read x/%(c, :, 1) label token\npattern read x/%c label pattern\ntopic read x/#"
    assert check(text, "read", "x/dev", "dev").label is None


def test_within_a_table_the_earliest_line_wins():
    text = "topic read a/+ label first\ntopic read a/b label second\ntopic read # label third\n"
    assert check(text, "read", "a/b").label == "first"
    text = "topic read a/b/# label first\ntopic read a/+/c label second\n"
    assert check(text, "read", "a/b/c").label == "first"
    text = "topic read a/+/c label first\ntopic read a/b/# label second\n"
    assert check(text, "read", "a/b/c").label == "first"


def test_earliest_line_wins_between_fixed_and_substituted_patterns():
    text = "pattern read d/%c label subst\npattern read d/+ label fixed\n"
    assert check(text, "read", "d/c1", "c1").label == "subst"
    assert check(text, "read", "d/c2", "c1").label == "fixed"
    text = "pattern read d/+ label fixed\npattern read d/%c label subst\n"
    assert check(text, "read", "d/c1", "c1").label == "fixed"


def test_duplicate_filters_keep_the_first_label():
    text = "topic read a label one\ntopic read a label two\n"
    assert check(text, "read", "a").label == "one"


# -- the trie agrees with a plain scan ---------------------------------------------------

_level = st.sampled_from(["a", "b", "", "+", "#"])


@given(
    filters=st.lists(st.lists(_level, min_size=1, max_size=4), min_size=1, max_size=12),
    request_=st.lists(st.sampled_from(["a", "b", "", "+", "#", "c"]), min_size=1, max_size=5),
)
def test_trie_finds_the_earliest_matching_filter(filters, request_):
    filters = [f for f in ("/".join(levels) for levels in filters) if valid_topic_filter(f)]
    rules = parse("".join(f"topic read {f}\n" for f in filters))
    trie = Trie()
    for rule in rules:
        trie.add(rule.levels, rule)
    expected = next((r for r in rules if matches(r.levels, request_)), None)
    assert trie.best(request_) == expected
