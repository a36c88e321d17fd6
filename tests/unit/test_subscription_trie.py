"""The subscription trie on its own (broker/subscription_trie.py), checked against the brute-force
matcher `broker.topics.topic_matches` for random filters and topics."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mountpoints import inside
from broker.subscription_trie import Route, SharedGroup, SubOptions, SubscriptionTrie
from broker.topics import topic_matches

from .fakes import FakeSubscriber

# --------------------------------------------------------------------------- strategies

# Few distinct words, so that random filters and topics often meet; "" is a legal level.
WORDS = ["a", "b", "c", ""]
topic_level = st.sampled_from(WORDS)
# Some in a mountpoint's tree (broker/mountpoints.py): the trees must stay apart.
trees = st.sampled_from(["", "", "m", "n"])
topics = st.builds(
    lambda tree, first, rest: inside(tree, "/".join([first, *rest])),
    trees,
    st.sampled_from([*WORDS, "$SYS", "$x"]),
    st.lists(topic_level, max_size=3),
)
filter_level = st.sampled_from([*WORDS, "+"])
filters = st.builds(
    lambda tree, first, rest, hash_: inside(tree, "/".join([first, *rest] + (["#"] * hash_))),
    trees,
    st.sampled_from([*WORDS, "+", "$SYS"]),
    st.lists(filter_level, max_size=3),
    st.booleans(),
) | st.sampled_from(["#", inside("m", "#")])
qos = st.integers(0, 2)


def expected_routes(subs: dict[tuple[int, str], tuple[int, int | None]], topic: str) -> dict:
    """subscriber index -> (max QoS, sorted subscription ids), by brute force."""
    out: dict[int, tuple[int, list[int]]] = {}
    for (index, topic_filter), (q, sub_id) in subs.items():
        if not topic_matches(topic_filter, topic):
            continue
        best, ids = out.get(index, (0, []))
        out[index] = (max(best, q), sorted(ids + ([sub_id] if sub_id is not None else [])))
    return out


def routes_by_index(routes: list[Route], people: list[FakeSubscriber]) -> dict:
    return {people.index(r.subscriber): (r.qos, sorted(r.subscription_ids)) for r in routes}


# --------------------------------------------------------------------------- matching


# One step of a random history: subscribe, unsubscribe, or match and compare.
steps = st.one_of(
    st.tuples(st.just("sub"), st.integers(0, 4), filters, qos, st.none() | st.integers(1, 9)),
    st.tuples(st.just("unsub"), st.integers(0, 4), filters),  # mostly not subscribed
    st.tuples(st.just("unsub-existing"), st.integers(0, 100)),
    st.tuples(st.just("match"), st.integers(0, 100)),  # one of a few topics, so they repeat
)


@settings(max_examples=300, deadline=None)
@given(probes=st.lists(topics, min_size=1, max_size=4), history=st.lists(steps, max_size=40))
def test_match_agrees_with_brute_force(probes, history):
    # Matches are cached per topic: interleaving them with (un)subscribes checks that
    # every change invalidates what it must.
    router = SubscriptionTrie()
    people = [FakeSubscriber(f"s{i}") for i in range(5)]
    state: dict[tuple[int, str], tuple[int, int | None]] = {}
    for step in history:
        if step[0] == "sub":
            _, index, topic_filter, q, sub_id = step
            options = SubOptions(q, subscription_id=sub_id)
            is_new = router.subscribe(people[index], topic_filter, options)
            assert is_new == ((index, topic_filter) not in state)
            state[index, topic_filter] = (q, sub_id)
        elif step[0] == "unsub":
            _, index, topic_filter = step
            assert router.unsubscribe(people[index], topic_filter) == (
                state.pop((index, topic_filter), None) is not None
            )
        elif step[0] == "unsub-existing":
            if state:
                index, topic_filter = sorted(state)[step[1] % len(state)]
                assert router.unsubscribe(people[index], topic_filter)
                del state[index, topic_filter]
        else:
            topic = probes[step[1] % len(probes)]
            routes = router.match(topic)
            assert len({id(r.subscriber) for r in routes}) == len(routes)  # one Route each
            assert routes_by_index(routes, people) == expected_routes(state, topic)
    assert router.subscription_count == len(state)
    # Unsubscribing everything leaves an empty trie: every branch pruned.
    for index, topic_filter in list(state):
        assert router.unsubscribe(people[index], topic_filter)
    assert router.subscription_count == 0
    assert router._root.children == {}  # the trie itself: nothing else shows pruning


@settings(max_examples=200, deadline=None)
@given(
    shares=st.lists(st.tuples(st.sampled_from("gh"), filters, st.integers(0, 2)), max_size=10),
    plain=st.lists(filters, max_size=4),
    probes=st.lists(topics, min_size=1, max_size=5),
)
def test_match_shared_agrees_with_brute_force(shares, plain, probes):
    router = SubscriptionTrie()
    people = [FakeSubscriber(f"s{i}") for i in range(3)]
    for name, topic_filter, index in shares:
        router.subscribe(people[index], f"$share/{name}/{topic_filter}", SubOptions(1))
    for topic_filter in plain:
        router.subscribe(people[0], topic_filter, SubOptions(0))
    for topic in probes:
        found = sorted((g.name, g.filter) for g in router.match_shared(topic))
        expected = sorted({(name, f) for name, f, _ in shares if topic_matches(f, topic)})
        assert found == expected
        # Group members are not ordinary subscribers of the filter.
        assert all(r.subscriber is people[0] for r in router.match(topic))


def test_wildcards():
    router = SubscriptionTrie()
    s = {name: FakeSubscriber(name) for name in ("plus", "hash", "exact", "parent")}
    router.subscribe(s["plus"], "a/+/c", SubOptions(0))
    router.subscribe(s["hash"], "a/#", SubOptions(0))
    router.subscribe(s["exact"], "a/b/c", SubOptions(0))
    router.subscribe(s["parent"], "a/b/#", SubOptions(0))

    def who(topic: str) -> set[str]:
        return {r.subscriber.client_id for r in router.match(topic)}

    assert who("a/b/c") == {"plus", "hash", "exact", "parent"}
    assert who("a/x/c") == {"plus", "hash"}
    assert who("a/b") == {"hash", "parent"}  # '#' matches its parent level [MQTT-4.7.1-2]
    assert who("a") == {"hash"}
    assert who("a/b/c/d") == {"hash", "parent"}
    assert who("b") == set()


def test_dollar_topics_are_not_matched_by_leading_wildcards():
    # [MQTT-4.7.2-1]
    router = SubscriptionTrie()
    s = {name: FakeSubscriber(name) for name in ("hash", "plus", "sys")}
    router.subscribe(s["hash"], "#", SubOptions(0))
    router.subscribe(s["plus"], "+/broker/uptime", SubOptions(0))
    router.subscribe(s["sys"], "$SYS/#", SubOptions(0))
    assert [r.subscriber for r in router.match("$SYS/broker/uptime")] == [s["sys"]]
    assert {r.subscriber for r in router.match("x/broker/uptime")} == {s["hash"], s["plus"]}


def test_a_trees_topics_are_its_own_and_the_dollar_rule_holds_in_it():
    router = SubscriptionTrie()
    s = {name: FakeSubscriber(name) for name in ("root", "tree", "dollar")}
    router.subscribe(s["root"], "#", SubOptions(0))
    router.subscribe(s["tree"], inside("m", "#"), SubOptions(0))
    router.subscribe(s["dollar"], inside("m", "$app/#"), SubOptions(0))
    assert [r.subscriber for r in router.match(inside("m", "a/b"))] == [s["tree"]]
    assert [r.subscriber for r in router.match(inside("m", "$app/x"))] == [s["dollar"]]
    assert [r.subscriber for r in router.match("a/b")] == [s["root"]]
    assert router.match(inside("n", "a/b")) == []
    assert topic_matches(inside("m", "#"), inside("m", "a")) and not topic_matches(
        inside("m", "#"), inside("m", "$app/x")
    )
    assert not topic_matches("#", inside("m", "a")) and not topic_matches("+/a", inside("m", "a"))


def test_overlapping_subscriptions_are_one_route():
    # [MQTT-3.3.4-2/3]: one copy, at the highest QoS, with every subscription id.
    router = SubscriptionTrie()
    sub = FakeSubscriber()
    router.subscribe(sub, "a/+", SubOptions(0, subscription_id=1))
    router.subscribe(sub, "a/#", SubOptions(2, subscription_id=2))
    router.subscribe(sub, "a/b", SubOptions(1, retain_as_published=True))
    (route,) = router.match("a/b")
    assert route.subscriber is sub
    assert route.qos == 2
    assert sorted(route.subscription_ids) == [1, 2]
    assert route.retain_as_published
    assert not route.no_local


def test_no_local():
    router = SubscriptionTrie()
    sub = FakeSubscriber()
    router.subscribe(sub, "a/+", SubOptions(2, no_local=True, subscription_id=1))
    router.subscribe(sub, "a/#", SubOptions(1, subscription_id=2))
    (route,) = router.match("a/b")
    assert route.no_local
    own = route.without_no_local()  # what the publisher itself gets [MQTT-3.8.3-3]
    assert own is not None
    assert (own.qos, own.subscription_ids, own.no_local) == (1, (2,), False)
    router.unsubscribe(sub, "a/#")
    (only_no_local,) = router.match("a/b")
    assert only_no_local.without_no_local() is None


def test_the_match_cache_follows_subscribe_and_unsubscribe():
    router = SubscriptionTrie()
    sub, other = FakeSubscriber("sub"), FakeSubscriber("other")
    assert router.match("a/b") == []
    router.subscribe(sub, "a/+", SubOptions(0))
    assert [r.subscriber for r in router.match("a/b")] == [sub]
    router.subscribe(sub, "a/+", SubOptions(2))  # replaced: new options, not a new route
    assert [r.qos for r in router.match("a/b")] == [2]
    router.subscribe(other, "#", SubOptions(0))
    assert {r.subscriber for r in router.match("a/b")} == {sub, other}
    router.unsubscribe(sub, "a/+")
    assert [r.subscriber for r in router.match("a/b")] == [other]


def test_unsubscribe_of_an_unknown_filter():
    router = SubscriptionTrie()
    sub = FakeSubscriber()
    router.subscribe(sub, "a/b", SubOptions(0))
    assert router.unsubscribe(sub, "a/c") is False
    assert router.unsubscribe(sub, "a/b/c") is False
    assert router.unsubscribe(FakeSubscriber("other"), "a/b") is False
    assert router.subscription_count == 1


def test_unsubscribe_prunes_only_empty_branches():
    router = SubscriptionTrie()
    sub = FakeSubscriber()
    router.subscribe(sub, "a/b/c", SubOptions(0))
    router.subscribe(sub, "a", SubOptions(0))
    router.unsubscribe(sub, "a/b/c")
    assert list(router._root.children) == ["a"]
    assert router._root.children["a"].children == {}
    assert [r.subscriber for r in router.match("a")] == [sub]


# --------------------------------------------------------------------------- shared groups


def test_shared_subscriptions_form_groups_apart_from_match():
    router = SubscriptionTrie()
    m1, m2, m3 = FakeSubscriber("m1"), FakeSubscriber("m2"), FakeSubscriber("m3")
    router.subscribe(m1, "$share/g/a/+", SubOptions(1))
    router.subscribe(m2, "$share/g/a/+", SubOptions(2))
    router.subscribe(m3, "$share/h/a/#", SubOptions(0))
    assert router.match("a/b") == []  # ordinary fan-out never sees group members
    groups = router.match_shared("a/b")
    assert sorted((g.name, g.filter) for g in groups) == [("g", "a/+"), ("h", "a/#")]
    g = router.group("$share/g/a/+")
    assert isinstance(g, SharedGroup)
    assert g.members == {m1: SubOptions(1), m2: SubOptions(2)}
    assert router.group_count == 2
    assert router.match_shared("a/b/c") == [router.group("$share/h/a/#")]
    assert router.match_shared("$SYS/x") == []  # the '$' rule holds for groups too


def test_a_group_ends_with_its_last_member_and_its_branch_is_pruned():
    router = SubscriptionTrie()
    m1, m2 = FakeSubscriber("m1"), FakeSubscriber("m2")
    router.subscribe(m1, "$share/g/a/b", SubOptions(0))
    router.subscribe(m2, "$share/g/a/b", SubOptions(0))
    assert [g.name for g in router.match_shared("a/b")] == ["g"]  # cached now
    router.unsubscribe(m1, "$share/g/a/b")
    assert list(router.match_shared("a/b")[0].members) == [m2]
    router.unsubscribe(m2, "$share/g/a/b")
    assert router.match_shared("a/b") == []
    assert router.group("$share/g/a/b") is None
    assert router.group_count == 0
    assert router.subscription_count == 0
    assert router._root.children == {}


def group_of(*members: FakeSubscriber) -> SharedGroup:
    group = SharedGroup("g", "t")
    for member in members:
        group.add(member, SubOptions(1))
    return group


def test_round_robin_takes_members_in_turn():
    members = [FakeSubscriber(f"m{i}") for i in range(3)]
    group = group_of(*members)
    picks = [group.pick("round_robin").client_id for _ in range(7)]
    assert picks == ["m0", "m1", "m2", "m0", "m1", "m2", "m0"]


def test_round_robin_skips_offline_members_while_some_are_online():
    members = [FakeSubscriber(f"m{i}") for i in range(3)]
    members[1].online = False
    group = group_of(*members)
    picks = [group.pick("round_robin").client_id for _ in range(4)]
    assert picks == ["m0", "m2", "m0", "m2"]


def test_round_robin_with_everyone_offline_still_takes_turns():
    members = [FakeSubscriber(f"m{i}") for i in range(3)]
    for member in members:
        member.online = False
    group = group_of(*members)
    picks = [group.pick("round_robin").client_id for _ in range(6)]
    assert picks == ["m0", "m1", "m2", "m0", "m1", "m2"]


@given(online=st.lists(st.booleans(), min_size=1, max_size=5))
def test_random_picks_an_online_member_when_there_is_one(online):
    members = [FakeSubscriber(f"m{i}") for i in range(len(online))]
    for member, is_online in zip(members, online, strict=True):
        member.online = is_online
    group = group_of(*members)
    for policy in ("random", "prefer_local", "local_only"):
        for _ in range(20):
            picked = group.pick(policy)
            assert picked in members
            assert picked.online or not any(online)


def test_an_empty_group_picks_nobody():
    assert SharedGroup("g", "t").pick("round_robin") is None
    assert SharedGroup("g", "t").pick("random") is None


def test_a_member_at_its_high_water_mark_is_passed_over_while_another_has_room():
    members = [FakeSubscriber(f"m{i}") for i in range(3)]
    members[0].at_high_water = True
    group = group_of(*members)
    assert [group.pick("round_robin").client_id for _ in range(4)] == ["m1", "m2", "m1", "m2"]
    for _ in range(20):
        assert group.pick("random") is not members[0]
    assert not group.full()


def test_when_every_online_member_is_full_the_group_makes_publishers_wait():
    members = [FakeSubscriber(f"m{i}") for i in range(3)]
    members[0].online = False  # an offline member's queue does not count
    members[1].at_high_water = members[2].at_high_water = True
    group = group_of(*members)
    assert group.full()
    assert group.watched() == (members[1], members[2])  # any of them releases it
    assert group.pick("random") in (members[1], members[2])  # still online members first


def test_a_group_with_nobody_online_never_makes_publishers_wait():
    members = [FakeSubscriber(f"m{i}") for i in range(2)]
    for member in members:
        member.online = False
    assert not group_of(*members).full()
