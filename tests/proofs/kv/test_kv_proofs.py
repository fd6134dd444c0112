"""The Z3 proof layer: obligations proved, not vacuous, able to fail, and in step with the spec.

Runs the default proof run (one test per operation), the non-vacuity witnesses, every
deliberately broken variant (each must yield a counterexample), the kernel index proofs,
and the model-vs-spec drift check with at least 10,000 checks, plus seeded drifts that the
drift check must catch.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import pytest

pytest.importorskip("z3")

import z3
from prefixkv.proofs import kernel_index
from prefixkv.proofs.kv import broken, drift, obligations
from prefixkv.proofs.kv import seeded as kv_seeded
from prefixkv.proofs.kv.concrete import AbsState, Labels, abstract, bind, concretize
from prefixkv.proofs.kv.model import TXN_ERRORS, Bounds
from prefixkv.proofs.kv.transitions import Encoding
from prefixkv.spec import Namespace, Request, SpecCache
from prefixkv.spec import cache as spec_cache

DRIFT_CHECKS = 10_000


@pytest.fixture(scope="module")
def prover() -> obligations.Prover:
    return obligations.Prover(Encoding(Bounds()))


# -- the default proof run -----------------------------------------------------------------


@pytest.mark.parametrize("operation", list(obligations.OPERATIONS))
def test_every_invariant_is_inductive_over(
    operation: str, prover: obligations.Prover, unproved: Callable[[Iterable[Any]], str]
) -> None:
    rows = prover.rows(operations=[operation])
    expected = set(obligations.INVARIANT_IDS) | {"INV-MATCH"}
    expected |= {"INV-TXN"} if operation in TXN_ERRORS else set()
    assert {r.invariant for r in rows} == expected
    assert unproved(rows) == ""
    # deterministic budget: far below the fixed rlimit, so "proved" is not a matter of luck
    assert max(r.rlimit_used for r in rows) < obligations.DEFAULT_RLIMIT // 2


def test_every_operation_is_non_vacuous(prover: obligations.Prover) -> None:
    witnesses = prover.witnesses()
    assert set(witnesses) == set(obligations.OPERATIONS)
    bad = {op: (w.scenario, w.status, w.state) for op, w in witnesses.items() if w.status != "sat"}
    assert not bad
    # the free witness really releases one block through two tables
    assert "free(freed=[True, True" in witnesses["free"].state
    # the admit witness opens a recompute window (INV-WINDOW's block conjunct is exercised)
    assert re.search(r"recompute_blocks=[1-9]", witnesses["admit"].state)
    assert re.search(r"window [1-9]", witnesses["admit"].state)


def test_admit_and_append_are_literally_their_proof_steps() -> None:
    """The compositional proof of admit/append is sound only if the transitions are built
    from the proved steps; a broken step must break the composite operation too."""
    enc = broken.FreeOncePerBlock(Bounds())  # unrelated step: composites stay proved
    prover = obligations.Prover(enc)
    assert all(r.status == "proved" for r in prover.rows(["INV-REF"], ["admit"]))
    bad = obligations.Prover(broken.AllocateOneMore(Bounds()))
    assert {r.operation: r.status for r in bad.rows(["INV-REF"], ["admit", "append"])} == {
        "admit": "counterexample",
        "append": "counterexample",
    }


# -- broken variants -----------------------------------------------------------------------


def test_at_least_three_broken_variants_per_invariant() -> None:
    per_invariant = Counter(v.invariant for v in broken.VARIANTS)
    for inv in obligations.INVARIANT_IDS:
        if inv.startswith("INV-"):
            assert per_invariant[inv] >= 3, inv
    assert {v.kind for v in broken.VARIANTS} == {"transition", "off-by-one", "dropped conjunct"}


@pytest.mark.parametrize("variant", broken.VARIANTS, ids=lambda v: v.name)
def test_broken_variant_yields_a_counterexample(variant: broken.Variant) -> None:
    result = broken.check_variant(variant)
    cex = result.counterexample
    assert cex is not None, f"{variant.name} was not refuted"
    text = str(cex)
    assert text.startswith(f"{variant.invariant} broken by {variant.step}")
    assert "-- pre-state --" in text and "-- post-state --" in text and "pool:" in text


def test_the_unbroken_encoding_has_no_such_counterexample() -> None:
    for v in broken.VARIANTS[:6]:
        assert (
            obligations.find_counterexample(Encoding(Bounds()), v.invariant, v.step, max_pool=3)
            is None
        )


LOOKUP_AND_TXN_VARIANTS = [
    v
    for v in broken.VARIANTS
    if v.invariant == "INV-TXN" or (v.invariant == "INV-MATCH" and v.step != "attach")
]


@pytest.mark.parametrize("variant", LOOKUP_AND_TXN_VARIANTS, ids=lambda v: v.name)
def test_lookup_and_txn_variants_need_their_bug(variant: broken.Variant) -> None:
    """The counterexample comes from the variant's bug, not from the obligation."""
    assert (
        obligations.find_counterexample(
            Encoding(Bounds()), variant.invariant, variant.step, max_pool=3
        )
        is None
    )


