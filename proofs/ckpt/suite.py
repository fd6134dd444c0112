"""The checkpoint model as ``prove`` runs it: its :class:`~prefixkv.proofs.suite.ProofSuite`.

INV-CKPT's clauses over every asked checkpoint operation (``--invariants INV-CKPT``, off with
``--no-checkpoints``), the broken models, and the drift check against ``HybridSpecCache``
with its seeded drifts; the rows are the ``checkpoints``, ``broken`` and
``checkpoint_drift`` keys of ``--json``.
"""

from __future__ import annotations

from prefixkv.spec.invariant_ids import InvariantId

from ..suite import BrokenRow, Part, ProofSuite, Selection, say_seeded, seeded_rows
from . import broken, drift, obligations, seeded
from .model import CKPT_OPERATIONS, STRENGTHENINGS

__all__ = ["SUITE"]


def _operations(sel: Selection) -> list[str]:
    """The asked checkpoint operations; none when INV-CKPT is not picked or is skipped."""
    if sel.opts.no_checkpoints or InvariantId.CKPT not in sel.invariants:
        return []
    return sel.operations_of(CKPT_OPERATIONS)


def _obligations(sel: Selection) -> Part:
    opts, ops = sel.opts, _operations(sel)
    if not ops:
        return Part()
    prover = obligations.CkptProver(rlimit=opts.rlimit, seed=opts.seed)

    def progress(r: obligations.CkptRow) -> None:
        sel.show(
            f"{InvariantId.CKPT}:{r.invariant}", r.operation, r.status, r.seconds, "checkpoints"
        )

    rows = prover.rows(ops=ops, progress=progress)
    witnesses = {} if opts.no_witnesses else prover.witnesses(ops)
    for r in rows:
        if r.operation in witnesses:
            r.non_vacuous = witnesses[r.operation][1] == "sat"
    ok = all(r.status == "proved" for r in rows) and all(w[1] == "sat" for w in witnesses.values())
    bounds = prover.model.b.describe()
    doc = {
        "checkpoints": {
            "bounds": bounds,
            "obligations": [r.as_dict() for r in rows],
            "non_vacuity": {
                op: {
                    "scenario": w[0],
                    "status": w[1],
                    **({"witness": w[2]} if opts.verbose else {}),
                }
                for op, w in witnesses.items()
            },
            "strengthenings": STRENGTHENINGS,
        }
    }
    proved = sum(r.status == "proved" for r in rows)
    lines = [f"{proved}/{len(rows)} {InvariantId.CKPT} obligations proved ({bounds})"]
    lines += [
        f"\n{r.invariant} / {r.operation}: {r.status}\n{r.detail}"
        for r in rows
        if r.status != "proved"
    ]
    return Part(ok, doc, lines)


def _broken(sel: Selection) -> list[BrokenRow]:
    if not _operations(sel):
        return []
    results = [broken.check_ckpt_variant(v, rlimit=sel.opts.rlimit) for v in broken.CKPT_VARIANTS]
    return [
        {
            "name": r.variant.name,
            "invariant": f"{InvariantId.CKPT}:{r.variant.invariant}",
            "step": r.variant.step,
            "kind": r.variant.kind,
            "description": r.variant.description,
            "caught": r.caught,
            "seconds": round(r.row.seconds, 3),
            "counterexample": r.row.detail if r.caught else None,
        }
        for r in results
    ]


def _drift(sel: Selection) -> Part:
    if not _operations(sel):
        return Part()
    opts = sel.opts
    rep = drift.run_ckpt_drift(max(1000, opts.drift // 5), seed=opts.seed)
    caught = [
        seeded.check_seeded_ckpt(n, d, m, seed=opts.seed) for n, d, m in seeded.SEEDED_CKPT_DRIFTS
    ]
    doc = {
        "checkpoint_drift": {
            "checks": rep.checks,
            "spec_successes": rep.successes,
            "spec_rejections": rep.rejections,
            "kv_rejections": rep.kv_rejections,
            "invariant_checks": rep.invariant_checks,
            "seconds": round(rep.seconds, 3),
            "by_operation": rep.by_op,
            "checkpoint_fates": rep.fates,
            "seeded": seeded_rows(caught, "after_checks"),
        }
    }
    line = (
        f"\ncheckpoint drift: {rep.checks} checks against HybridSpecCache "
        f"({rep.successes} successful steps, {rep.rejections} rejections, "
        f"{rep.kv_rejections} KV-side rejections not modelled; fates {rep.fates}) "
        f"in {rep.seconds:.1f}s, no drift"
    )
    return Part(all(s.caught for s in caught), doc, [line, *say_seeded(caught)])


SUITE = ProofSuite(
    name=InvariantId.CKPT,
    invariants=(InvariantId.CKPT,),
    operations=CKPT_OPERATIONS,
    obligations=_obligations,
    broken=_broken,
    drift=_drift,
    seeded=seeded.SEEDED_CKPT_DRIFTS,
)
"""INV-CKPT: the recurrent-state checkpoint lifecycle of ``HybridSpecCache``."""
