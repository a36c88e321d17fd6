"""Who starts the cluster and whom each node joins (broker/cluster/swc/bootstrap.py), on
its own: the decision every node makes from what its seeds answered. Run on every node
of a set started from one seed list, it must name one node to start and the same one for
the others to join; a node holding history keeps it and is the one joined."""

from __future__ import annotations

from broker.cluster.swc.bootstrap import Action, Decision, SeedAnswer, Standing, decide


def fresh(node: str, holds: bool = False) -> SeedAnswer:
    return SeedAnswer(f"{node}:1", node, holds, fresh=True)


def member(node: str) -> SeedAnswer:
    return SeedAnswer(f"{node}:1", node, holds=True, fresh=False)


def joining(node: str) -> SeedAnswer:
    return SeedAnswer(f"{node}:1", node, holds=False, fresh=False)


def fresh_node(
    node: str, answers: list[SeedAnswer], silent: tuple[str, ...] = (), holds: bool = False
) -> Decision:
    """The decision of a fresh node (nothing but its own record)."""
    return decide(node, Standing.FRESH, holds, {node}, answers, list(silent), patient=False)


def test_fresh_nodes_that_meet_let_the_lowest_name_start_and_wait_for_it() -> None:
    assert fresh_node("a", [fresh("b"), fresh("c")]).action is Action.START
    for node, others in (("b", ["a", "c"]), ("c", ["a", "b"])):
        decision = fresh_node(node, [fresh(other) for other in others])
        assert decision.action is Action.WAIT
        assert decision.waiting == (
            "waiting for a to start the cluster (the lowest name of the fresh nodes a, b, c)"
        )


def test_once_the_lowest_has_started_the_others_join_it() -> None:
    decision = fresh_node("c", [fresh("a", holds=True), fresh("b")])
    assert decision.action is Action.JOIN and decision.answer == fresh("a", holds=True)


def test_the_lowest_waits_a_while_for_silent_seeds_then_starts_with_those_that_answer() -> None:
    decision = fresh_node("b", [fresh("c")], ("a:1",))
    assert decision.action is Action.WAIT and "a:1 to answer" in decision.waiting
    late = decide("b", Standing.FRESH, False, {"b"}, [fresh("c")], ["a:1"], patient=True)
    assert late.action is Action.START


def test_a_node_that_comes_later_joins_the_one_started_without_it_even_if_lower() -> None:
    decision = fresh_node("a", [fresh("b", holds=True), fresh("c")])
    assert decision.action is Action.JOIN and decision.answer == fresh("b", holds=True)


def test_of_two_fresh_nodes_that_started_alone_the_higher_gives_way() -> None:
    decision = fresh_node("b", [fresh("a", holds=True)], holds=True)
    assert decision.action is Action.JOIN and decision.answer == fresh("a", holds=True)
    assert fresh_node("a", [fresh("b", holds=True)], holds=True).action is Action.WAIT


def test_a_fresh_node_no_seed_answers_waits_and_says_for_whom() -> None:
    decision = fresh_node("a", [], ("b:44054", "c:44055"))
    assert decision.action is Action.WAIT
    assert decision.waiting == "waiting for seeds b:44054, c:44055 (none answered yet)"


def test_a_seed_list_naming_only_this_node_starts_a_cluster_of_one() -> None:
    assert fresh_node("a", []).action is Action.START


def test_a_node_holding_history_is_joined_even_by_a_lower_fresh_node() -> None:
    decision = fresh_node("a", [fresh("b"), member("c")])
    assert decision.action is Action.JOIN and decision.answer == member("c")
    # ... and by one that started a cluster alone and holds nothing in it yet.
    started = fresh_node("a", [member("c")], holds=True)
    assert started.action is Action.JOIN and started.answer == member("c")


def test_a_member_waits_for_fresh_seeds_to_join_it_rather_than_start_anew() -> None:
    answers = [fresh("a"), fresh("b", holds=True)]
    decision = decide("c", Standing.MEMBER, True, {"c", "d"}, answers, [])
    assert decision.action is Action.WAIT


def test_a_member_rejoins_its_own_cluster_and_refuses_another() -> None:
    ours = decide("c", Standing.MEMBER, True, {"a", "c"}, [member("a"), member("b")], [])
    assert ours.action is Action.JOIN and ours.answer == member("a")
    other = decide("z", Standing.MEMBER, True, {"z"}, [member("b"), member("a")], [])
    assert other.action is Action.REFUSE and other.answer == member("a")


def test_a_node_introduced_but_holding_nothing_joins_a_holder_and_never_starts() -> None:
    known = {"a", "x"}
    decision = decide("a", Standing.JOINING, False, known, [fresh("b", holds=True)], [])
    assert decision.action is Action.JOIN
    waiting = decide("a", Standing.JOINING, False, known, [fresh("b")], ["x:1"])
    assert waiting.action is Action.WAIT
    assert "b answered; x:1 did not answer" in waiting.waiting


def test_every_node_of_a_set_agrees_on_one_cluster_whatever_the_order() -> None:
    """Rounds of the decision over nodes started together, each round's nodes in
    another order: they end in one cluster, started by the lowest name."""
    names = ["n3", "n1", "n4", "n2"]
    for shift in range(len(names)):
        order = names[shift:] + names[:shift]
        holds = dict.fromkeys(names, False)
        joined: dict[str, str] = {}
        for _ in range(3):
            for node in order:
                if node in joined or node in joined.values():  # linked to a member: done
                    continue
                answers = [fresh(o, holds[o]) for o in names if o != node and o not in joined]
                answers += [member(o) for o in joined]
                decision = fresh_node(node, answers, holds=holds[node])
                if decision.action is Action.START:
                    holds[node] = True
                elif decision.action is Action.JOIN and decision.answer is not None:
                    joined[node] = decision.answer.node
        assert [node for node in names if holds[node]] == ["n1"], order
        assert set(joined) == {"n2", "n3", "n4"}, joined
