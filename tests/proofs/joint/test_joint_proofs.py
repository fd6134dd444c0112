"""The joint KV + checkpoint model in Z3: restore safety over every interleaving and
routed-expert non-interference are inductive, not vacuous, able to fail, and hold on
:class:`HybridSpecCache`'s reachable states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

pytest.importorskip("z3")

import z3
from prefixkv.proofs import joint as jt
from prefixkv.proofs import small
from prefixkv.proofs.joint import drift as joint_drift
from prefixkv.proofs.joint import seeded as joint_seeded
from prefixkv.spec import HybridSpecCache, Namespace, Request

DRIFT_STEPS = 1500


@pytest.fixture(scope="module")
def run() -> small.ModelRun:
    return small.prove_all(jt.JointModel())


def test_every_joint_obligation_is_proved(
    run: small.ModelRun, unproved: Callable[[Iterable[Any]], str]
) -> None:
    assert unproved(run.rows) == ""
    got = {(r.invariant, r.operation) for r in run.rows}
    for op in jt.JOINT_OPERATIONS:
        assert {(p, op) for p in jt.STATE_IDS} | {("EXPERTS", op)} <= got
    assert {("RESTORE-SAFE", "admit"), ("RESTORE-SAFE", "restore_issued")} <= got


def test_every_joint_operation_is_non_vacuous(run: small.ModelRun) -> None:
    assert set(run.witnesses) == set(jt.JOINT_OPERATIONS) - {"init"}
    assert {op: w[1] for op, w in run.witnesses.items()} == dict.fromkeys(run.witnesses, "sat")
    assert all(r.non_vacuous for r in run.rows if r.operation != "init")
    assert "pinned" in run.witnesses["admit"][2]


@pytest.mark.parametrize("variant", jt.JOINT_VARIANTS, ids=lambda v: v.name)
def test_broken_joint_variant_yields_a_counterexample(variant: small.Variant) -> None:
    res = small.check_variant(variant)
    assert res.caught, f"{variant.name}: {res.row.status}"
    assert "step:" in res.row.detail


def test_a_stale_checkpoint_is_excluded_by_the_invariant() -> None:
    """A Ready checkpoint whose node was evicted and published again (another gen) is not a
    state of the model; one whose node still carries the saved gen is."""
    m = jt.JointModel()
    x = m.fresh("x.")
    s = z3.Solver()
    s.add(m.inv(x), x.kind[0] == jt.READY, x.node[0] == 1, x.sgen[0] != x.gen[1])
    assert s.check() == z3.unsat
    s = z3.Solver()
    s.add(m.inv(x), x.kind[0] == jt.PINNED, x.bnd[0] == 2)
    assert s.check() == z3.sat


def test_restore_safety_reads_the_whole_prefix() -> None:
    """RESTORE-SAFE fails when a node of the prefix (not only the checkpoint's own node) is
    not the publication its child was published under."""
    m = jt.JointModel()
    x = m.fresh("x.")
    path = (z3.IntVal(0), z3.IntVal(1), z3.IntVal(2))
    s = z3.Solver()
    s.add(
        m.restore_safe(x, z3.IntVal(0), z3.IntVal(2), path),
        x.pgen[1] != x.gen[0],
    )
    assert s.check() == z3.unsat


# -- against the spec -----------------------------------------------------------------------


def test_reachable_hybrid_states_satisfy_the_joint_model() -> None:
    rep = joint_drift.run_joint_drift(DRIFT_STEPS, seed=1)
    assert rep.checks >= DRIFT_STEPS and rep.invariant_checks > 0
    # the interleavings that matter occur: restores, stale checkpoints, blocks reused
    assert rep.restores > 0 and rep.stale > 0 and rep.republished > 0
    assert {"admit", "commit", "evict", "restore_issued", "free", "reset"} <= set(rep.by_op)


@pytest.mark.parametrize("seeded", joint_seeded.SEEDED_JOINT_DRIFTS, ids=lambda s: s[0])
def test_a_drifted_hybrid_spec_is_caught(seeded: tuple[str, str, type[HybridSpecCache]]) -> None:
    name, description, cache_type = seeded
    assert joint_seeded.check_seeded_joint(name, description, cache_type).caught


def test_routed_experts_never_change_the_spec() -> None:
    rep = joint_drift.run_experts_lockstep(DRIFT_STEPS, seed=2)
    assert rep.steps >= DRIFT_STEPS and rep.matches > 0 and rep.replays > 0


@pytest.mark.parametrize("seeded", joint_seeded.SEEDED_EXPERT_DRIFTS, ids=lambda s: s[0])
def test_a_spec_whose_match_reads_experts_is_caught(
    seeded: tuple[str, str, type[HybridSpecCache]],
) -> None:
    name, description, cache_type = seeded
    assert joint_seeded.check_seeded_experts(name, description, cache_type).caught


def test_abstraction_ghosts_follow_a_reused_block() -> None:
    """A block evicted and published again gets a new gen; its checkpoint went stale."""
    ns = Namespace("joint-proofs@1")
    cache = HybridSpecCache(3, 2, max_num_seqs=1, state_budget=1)
    rep = joint_drift.JointDriftReport()
    g = joint_drift._Ghosts()
    cache.admit(Request("j0", [1, 2, 3, 4, 5], ns))
    cache.commit("j0", 4)
    g.update(cache, rep)
    first = list(g.gen)
    cache.free(["j0"])
    assert cache.evict(3) == 2
    cache.admit(Request("j0", [7, 8, 9, 9, 5], ns))
    cache.commit("j0", 4)
    g.update(cache, rep)
    assert rep.republished >= 1
    reused = [b for b in range(3) if first[b] and g.gen[b] != first[b]]
    assert reused and all(g.gen[b] > max(first) for b in reused)
