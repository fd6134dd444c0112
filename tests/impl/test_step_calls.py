"""The engine-shaped calls (``advance``, ``advance_batch``, ``advance_columns``) against the
spec.

The machines mix the fused and batched rules into the whole differential rule set, so they
run against every per-call rule, eviction pressure, preemption and bad inputs.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import (
    BatchOutcome,
    DecodeStep,
    EngineSteps,
    HybridSpecCache,
    InvalidOperation,
    Namespace,
    OutOfBlocks,
    Request,
    SpecCache,
)

from prefixkv.conformance.machines import all_rule_names, spec_vs_impl
from prefixkv.conformance.machines.step_calls import (
    BAD_COLUMN_KINDS,
    BAD_STEP_KINDS,
    build_step_machine,
)


def _examples(fraction: float, minimum: int = 5) -> int:
    return max(minimum, int(settings().max_examples * fraction))


StepsFast = build_step_machine("SpecVsImplSteps", spec_vs_impl("fast"))
TestStepsFast = StepsFast.TestCase
TestStepsFast.settings = settings(max_examples=_examples(0.5), stateful_step_count=100)

# A weak hash and small pools: duplicates, canonical twins and eviction under every step,
# which is where a fused reservation can fail after its commit anchored blocks.
StepsWeak = build_step_machine(
    "SpecVsImplStepsWeak", spec_vs_impl("weak"), num_blocks=(4, 12), block_sizes=(1, 3)
)
TestStepsWeak = StepsWeak.TestCase
TestStepsWeak.settings = settings(max_examples=_examples(0.5), stateful_step_count=100)


def test_step_rules_fire() -> None:
    """Every rule fires (the step rules included), and the fused calls mostly succeed."""
    machine = build_step_machine("SpecVsImplStepsCoverage", spec_vs_impl("fast"))
    machine.coverage.reset()
    start = time.perf_counter()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=120, stateful_step_count=50, derandomize=True, database=None
        ),
    )
    report = machine.coverage.report()
    print(f"\n{report.format()}\nwall {time.perf_counter() - start:.1f} s")
    assert not report.never_fired(all_rule_names(machine)), report.format()
    for op in ("advance", "advance_batch", "advance_columns"):
        assert report.ops.get(op, 0) > report.op_errors.get(op, 0), f"{op} never succeeded"


def test_every_bad_step_kind() -> None:
    """A scripted run drives every malformed fused and batched call through both caches."""
    machine = build_step_machine("SpecVsImplStepsScripted", spec_vs_impl("fast"))
    state: Any = machine()
    state.init(num_blocks=8, block_size=2, record_events=True)
    seq = state.engine_step(
        ns=0, tokens=(1, 2, 3, 4, 5), budget=None, steps=[(2, 1)], sampled=(3,), finish=False
    )
    for kind in sorted(BAD_STEP_KINDS):
        for n in (0, 2):
            state._since_bad = 3
            state.bad_step_call(kind=kind, seq=seq, n=n)
    state.batched_step(plan=[(1, 1)], sampled=(2,), fail_at=0)
    for kind in sorted(BAD_COLUMN_KINDS):
        state._since_bad = 3
        state.bad_columns_call(kind=kind, seq=seq)
    for form in ("lists", "tuples", "int_counts", "arrays"):
        state.columnar_step(plan=[(1, 1)], sampled=(2,), fail_at=0, form=form)
        state.columnar_step(plan=[(0, 0)], sampled=(2,), fail_at=None, form=form)
    state.teardown()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_advance_is_the_three_calls(cls: type[Any]) -> None:
    """Speculative decoding: reserve k+1, commit the accepted ones, roll back the rest."""
    fused, percall = cls(16, 4), cls(16, 4)
    ns = Namespace("m")
    for c in (fused, percall):
        adm = c.admit(Request("s", list(range(10)), ns))
        c.commit("s", adm.num_scheduled_tokens, [42])
        c.append("s", 3)  # the pending token and two drafts
    # Both drafts rejected: the pending token's KV is written, one bonus token sampled.
    new = fused.advance("s", 1, [7], num_rejected=2, num_reserve=3)
    percall.commit("s", 1, [7])
    percall.rollback("s", 2)
    assert new == percall.append("s", 3) == [4]
    assert fused.snapshot() == percall.snapshot()
    assert isinstance(fused, EngineSteps)


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_failed_reservation_undoes_the_commit(cls: type[Any]) -> None:
    """OutOfBlocks in the reservation: the commit that would publish a block is undone."""
    cache = cls(4, 2, record_events=True)
    ns = Namespace("m")
    cache.admit(Request("s", [1, 2, 3], ns))
    before = cache.snapshot()
    with pytest.raises(OutOfBlocks):
        cache.advance("s", 3, [9], num_reserve=8)
    assert cache.snapshot() == before
    out = cache.advance_batch([DecodeStep("s", 3, (9,)), DecodeStep("t", 0)])
    assert isinstance(out, BatchOutcome) and out.num_applied == 1 and not out.ok
    assert out.failed_seq_id == "t" and out.error is not None
    with pytest.raises(type(out.error)):
        out.raise_for_error()
    bad = cache.advance_batch([DecodeStep("s", 99)])
    assert isinstance(bad.error, InvalidOperation) and bad.num_applied == 0


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridPrefixCacheManager])
def test_hybrid_advance(cls: type[Any]) -> None:
    """The hybrid managers keep their checkpoint bookkeeping through ``advance``."""
    fused = cls(16, 2, max_num_seqs=2, state_budget=2, decode_state_interval=2)
    percall = cls(16, 2, max_num_seqs=2, state_budget=2, decode_state_interval=2)
    ns = Namespace("m")
    for c in (fused, percall):
        adm = c.admit(Request("s", [1, 2, 3, 4, 5], ns))
        c.commit("s", adm.num_scheduled_tokens, [6])
        c.append("s", 1)
    for tok in (7, 8, 9, 10, 11):
        fused.advance("s", 1, [tok])
        percall.commit("s", 1, [tok])
        percall.append("s", 1)
    assert fused.snapshot() == percall.snapshot()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_publication_that_anchors_a_twin_fails_the_reservation(cls: type[Any]) -> None:
    """The commit publishes under a canonical twin, anchoring the only evictable blocks;
    the reservation then has no supply left, so the whole ``advance`` must be undone."""
    cache = cls(7, 2, record_events=True)
    ns = Namespace("m")
    prompt = [1, 2, 3, 4, 5]
    cache.admit(Request("a", prompt, ns))
    cache.admit(Request("b", prompt, ns))  # before "a" publishes: private blocks
    cache.commit("a", 5, [8])
    cache.free(["a"])  # its two full blocks: cached, evictable; its tail: free
    cache.commit("b", 5, [9])  # twins of "a"'s blocks: they stay private
    cache.append("b", 1)
    cache.admit(Request("c", [7, 7, 7], ns))  # takes the free blocks
    assert cache.stats().num_free_blocks == 0
    before = cache.snapshot()
    with pytest.raises(OutOfBlocks):
        cache.advance("b", 1, [10], num_reserve=1)
    assert cache.snapshot() == before
    cache.commit("b", 1, [10])  # per call, the commit alone succeeds...
    assert not cache.can_append("b", 1)  # ...and anchored the twins


def test_saved_state_restores_the_index() -> None:
    """The saved state of a failed ``advance`` restores an index that looks up its own
    buckets (a copied index once kept looking up the original ones)."""
    import copy

    from prefixkv.impl._index import HashIndex

    index = HashIndex()
    index.insert(5, 1)
    index.insert(5, 2)
    saved = copy.deepcopy(index)
    index.remove(5, 1)
    index.insert(7, 3)
    assert saved.get_one(5) == [1, 2]
    assert saved.get_one(7) is None
    assert index.get_one(5) == 2


def test_hybrid_advance_copies_no_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hybrid manager's advance checks every part up front, then runs its commit,
    rollback and append in turn: a decode step, a speculative one and a batched one copy
    no state (a saved copy costs time in proportion to the pool, per step)."""
    import copy

    cache = HybridPrefixCacheManager(64, 4, max_num_seqs=2, state_budget=2)
    adm = cache.admit(Request("s", list(range(10)), Namespace("m")))

    def no_copy(*args: object, **kwargs: object) -> None:
        raise AssertionError("advance copied the whole state")

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    assert cache.advance("s", adm.num_scheduled_tokens, [42], num_reserve=3) == [3]
    cache.advance("s", 1, [7], num_rejected=2, num_reserve=3)
    assert cache.advance_batch([DecodeStep("s", 1, [8], 0, 1)]).ok
    assert cache.num_computed_tokens("s") == 12