def test_txn_rows_cover_every_error_class_with_a_witness(prover: obligations.Prover) -> None:
    rows = {r.operation: r for r in prover.rows([obligations.TXN])}
    assert set(rows) == set(TXN_ERRORS)  # evict and reset_keep refuse nothing in the model
    for op, r in rows.items():
        assert r.steps == TXN_ERRORS[op] and r.kind == "txn"
        assert r.status == "proved" and r.non_vacuous, (op, r.detail)
    # each failing precondition holds in a state satisfying every invariant: OutOfBlocks too
    w = prover.txn_witnesses("admit")["OutOfBlocks"]
    assert w.status == "sat" and "admit(" in w.state


def test_lookup_rows_prove_admissions_own_match_too(prover: obligations.Prover) -> None:
    """INV-MATCH over attach also proves the admission's own match (the postcondition): the
    old attach-only variants are refuted through it."""
    rows = {r.operation: r for r in prover.rows([obligations.MATCH])}
    assert set(rows) == set(obligations.OPERATIONS)
    assert rows["admit"].steps == ("attach", "evict", "grow")
    assert all(r.kind == "lookup" and r.status == "proved" for r in rows.values())


def test_lookup_hits_and_clamps_in_some_valid_state(prover: obligations.Prover) -> None:
    w = prover.lookup_witness()
    assert w.status == "sat", w
    assert "span_start=" in w.state


def test_invariants_alone_are_not_all_inductive() -> None:
    """The strengthening is needed: some invariants fail alone, and each failure comes with
    a printed counterexample. INV-STATS is inductive alone; INV-LIMIT's chunk form needs
    AUX-CHUNK over rollback, and INV-WINDOW needs the others (INV-WRITE, INV-REF)."""
    alone = obligations.inductive_alone(Encoding(Bounds()), max_pool=2)
    assert not alone["INV-STATS"]
    assert {s for s, _ in alone["INV-LIMIT"]} == {"rollback"}
    assert {s for s, _ in alone["INV-PUBLISH"]} >= {"commit"}
    assert alone["INV-WINDOW"]
    assert all("-- pre-state --" in str(c) for items in alone.values() for _, c in items)


# -- kernels -------------------------------------------------------------------------------


def test_kernel_index_arithmetic_is_proved() -> None:
    results = kernel_index.prove_kernels()
    bad = [r for r in results if r.status != "proved" or not r.non_vacuous]
    assert not bad, bad
    functions = {r.function for r in results}
    assert {"slot_for_position", "page_table_entry", "conv_state_source"} <= functions


@pytest.mark.parametrize("variant", kernel_index.KERNEL_VARIANTS, ids=lambda v: v.name)
def test_broken_kernel_arithmetic_is_refuted(variant: kernel_index.KernelVariant) -> None:
    result = kernel_index.check_kernel_variant(variant)
    assert result.status == "counterexample", result


def test_kernel_proofs_read_the_launchers_functions() -> None:
    """The proofs call index_math at proof time (patching it changes the verdict, see the
    broken kernel variants) and the int64 decision matches the proved bound."""
    from prefixkv.kernels import index_math as im

    shape = (2**14, 16, 8, 128)
    strides = (16 * 8 * 128, 8 * 128, 128, 1)
    assert im.max_element_offset(shape, strides) == sum(
        (n - 1) * s for n, s in zip(shape, strides, strict=True)
    )
    assert im.offsets_fit_int32((shape, strides))
    # 2**17 pages of 16 x 8 x 128: the largest offset is 2**31 - 1, one past what int32
    # offset math may form (the masked lane one past it), so the launcher must pick int64
    big = (2**17, 16, 8, 128)
    assert not im.offsets_fit_int32((big, strides))


# -- drift between the model and the spec ---------------------------------------------------


def test_no_drift_on_ten_thousand_checks() -> None:
    report = drift.default_run(checks=DRIFT_CHECKS, seed=0)
    assert report.checks >= DRIFT_CHECKS
    assert report.successes > DRIFT_CHECKS // 2 and report.failures > DRIFT_CHECKS // 20
    assert report.invariant_checks > 500
    assert report.windows >= 100  # admissions that open a recompute window
    assert report.window_states >= 500  # checks from a state with a window block to write
    for op in (
        "admit",
        "append",
        "continue_prefill",
        "commit",
        "rollback",
        "free",
        "evict",
        "reset_keep",
        "reset_full",
    ):
        assert report.by_op.get(op, 0) >= 200, (op, report.by_op)
    # every rejection matched the model's failing precondition of the spec's error class
    assert set(report.by_error) >= {
        "admit: DuplicateSequence",
        "admit: OutOfBlocks",
        "append: InvalidOperation",
        "append: OutOfBlocks",
        "commit: InvalidOperation",
        "continue_prefill: InvalidOperation",
        "continue_prefill: OutOfBlocks",
        "free: UnknownSequence",
        "reset_full: CacheBusy",
        "rollback: InvalidOperation",
    }, report.by_error


