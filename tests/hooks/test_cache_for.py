"""How long a chain's answer holds (hooks/decisions.py): the shortest promise of the
plugins it asked, and none once one of them made none."""

from __future__ import annotations

import asyncio

import pytest

from hooks import FOREVER, NEXT, Error, Hooks, Next, Ok, PublishContext, Result

CONTEXT = PublishContext(client_id="c", topic="a/b", payload=b"x", qos=1)


class Says:
    def __init__(self, result: object) -> None:
        self.result = result

    def auth_on_publish(self, ctx: PublishContext) -> object:
        return self.result


class SaysLater(Says):
    async def auth_on_publish(self, ctx: PublishContext) -> object:  # type: ignore[override]
        return self.result


def answer(*results: object, awaited: bool = False) -> Result:
    kind = SaysLater if awaited else Says
    chain = Hooks([(f"p{i}", kind(r)) for i, r in enumerate(results)]).chain("auth_on_publish")
    return asyncio.run(chain.run(CONTEXT)) if awaited else chain.run_sync(CONTEXT)


@pytest.mark.parametrize("awaited", [False, True])
def test_the_chain_holds_for_the_shortest_promise(awaited):
    assert answer(Ok(cache_for=5), awaited=awaited).cache_for == 5
    assert answer(Next(cache_for=30), Ok(cache_for=FOREVER), awaited=awaited).cache_for == 30
    assert answer(Next(cache_for=FOREVER), Error(cache_for=2), awaited=awaited) == Error(
        cache_for=2
    )
    exhausted = answer(Next(cache_for=7), Next(cache_for=9), awaited=awaited)
    assert (exhausted.reason, exhausted.cache_for) == ("plugin_chain_exhausted", 7)


@pytest.mark.parametrize("awaited", [False, True])
def test_one_plugin_that_promises_nothing_makes_the_chain_promise_nothing(awaited):
    assert answer(NEXT, Ok(cache_for=FOREVER), awaited=awaited) == Ok()
    assert answer(None, Ok(cache_for=FOREVER), awaited=awaited) == Ok()
    assert answer(Next(cache_for=5), Ok(), awaited=awaited) == Ok()
    assert answer(Next(cache_for=5), NEXT, awaited=awaited).cache_for is None


def test_an_answer_not_taken_as_given_promises_nothing():
    assert answer(Ok({"no_such_modifier": 1}, cache_for=FOREVER)) == Error("invalid_modifiers")
    assert answer("yes").cache_for is None  # an invalid result
    assert Hooks([]).chain("auth_on_publish").run_sync(CONTEXT).cache_for is None
