"""INV-CKPT in Z3: the checkpoint lifecycle is inductive, not vacuous, able to fail, and in
step with :class:`HybridSpecCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

pytest.importorskip("z3")

import z3
from prefixkv.proofs import ckpt as ck
from prefixkv.proofs.ckpt import drift as ckpt_drift
from prefixkv.proofs.ckpt import seeded as ckpt_seeded
from prefixkv.proofs.driver import DriftError
from prefixkv.spec import HybridSpecCache, Namespace, Request
from prefixkv.spec import hybrid as spec_hybrid
from prefixkv.spec.checkpoint_store import CheckpointStore, Emit

DRIFT_CHECKS = 2000


@pytest.fixture(scope="module")
def prover() -> ck.CkptProver:
    return ck.CkptProver()


@pytest.mark.parametrize("operation", ck.CKPT_OPERATIONS)
def test_inv_ckpt_is_inductive_over(
    operation: str, prover: ck.CkptProver, unproved: Callable[[Iterable[Any]], str]
) -> None:
    rows = prover.rows(ops=[operation])
    expected = {p for p in ck.CKPT_IDS if ck.applies(p, operation)}
    assert {r.invariant for r in rows} == expected
    assert unproved(rows) == ""
    assert max(r.rlimit_used for r in rows) < ck.DEFAULT_RLIMIT // 2


def test_every_checkpoint_operation_is_non_vacuous(prover: ck.CkptProver) -> None:
    witnesses = prover.witnesses()
    assert set(witnesses) == set(ck.CKPT_OPERATIONS) - {"init"}
    assert {op: w[1] for op, w in witnesses.items()} == dict.fromkeys(witnesses, "sat")
    # the admission witness restores a checkpoint while slot pressure evicts another
    assert "step: admit(q0, c=" in witnesses["admit"][2]
    assert "r=-1" not in witnesses["admit"][2]


def test_the_invariant_is_not_trivially_true() -> None:
    """A state with two checkpoints on one node, or a pinned checkpoint nobody restores, is
    excluded: the invariant is satisfiable and also falsifiable."""
    m = ck.CkptModel()
    st = m.fresh("x.")
    s = z3.Solver()
    s.add(m.inv(st), z3.Or([st.kind[i] == ck.PINNED for i in range(m.K)]))
    assert s.check() == z3.sat
    s = z3.Solver()
    s.add(m.inv(st), st.kind[0] == ck.READY, st.kind[1] == ck.READY, st.node[0] == st.node[1])
    assert s.check() == z3.unsat


@pytest.mark.parametrize("variant", ck.CKPT_VARIANTS, ids=lambda v: v.name)
def test_broken_checkpoint_variant_yields_a_counterexample(variant: ck.CkptVariant) -> None:
    r = ck.check_ckpt_variant(variant)
    assert r.caught, f"{variant.name} was not refuted"
    assert "pre-state:" in r.row.detail and f"step: {variant.step}(" in r.row.detail


def test_the_unbroken_model_proves_what_each_variant_breaks(prover: ck.CkptProver) -> None:
    for v in ck.CKPT_VARIANTS:
        assert prover.prove(v.invariant, v.step).status == "proved", v.name


def test_every_transition_property_has_a_broken_variant() -> None:
    refuted = {v.invariant for v in ck.CKPT_VARIANTS}
    assert refuted == set(ck.CKPT_IDS)


# -- drift ----------------------------------------------------------------------------------


def test_no_drift_against_the_hybrid_spec() -> None:
    report = ckpt_drift.run_ckpt_drift(DRIFT_CHECKS, seed=0)
    assert report.checks >= DRIFT_CHECKS
    assert report.successes > DRIFT_CHECKS // 2
    assert report.rejections > 50  # checkpoint-side rejections are compared too
    assert report.invariant_checks >= report.checks
    # every fate of a checkpoint occurs, and every operation is drift-checked
    assert set(report.fates) == set(ck.COUNTERS), report.fates
    assert set(report.by_op) == set(ck.CKPT_OPERATIONS) - {"init"}


@pytest.mark.parametrize("seeded", ckpt_seeded.SEEDED_CKPT_DRIFTS, ids=lambda s: s[0])
def test_seeded_checkpoint_drift_is_caught(seeded: tuple[str, str, type[ck.CkptModel]]) -> None:
    name, description, model = seeded
    r = ckpt_seeded.check_seeded_ckpt(name, description, model)
    assert r.caught, f"seeded drift {name} missed after {r.checks} checks"


def test_a_drifted_spec_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift on the spec's side: slot pressure evicts the newest Ready checkpoint."""

    def newest(self: CheckpointStore, emit: Emit) -> bool:
        ready = [c for c in self.ckpts.values() if c.status == spec_hybrid.READY]
        if not ready:
            return False
        self._drop(max(ready, key=lambda c: c.order))
        self.evicted += 1
        return True

    monkeypatch.setattr(CheckpointStore, "_evict_checkpoint", newest)
    with pytest.raises(DriftError):
        ckpt_drift.run_ckpt_drift(3000, seed=0)


def test_abstraction_reads_a_pinned_restore() -> None:
    ns = Namespace("hybrid-proofs@1")
    cache = HybridSpecCache(6, 2, max_num_seqs=2, state_budget=1)
    cache.admit(Request("q0", [1, 2, 3, 4, 5], ns))
    cache.commit("q0", 4)
    cache.free(["q0"])
    adm = cache.admit(Request("q1", [1, 2, 3, 4, 5], ns))
    assert adm.restore_slot is not None
    a = ckpt_drift.abstract(cache, 3)
    s = adm.restore_slot
    assert a["kind"][s] == ck.PINNED and a["owner"][s] == 1
    assert a["cached"][1] == a["bnd"][s] == 2 and a["hit"][1] == a["node"][s]
    assert ckpt_drift.CkptDriftChecker(ck.CkptModel(ck.CkptBounds(nodes=6))).invariant_holds(a)