@pytest.mark.parametrize("seeded", kv_seeded.SEEDED_DRIFTS, ids=lambda s: s[0])
def test_seeded_drift_is_caught(seeded: tuple[str, str, type[Encoding]]) -> None:
    name, description, enc_type = seeded
    result = kv_seeded.check_seeded(name, description, enc_type, budget=3_000)
    assert result.caught, f"seeded drift {name} ({description}) not caught"


@pytest.fixture
def spec_without_lru_stamp() -> Iterator[None]:
    """A drift on the spec side: released published blocks keep their old age."""
    original = spec_cache.SpecCache._release

    def release(self: Any, seq: Any, blocks: Any) -> None:
        clock, self._s.clock = self._s.clock, 0
        try:
            original(self, seq, blocks)
        finally:
            self._s.clock = clock

    spec_cache.SpecCache._release = release  # type: ignore[method-assign]
    try:
        yield
    finally:
        spec_cache.SpecCache._release = original  # type: ignore[method-assign]


def test_a_drifted_spec_is_caught_too(spec_without_lru_stamp: None) -> None:
    with pytest.raises(drift.DriftError):
        drift.run_reachable(Encoding(Bounds()), 3_000, seed=1)


@pytest.fixture
def spec_without_window() -> Iterator[None]:
    """A drift in the spec's window logic: the match ignores ``recompute_blocks``."""
    original = spec_cache.SpecCache.match

    def match(self: Any, req: Any) -> Any:
        if isinstance(req, Request) and req.recompute_blocks:
            req = attrs.evolve(req, recompute_blocks=0)
        return original(self, req)

    spec_cache.SpecCache.match = match  # type: ignore[method-assign]
    try:
        yield
    finally:
        spec_cache.SpecCache.match = original  # type: ignore[method-assign]


def test_a_drifted_spec_window_is_caught(spec_without_window: None) -> None:
    with pytest.raises(drift.DriftError, match="admit"):
        drift.run_reachable(Encoding(Bounds()), 3_000, seed=1)


def test_window_is_carried_through_the_bridge() -> None:
    """num_cached and window_blocks go spec -> model -> spec unchanged, and a window block
    still to be written satisfies INV-WINDOW on both sides."""
    cache = SpecCache(6, 2)
    ns = Namespace("model-a")
    cache.admit(Request("a", [0, 1, 0, 1, 1], ns))
    cache.commit("a", 5, [3])
    adm = cache.admit(Request("b", [0, 1, 0, 1, 2], ns, recompute_blocks=1))
    assert (adm.num_cached_tokens, adm.num_window_blocks) == (2, 1)
    labels = Labels()
    state = abstract(cache, ["a", "b", None], labels, 3)
    sq = state.seqs[1]
    assert sq is not None and (sq.nca, sq.win, sq.nc) == (2, 1, 2)
    again, slots = concretize(state, labels)
    seq = again._s.seqs["seq1"]
    assert (seq.num_cached, seq.window_blocks) == (2, 1)
    assert abstract(again, slots, labels, 3).canonical(3) == state.canonical(3)
    enc = Encoding(Bounds())
    checker = drift.DriftChecker(enc, 6)
    assert checker.invariants_hold(state)

    def inv_window(a: AbsState) -> bool:
        pairs = bind(checker.pre, a, 3)
        return z3.is_true(
            z3.simplify(z3.substitute(enc.inv_window(checker.d, checker.pre), *pairs))
        )

    assert inv_window(state)
    # the window block (#1 of b) is still to be written: sharing it breaks INV-WINDOW
    window_block = sq.table[1]
    shared = dataclasses.replace(
        state, rc=[r + (b == window_block) for b, r in enumerate(state.rc)]
    )
    assert not inv_window(shared)
    # once it is recomputed and committed, the window no longer constrains it
    done = dataclasses.replace(
        state, seqs=[state.seqs[0], dataclasses.replace(sq, nc=4), None], rc=shared.rc
    )
    assert inv_window(done)


def test_concretize_round_trips_reachable_states() -> None:
    cache = SpecCache(4, 2)
    ns = Namespace("model-a")
    cache.admit(Request("a", [0, 1, 0, 1, 1], ns))
    cache.commit("a", 5, [3])
    cache.admit(Request("b", [0, 1, 0, 1, 2], ns))
    labels = Labels()
    state = abstract(cache, ["a", "b", None], labels, 3)
    again, slots = concretize(state, labels)
    assert slots == ["seq0", "seq1", None]
    assert abstract(again, slots, labels, 3).canonical(3) == state.canonical(3)


def test_proofs_import_no_torch_and_spec_imports_no_proofs() -> None:
    code = (
        "import sys; import prefixkv.proofs, prefixkv.proofs.kernel_index, "
        "prefixkv.proofs.kv.drift; heavy = [m for m in ('torch', 'triton') if m in sys.modules]; "
        "sys.exit(1 if heavy else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=120).returncode == 0
    code = (
        "import sys; import prefixkv.spec; "
        "sys.exit(1 if any(m.startswith('prefixkv.proofs') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=120).returncode == 0