def _two_decoding(cls: type[Any], **kwargs: Any) -> Any:
    """A cache with sequences "a" and "b" past their prompts, one slot reserved each."""
    cache = cls(32, 4, **kwargs)
    ns = Namespace("m")
    for sid, prompt in (("a", list(range(10))), ("b", list(range(20, 27)))):
        adm = cache.admit(Request(sid, prompt, ns))
        cache.advance(sid, adm.num_scheduled_tokens, [42], num_reserve=1)
    return cache


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager, HybridPrefixCacheManager])
def test_columns_are_the_batch(cls: type[Any]) -> None:
    """``advance_columns`` gives what ``advance_batch`` of the same steps gives, whatever
    the columns' form (lists, tuples, arrays, an int for every step's counts)."""
    kwargs = {"max_num_seqs": 2, "state_budget": 2} if cls is HybridPrefixCacheManager else {}
    forms: list[tuple[Any, ...]] = [
        (["a", "b"], [1, 1], [[5], [6]], 0, 1),
        (("a", "b"), (1, 1), ((5,), (6,)), (0, 0), (1, 1)),
        (["a", "b"], array("q", [1, 1]), [(5,), (6,)], array("q", [0, 0]), array("q", [1, 1])),
    ]
    for cols in forms:
        by_steps = _two_decoding(cls, **kwargs)
        by_cols = _two_decoding(cls, **kwargs)
        steps = [DecodeStep("a", 1, [5], 0, 1), DecodeStep("b", 1, [6], 0, 1)]
        out = by_steps.advance_batch(steps)
        assert by_cols.advance_columns(*cols) == out and out.ok
        assert by_cols.snapshot() == by_steps.snapshot()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_columns_bad_step_changes_nothing(cls: type[Any]) -> None:
    """A bad step of a columnar batch: the steps before it apply, it changes nothing, the
    outcome names it, and the steps after it are not attempted."""
    cache, before = _two_decoding(cls), _two_decoding(cls)
    before.advance("a", 1, [5], num_reserve=1)  # what the one good step does
    # b commits 3 tokens with one slot reserved: InvalidOperation, b untouched.
    out = cache.advance_columns(["a", "b", "c"], [1, 3, 1], [[5], [6, 7, 8], [9]], 0, 1)
    assert out.num_applied == 1 and out.failed_seq_id == "b"
    assert isinstance(out.error, InvalidOperation)
    assert cache.snapshot() == before.snapshot()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
