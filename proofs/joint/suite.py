"""The joint model as ``prove`` runs it: its :class:`~prefixkv.proofs.suite.ProofSuite`
(``--invariants JOINT``, off with ``--no-joint``; the ``joint``, ``broken`` and
``joint_drift`` keys of ``--json``)."""

from __future__ import annotations

from ..suite import Part, ProofSuite, Selection, say_seeded, seeded_rows, small_suite
from . import drift, seeded
from .broken import JOINT_VARIANTS
from .model import JOINT_OPERATIONS
from .obligations import JointModel

__all__ = ["SUITE"]


def _drift(sel: Selection) -> Part:
    opts = sel.opts
    n = max(1000, opts.drift // 5)
    rep = drift.run_joint_drift(n, seed=opts.seed)
    ex = drift.run_experts_lockstep(n, seed=opts.seed)
    caught = [
        seeded.check_seeded_joint(name, d, c, seed=opts.seed)
        for name, d, c in seeded.SEEDED_JOINT_DRIFTS
    ] + [
        seeded.check_seeded_experts(name, d, c, seed=opts.seed)
        for name, d, c in seeded.SEEDED_EXPERT_DRIFTS
    ]
    doc = {
        "joint_drift": {
            "checks": rep.checks,
            "spec_successes": rep.successes,
            "invariant_checks": rep.invariant_checks,
            "restores_checked": rep.restores,
            "stale_checkpoints": rep.stale,
            "republished_blocks": rep.republished,
            "seconds": round(rep.seconds, 3),
            "by_operation": rep.by_op,
            "experts_lockstep": {
                "steps": ex.steps,
                "matches": ex.matches,
                "replays": ex.replays,
                "seconds": round(ex.seconds, 3),
            },
            "seeded": seeded_rows(caught, "checks"),
        }
    }
    line = (
        f"\njoint check: {rep.checks} steps of HybridSpecCache ({rep.invariant_checks} "
        f"states, {rep.restores} restores checked, {rep.stale} stale checkpoints, "
        f"{rep.republished} blocks published again) in {rep.seconds:.1f}s; routed experts: "
        f"{ex.steps} steps in lockstep, {ex.matches} matches equal ({ex.replays} replays) "
        f"in {ex.seconds:.1f}s"
    )
    lines = [line, *say_seeded(caught, unit="steps", width=26)]
    return Part(all(s.caught for s in caught), doc, lines)


SUITE: ProofSuite = small_suite(
    "JOINT",
    "joint",
    "no_joint",
    JointModel,
    JOINT_OPERATIONS,
    JOINT_VARIANTS,
    _drift,
    (*seeded.SEEDED_JOINT_DRIFTS, *seeded.SEEDED_EXPERT_DRIFTS),
)
"""The KV and checkpoint models composed: RESTORE-SAFE and EXPERTS over every interleaving."""
