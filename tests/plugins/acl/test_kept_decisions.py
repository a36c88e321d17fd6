"""Property: a kept publish decision (broker/ingress.py, recall / remember) is always the
answer the chain would give now, for random ACL files, reloads, clients, topics, QoS and
retain flags: the real acl plugin, in a real hook chain."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client_state import ClientState
from broker.ingress import Ingress, context_of
from broker.protocol import Publish
from hooks import Hooks
from hooks.decisions import GENERATION
from plugins.acl import AclPlugin, RuleSet
from plugins.acl.schema import Config

from .helpers import write_acl

LEVELS = st.sampled_from(["a", "b", "c1", "u1"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=3).map("/".join)
FILTERS = st.lists(st.sampled_from(["a", "b", "c1", "+", "%c", "%u"]), min_size=1, max_size=3)
ACCESS = st.sampled_from(["", "read ", "write "])


@st.composite
def rule(draw: st.DrawFn) -> str:
    levels = draw(FILTERS)
    if draw(st.booleans()):
        levels.append("#")
    kind = "pattern" if any(level.startswith("%") for level in levels) else "topic"
    label = draw(st.sampled_from(["", " label metered", " label free"]))
    return f"{kind} {draw(ACCESS)}{'/'.join(levels)}{label}"


@st.composite
def acl_text(draw: st.DrawFn) -> str:
    everyone = draw(st.lists(rule(), max_size=4))
    users = draw(st.lists(st.tuples(st.sampled_from(["u1", "u2"]), rule()), max_size=3))
    lines = [r for r in everyone if r.startswith("topic")]
    lines += [r for r in everyone if r.startswith("pattern")]
    for user, line in users:
        if line.startswith("topic"):
            lines += [f"user {user}", line]
    return "\n".join(lines) + "\n"


MESSAGE = st.tuples(st.integers(0, 2), TOPICS, st.integers(0, 2), st.booleans())
# Steps: publish one of a few messages (so that each comes again, across reloads), or
# reload the rules.
STEP = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), acl_text())


@settings(max_examples=200, deadline=None)
@given(
    first=acl_text(),
    messages=st.lists(MESSAGE, min_size=4, max_size=4),
    steps=st.lists(STEP, max_size=40),
)
def test_a_kept_decision_is_the_chains_answer(first, messages, steps):
    with tempfile.TemporaryDirectory() as directory:
        path = write_acl(Path(directory) / "acl", first)
        plugin = AclPlugin(Config(acl_file=str(path), publish_rate_limits={"metered": 1000}))
    chain = Hooks([("acl", plugin)]).chain("auth_on_publish")
    clients = []
    for i in range(3):
        client = ClientState()
        client.client_id, client.username = f"c{i}", f"u{i}"
        clients.append(client)
    promised: set[tuple[int, str, int, bool]] = set()  # kept since the last reload
    for step in steps:
        if isinstance(step, str):
            plugin.swap(RuleSet.from_text(step))
            promised.clear()
            continue
        who, topic, qos, retain = messages[step]
        client, packet = clients[who], Publish(topic, b"x", qos, retain, packet_id=1)
        kept = Ingress.recall(client, packet, 0.0)
        answer = chain.run_sync(context_of(client, packet))
        if kept is not None:
            assert kept == answer, (topic, qos, retain)
        else:
            assert (who, topic, qos, retain) not in promised  # what holds is kept
            Ingress.remember(client, packet, answer, 0.0, GENERATION.value)
            if answer.cache_for is not None:
                promised.add((who, topic, qos, retain))