@pytest.mark.parametrize(
    "cols",
    [
        ("ab", [1, 1], [[5], [6]]),  # ids as a string
        (["a", "b"], [1], [[5], [6]]),  # ragged
        (["a", "b"], [1, 1], [[5], [6]], 0, [1]),  # a ragged count column
        (["a", "b"], [1, 1], [[5], [6]], 0, True),  # a bool for every step
        (["a", "b"], 1, [[5], [6]]),  # a count where a column goes
        (["a", "a"], [1, 1], [[5], [6]]),  # a sequence twice
        (["a", True], [1, 1], [[5], [6]]),  # a bad id after a good step
        ([True], [1], [[5]]),  # a bad id, alone
    ],
)
def test_malformed_columns_apply_nothing(cls: type[Any], cols: tuple[Any, ...]) -> None:
    """Malformed columns raise the definition's typed error before any step applies."""
    from prefixkv.spec import PrefixCacheError
    from prefixkv.spec.steps import check_columns

    cache, before = _two_decoding(cls), _two_decoding(cls)
    with pytest.raises(PrefixCacheError) as caught:
        cache.advance_columns(*cols)
    with pytest.raises(type(caught.value)):
        check_columns(*cols)
    assert cache.snapshot() == before.snapshot()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager, HybridPrefixCacheManager])
def test_one_step_columns_are_the_batch(cls: type[Any]) -> None:
    """A one-step batch of columns (the impl's shortcut): the same outcomes as
    ``advance_batch``, through steps that allocate a block and one that fails."""
    kwargs = {"max_num_seqs": 2, "state_budget": 2} if cls is HybridPrefixCacheManager else {}
    by_steps, by_cols = _two_decoding(cls, **kwargs), _two_decoding(cls, **kwargs)
    allocated = 0
    for tok in range(8):
        out = by_steps.advance_batch([DecodeStep("a", 1, [tok], 0, 1)])
        assert by_cols.advance_columns(("a",), (1,), ((tok,),), 0, 1) == out and out.ok
        allocated += len(out.new_blocks[0])
    bad = by_steps.advance_batch([DecodeStep("a", 2, [1, 2], 0, 1)])
    failed = by_cols.advance_columns(["a"], [2], [[1, 2]], 0, 1)
    assert failed.new_blocks == bad.new_blocks == () and failed.failed_seq_id == "a"
    assert type(failed.error) is type(bad.error) and str(failed.error) == str(bad.error)
    assert allocated and bad.failed_seq_id == "a" and not bad.ok
    assert by_cols.snapshot() == by_steps.snapshot()
