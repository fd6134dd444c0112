"""The KV model as ``prove`` runs it: its :class:`~prefixkv.proofs.suite.ProofSuite`.

Obligations (every picked invariant over every asked operation, with one witness per
operation), ``--alone`` (which invariants are not inductive on their own), the broken
encodings, and the drift check with its seeded drifts; the rows are the ``obligations``,
``non_vacuity``, ``not_inductive_alone``, ``broken`` and ``drift`` keys of ``--json``.
"""

from __future__ import annotations

from typing import Any

from ..suite import BrokenRow, Part, ProofSuite, Selection, say_seeded, seeded_rows
from . import broken, drift, obligations, seeded
from .transitions import Encoding

__all__ = ["SUITE"]


def _invariants(sel: Selection) -> list[str]:
    return sel.invariants_of(obligations.PROPERTY_IDS)


def _operations(sel: Selection) -> list[str]:
    return sel.operations_of(tuple(obligations.OPERATIONS)) if _invariants(sel) else []


def _obligations(sel: Selection) -> Part:
    opts, ops = sel.opts, _operations(sel)
    prover = obligations.Prover(Encoding(sel.bounds), rlimit=opts.rlimit, seed=opts.seed)

    def progress(r: obligations.Row) -> None:
        sel.show(r.invariant, r.operation, r.status, r.seconds, " ; ".join(r.steps))

    rows = prover.rows(_invariants(sel), ops, progress=progress)
    witnesses = {} if opts.no_witnesses or not ops else prover.witnesses(ops)
    for r in rows:
        # INV-TXN rows carry their own witnesses: one per failing precondition
        if r.operation in witnesses and r.non_vacuous is None:
            r.non_vacuous = witnesses[r.operation].status == "sat"
    ok = all(r.status == "proved" and r.non_vacuous is not False for r in rows)
    ok &= all(w.status == "sat" for w in witnesses.values())
    doc = {
        "strengthenings": obligations.STRENGTHENINGS,
        "obligations": [r.as_dict() for r in rows],
        "non_vacuity": {
            op: {
                "scenario": w.scenario,
                "status": w.status,
                "seconds": round(w.seconds, 3),
                **({"witness": w.state} if opts.verbose else {}),
            }
            for op, w in witnesses.items()
        },
    }
    return Part(ok, doc, _summary(sel, rows, witnesses))


def _summary(
    sel: Selection, rows: list[obligations.Row], witnesses: dict[str, obligations.Witness]
) -> list[str]:
    proved = sum(r.status == "proved" for r in rows)
    lines = [f"\n{proved}/{len(rows)} state obligations proved"]
    for fr in rows:
        if fr.status != "proved":
            lines.append(f"\n{fr.invariant} / {fr.operation}: {fr.status}\n{fr.detail}")
    if witnesses:
        bad = [w for w in witnesses.values() if w.status != "sat"]
        lines.append(
            f"non-vacuity: {len(witnesses) - len(bad)}/{len(witnesses)} operations have "
            "satisfiable hypotheses and a witness scenario"
        )
        lines += [f"  {w.operation}: {w.scenario}: {w.status} {w.state}" for w in bad]
        if sel.opts.verbose:
            lines += [
                f"\nwitness for {w.operation} ({w.scenario}):\n{w.state}"
                for w in witnesses.values()
            ]
    lines.append("strengthenings:")
    lines += [f"  {k}: {v}" for k, v in obligations.STRENGTHENINGS.items()]
    return lines


def _alone(sel: Selection) -> Part:
    alone = obligations.inductive_alone(Encoding(sel.bounds))
    doc = {
        "not_inductive_alone": {
            inv: [{"step": step, "counterexample": str(cex)} for step, cex in items]
            for inv, items in alone.items()
        }
    }
    lines = ["\nnot inductive on its own (a state satisfying only that invariant breaks it):"]
    for inv, items in alone.items():
        steps = ", ".join(step for step, _ in items) or "inductive alone"
        lines.append(f"  {inv:<15}{steps}")
        if sel.opts.verbose:
            lines += [str(cex) + "\n" for _, cex in items]
    return Part(True, doc, lines)


def _broken(sel: Selection) -> list[BrokenRow]:
    # NOTE: '--invariants INV-CKPT --broken' checks the checkpoint variants only
    if not _invariants(sel):
        return []
    results = [broken.check_variant(v, sel.bounds) for v in broken.VARIANTS]
    return [
        {
            "name": r.variant.name,
            "invariant": r.variant.invariant,
            "step": r.variant.step,
            "kind": r.variant.kind,
            "description": r.variant.description,
            "caught": r.caught,
            "seconds": round(r.seconds, 3),
            "counterexample": str(r.counterexample) if r.counterexample else None,
        }
        for r in results
    ]


def _drift(sel: Selection) -> Part:
    opts = sel.opts
    report = drift.default_run(Encoding(sel.bounds), opts.drift, seed=opts.seed)
    caught = [seeded.check_seeded(n, d, c, bounds=sel.bounds) for n, d, c in seeded.SEEDED_DRIFTS]
    doc: dict[str, Any] = {
        "drift": {
            "checks": report.checks,
            "spec_successes": report.successes,
            "spec_rejections": report.failures,
            "solver_calls": report.solver_calls,
            "invariant_checks": report.invariant_checks,
            "skipped": report.skipped,
            "window_admissions": report.windows,
            "window_states": report.window_states,
            "seconds": round(report.seconds, 3),
            "by_operation": report.by_op,
            "seeded": seeded_rows(caught, "after_checks"),
        }
    }
    line = (
        f"\ndrift: {report.checks} checks ({report.successes} successful steps, "
        f"{report.failures} rejections, {report.invariant_checks} invariant checks, "
        f"{report.windows} admissions with a recompute window, "
        f"{report.window_states} checks from a state with a window block to write) "
        f"in {report.seconds:.1f}s, no drift"
    )
    return Part(all(s.caught for s in caught), doc, [line, *say_seeded(caught)])


SUITE = ProofSuite(
    name="KV",
    invariants=tuple(obligations.PROPERTY_IDS),
    operations=tuple(obligations.OPERATIONS),
    obligations=_obligations,
    broken=_broken,
    drift=_drift,
    alone=_alone,
    seeded=seeded.SEEDED_DRIFTS,
)
"""The KV model: INV-REF through INV-TXN over every operation of ``SpecCache``."""
