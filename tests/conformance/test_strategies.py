"""The machines' workload strategies: a run of tokens drawn as one integer covers every run,
shortest first, and shrinks like the list it replaces."""

from __future__ import annotations

from collections import Counter

from hypothesis import find, settings

from prefixkv.conformance.machines.strategies import budgets, prompts, run_at, runs_of

_FIND = settings(database=None, max_examples=2_000, derandomize=True)


def test_run_at_covers_every_run_each_length_an_equal_share() -> None:
    alphabet, max_size = (1, 2, 3), 3
    width = len(alphabet) ** max_size
    runs = [run_at(alphabet, max_size, i, min_size=1) for i in range(max_size * width)]
    every = {r for r in runs}
    assert len(every) == sum(len(alphabet) ** n for n in range(1, max_size + 1))
    assert Counter(len(r) for r in runs) == dict.fromkeys(range(1, max_size + 1), width)
    assert runs[0] == (1,) and run_at(alphabet, max_size, 0) == ()
    # within a length, the first indices list its runs in order, as a list shrinks
    assert runs[width : width + 9] == sorted(r for r in every if len(r) == 2)


def test_runs_shrink_towards_short_runs_of_the_first_element() -> None:
    """A run shrinks to the fewest elements a failure needs, each the first it can be.

    (Unlike a list, it cannot drop an element from its middle: ``run_at`` keeps the last
    elements of a shorter run.)"""
    assert find(runs_of((1, 2, 3, 4), 4), lambda r: len(r) >= 2, settings=_FIND) == (1, 1)
    assert find(runs_of((1, 2, 3, 4), 4, min_size=1), lambda r: True, settings=_FIND) == (1,)
    assert find(runs_of((1, 2, 3, 4), 4), lambda r: r[-1:] == (3,), settings=_FIND) == (3,)


def test_prompts_and_budgets_shrink_as_before() -> None:
    """The whole prompt is scheduled (budget ``None``); a prompt is a cut of the first shared
    prefix, else the first token."""
    assert find(budgets(), lambda b: True, settings=_FIND) is None
    assert find(prompts(), lambda p: True, settings=_FIND) == (1,)
    assert find(prompts(), lambda p: len(p) >= 3, settings=_FIND) == (7, 7, 7)  # a cut of P0
