"""Run the proofs: every model's obligations, broken variants and drift checks.

The library half of ``prefixkv prove`` (the command, :mod:`prefixkv.commands.prove`, parses
the flags into :class:`ProveOptions` and prints). :func:`run` returns a :class:`ProofReport`:
the JSON document of every row, and whether everything was proved; while it runs it hands
each line of the human-readable table to ``emit``, so a caller can stream it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import attrs
from prefixkv.spec.invariant_ids import InvariantId

from prefixkv.errors import InvalidConfig

from . import ckpt as checkpoints
from . import joint, kernel_index, small, spans
from .ckpt import drift as ckpt_drift
from .ckpt import seeded as ckpt_seeded
from .driver import SeededResult
from .joint import drift as joint_drift
from .joint import seeded as joint_seeded
from .kv import broken, drift, obligations
from .kv import seeded as kv_seeded
from .kv.model import Bounds
from .kv.transitions import Encoding
from .spans import drift as span_drift
from .spans import seeded as span_seeded

__all__ = [
    "PROVED",
    "SMALL_MODELS",
    "InvalidSelection",
    "ProofReport",
    "ProveOptions",
    "run",
]

#: Every invariant ``prove`` has obligations for (``--invariants`` picks among them); the
#: registry's other ids are in ``prefixkv.spec.invariant_ids.NOT_PROVED``, with the reason.
PROVED = (*obligations.PROPERTY_IDS, InvariantId.CKPT)


class InvalidSelection(InvalidConfig):
    """An unknown invariant or operation, or bounds the model cannot run with."""


@attrs.frozen
class ProveOptions:
    """What to run (the flags of ``prefixkv prove``, by the same names)."""

    seqs: int = Bounds.seqs
    table: int = Bounds.table
    rlimit: int = obligations.DEFAULT_RLIMIT
    seed: int = 0
    invariants: str = ""
    operations: str = ""
    no_kernels: bool = False
    no_checkpoints: bool = False
    no_spans: bool = False
    no_joint: bool = False
    no_witnesses: bool = False
    broken: bool = False
    drift: int = 0
    alone: bool = False
    verbose: bool = False


@attrs.frozen
class ProofReport:
    """The outcome of :func:`run`: ``doc`` is the ``--json`` document (``ok`` included)."""

    ok: bool
    doc: dict[str, Any]

    @property
    def seconds(self) -> float:
        return float(self.doc["seconds"])


Emit = Callable[[str], None]
"""Receives each line of the text table as soon as it is known."""


def _csv(value: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise InvalidSelection(
            f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})"
        )
    return items or list(allowed)


def run(opts: ProveOptions, emit: Emit | None = None) -> ProofReport:
    """Run what ``opts`` asks for; hand the text table's lines to ``emit`` (when given)."""
    args = opts

    def say(line: str) -> None:
        if emit is not None:
            emit(line)

    t0 = time.perf_counter()
    bounds = Bounds(seqs=args.seqs, table=args.table)
    if bounds.seqs < 2 or bounds.table < 1:
        raise InvalidSelection("--seqs must be >= 2 and --table >= 1")
    all_ops = list(
        dict.fromkeys(
            [
                *obligations.OPERATIONS,
                *checkpoints.CKPT_OPERATIONS,
                *spans.SPAN_OPERATIONS,
                *joint.JOINT_OPERATIONS,
            ]
        )
    )
    groups = (InvariantId.CKPT, *SMALL_MODELS)
    picked = _csv(args.invariants, [*PROVED, *SMALL_MODELS], "invariant")
    asked = _csv(args.operations, all_ops, "operation")
    invs = [i for i in picked if i not in groups]
    ops = [o for o in asked if o in obligations.OPERATIONS] if invs else []
    ckpt_ops = [o for o in asked if o in checkpoints.CKPT_OPERATIONS]
    do_ckpt = not args.no_checkpoints and InvariantId.CKPT in picked and bool(ckpt_ops)
    enc = Encoding(bounds)
    prover = obligations.Prover(enc, rlimit=args.rlimit, seed=args.seed)
    text = emit is not None
    ok = True
    doc: dict[str, Any] = {
        "bounds": bounds.describe(),
        "rlimit": args.rlimit,
        "seed": args.seed,
        "strengthenings": obligations.STRENGTHENINGS,
    }

    if text:
        say(f"prefixkv proofs: {bounds.describe()}; rlimit {args.rlimit}, seed {args.seed}")
        say(f"{'invariant':<24}{'operation':<42}{'result':<16}{'time':>8}  via")

    def show(inv: str, op: str, status: str, seconds: float, via: str) -> None:
        if text:
            say(f"{inv:<24}{op:<42}{status:<16}{seconds:>7.2f}s  {via}")

    rows = prover.rows(
        invs,
        ops,
        progress=lambda r: show(r.invariant, r.operation, r.status, r.seconds, " ; ".join(r.steps)),
    )
    witnesses = {} if args.no_witnesses or not ops else prover.witnesses(ops)
    for r in rows:
        # INV-TXN rows carry their own witnesses: one per failing precondition
        if r.operation in witnesses and r.non_vacuous is None:
            r.non_vacuous = witnesses[r.operation].status == "sat"
    ok &= all(r.status == "proved" for r in rows)
    ok &= all(r.non_vacuous is not False for r in rows)
    ok &= all(w.status == "sat" for w in witnesses.values())
    doc["obligations"] = [r.as_dict() for r in rows]
    doc["non_vacuity"] = {
        op: {
            "scenario": w.scenario,
            "status": w.status,
            "seconds": round(w.seconds, 3),
            **({"witness": w.state} if args.verbose else {}),
        }
        for op, w in witnesses.items()
    }
    ckpt_rows: list[checkpoints.CkptRow] = []
    ckpt_prover = checkpoints.CkptProver(rlimit=args.rlimit, seed=args.seed)
    if do_ckpt:
        ckpt_rows = ckpt_prover.rows(
            ops=ckpt_ops,
            progress=lambda r: show(
                f"{InvariantId.CKPT}:{r.invariant}", r.operation, r.status, r.seconds, "checkpoints"
            ),
        )
        cw = {} if args.no_witnesses else ckpt_prover.witnesses(ckpt_ops)
        for cr in ckpt_rows:
            if cr.operation in cw:
                cr.non_vacuous = cw[cr.operation][1] == "sat"
        ok &= all(r.status == "proved" for r in ckpt_rows)
        ok &= all(w[1] == "sat" for w in cw.values())
        doc["checkpoints"] = {
            "bounds": ckpt_prover.model.b.describe(),
            "obligations": [r.as_dict() for r in ckpt_rows],
            "non_vacuity": {
                op: {
                    "scenario": w[0],
                    "status": w[1],
                    **({"witness": w[2]} if args.verbose else {}),
                }
                for op, w in cw.items()
            },
            "strengthenings": checkpoints.STRENGTHENINGS,
        }
    small_runs: dict[str, small.ModelRun] = {}
    for group, spec in SMALL_MODELS.items():
        model_ops = [o for o in asked if o in spec.operations]
        if group not in picked or getattr(args, spec.skip_flag) or not model_ops:
            continue
        model = spec.model()
        mrun = small.prove_all(
            model,
            model_ops,
            rlimit=args.rlimit,
            seed=args.seed,
            witnesses=not args.no_witnesses,
            progress=_small_progress(group, show),
        )
        small_runs[group] = mrun
        ok &= mrun.ok
        doc[spec.key] = {
            "bounds": model.describe(),
            "obligations": [r.as_dict() for r in mrun.rows],
            "non_vacuity": {
                op: {
                    "scenario": w[0],
                    "status": w[1],
                    **({"witness": w[2]} if args.verbose else {}),
                }
                for op, w in mrun.witnesses.items()
            },
        }
    kernels: list[kernel_index.KernelResult] = []
    if not args.no_kernels:
        for kob in kernel_index.KERNEL_OBLIGATIONS:
            res = kernel_index.run_obligation(kob, args.rlimit, args.seed)
            kernels.append(res)
            show(
                res.invariant,
                f"{res.function} [{res.method}]",
                res.status,
                res.seconds,
                "index_math",
            )
        ok &= all(k.status == "proved" and k.non_vacuous for k in kernels)
    doc["kernel"] = [k.as_dict() for k in kernels]

    if text:
        proved = sum(r.status == "proved" for r in rows)
        say(
            f"\n{proved}/{len(rows)} state obligations proved; "
            f"{sum(k.status == 'proved' for k in kernels)}/{len(kernels)} kernel "
            "obligations proved"
        )
        if do_ckpt:
            say(
                f"{sum(r.status == 'proved' for r in ckpt_rows)}/{len(ckpt_rows)} INV-CKPT "
                f"obligations proved ({ckpt_prover.model.b.describe()})"
            )
        failed: list[obligations.Row | checkpoints.CkptRow] = [
            r for r in rows if r.status != "proved"
        ]
        for group, mrun in small_runs.items():
            say(
                f"{sum(r.status == 'proved' for r in mrun.rows)}/{len(mrun.rows)} {group} "
                f"obligations proved ({doc[SMALL_MODELS[group].key]['bounds']})"
            )
        failed += [cr for cr in ckpt_rows if cr.status != "proved"]
        for mrun in small_runs.values():
            for sr in mrun.rows:
                if sr.status != "proved":
                    say(f"\n{sr.invariant} / {sr.operation}: {sr.status}\n{sr.detail}")
            for op, (scenario, status, _) in mrun.witnesses.items():
                if status != "sat":
                    say(f"  {op}: {scenario}: {status}")
        for fr in failed:
            say(f"\n{fr.invariant} / {fr.operation}: {fr.status}\n{fr.detail}")
        if witnesses:
            bad = [w for w in witnesses.values() if w.status != "sat"]
            say(
                f"non-vacuity: {len(witnesses) - len(bad)}/{len(witnesses)} operations have "
                "satisfiable hypotheses and a witness scenario"
            )
            for w in bad:
                say(f"  {w.operation}: {w.scenario}: {w.status} {w.state}")
            if args.verbose:
                for w in witnesses.values():
                    say(f"\nwitness for {w.operation} ({w.scenario}):\n{w.state}")
        say("strengthenings:")
        for k, v in obligations.STRENGTHENINGS.items():
            say(f"  {k}: {v}")

    if args.alone:
        alone = obligations.inductive_alone(enc)
        doc["not_inductive_alone"] = {
            inv: [{"step": step, "counterexample": str(cex)} for step, cex in items]
            for inv, items in alone.items()
        }
        if text:
            say("\nnot inductive on its own (a state satisfying only that invariant breaks it):")
            for inv, items in alone.items():
                steps = ", ".join(step for step, _ in items) or "inductive alone"
                say(f"  {inv:<15}{steps}")
                if args.verbose:
                    for _, cex in items:
                        say(str(cex) + "\n")

    if args.broken:
        # NOTE: '--invariants INV-CKPT --broken' checks the checkpoint variants only
        results = [broken.check_variant(v, bounds) for v in broken.VARIANTS] if invs else []
        kvariants = kernel_index.KERNEL_VARIANTS if invs else ()
        kv = [kernel_index.check_kernel_variant(v, args.rlimit) for v in kvariants]
        cv = (
            [
                checkpoints.check_ckpt_variant(v, rlimit=args.rlimit)
                for v in checkpoints.CKPT_VARIANTS
            ]
            if do_ckpt
            else []
        )
        ok &= all(r.caught for r in results) and all(k.status != "proved" for k in kv)
        ok &= all(r.caught for r in cv)
        sv = [
            (group, small.check_variant(v, rlimit=args.rlimit, seed=args.seed))
            for group in small_runs
            for v in SMALL_MODELS[group].variants
        ]
        ok &= all(r.caught for _, r in sv)
        doc["broken"] = (
            [
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
            + [
                {
                    "name": v.name,
                    "invariant": "KERNEL",
                    "step": v.function,
                    "kind": "kernel",
                    "description": v.description,
                    "caught": k.status != "proved",
                    "seconds": round(k.seconds, 3),
                    "counterexample": k.detail,
                }
                for v, k in zip(kvariants, kv, strict=True)
            ]
            + [
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
                for r in cv
            ]
            + [
                {
                    "name": r.variant.name,
                    "invariant": f"{group}:{r.variant.prop}",
                    "step": r.variant.operation,
                    "kind": r.variant.kind,
                    "description": r.variant.description,
                    "caught": r.caught,
                    "seconds": round(r.row.seconds, 3),
                    "counterexample": r.row.detail if r.caught else None,
                }
                for group, r in sv
            ]
        )
        if text:
            say(f"\n{'broken variant':<34}{'invariant':<24}{'kind':<18}result")
            for item in doc["broken"]:
                verdict = "counterexample" if item["caught"] else "NOT CAUGHT"
                say(f"{item['name']:<34}{item['invariant']:<24}{item['kind']:<18}{verdict}")
                if args.verbose and item["counterexample"]:
                    say(item["counterexample"] + "\n")

    if args.drift:
        report = drift.default_run(enc, args.drift, seed=args.seed)
        seeded = [
            kv_seeded.check_seeded(n, d, c, bounds=bounds) for n, d, c in kv_seeded.SEEDED_DRIFTS
        ]
        ok &= all(s.caught for s in seeded)
        doc["drift"] = {
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
            "seeded": _seeded_rows(seeded, "after_checks"),
        }
        if text:
            say(
                f"\ndrift: {report.checks} checks ({report.successes} successful steps, "
                f"{report.failures} rejections, {report.invariant_checks} invariant checks, "
                f"{report.windows} admissions with a recompute window, "
                f"{report.window_states} checks from a state with a window block to write) "
                f"in {report.seconds:.1f}s, no drift"
            )
            _say_seeded(say, seeded)

    if args.drift and do_ckpt:
        n_ck = max(1000, args.drift // 5)
        crep = ckpt_drift.run_ckpt_drift(n_ck, seed=args.seed)
        cseeded = [
            ckpt_seeded.check_seeded_ckpt(n, d, m, seed=args.seed)
            for n, d, m in ckpt_seeded.SEEDED_CKPT_DRIFTS
        ]
        ok &= all(s.caught for s in cseeded)
        doc["checkpoint_drift"] = {
            "checks": crep.checks,
            "spec_successes": crep.successes,
            "spec_rejections": crep.rejections,
            "kv_rejections": crep.kv_rejections,
            "invariant_checks": crep.invariant_checks,
            "seconds": round(crep.seconds, 3),
            "by_operation": crep.by_op,
            "checkpoint_fates": crep.fates,
            "seeded": _seeded_rows(cseeded, "after_checks"),
        }
        if text:
            say(
                f"\ncheckpoint drift: {crep.checks} checks against HybridSpecCache "
                f"({crep.successes} successful steps, {crep.rejections} rejections, "
                f"{crep.kv_rejections} KV-side rejections not modelled; fates {crep.fates}) "
                f"in {crep.seconds:.1f}s, no drift"
            )
            _say_seeded(say, cseeded)

    if args.drift and "SPANS" in small_runs:
        ok &= _span_drift(opts, doc, say if text else None)
    if args.drift and "JOINT" in small_runs:
        ok &= _joint_drift(opts, doc, say if text else None)

    doc["ok"] = bool(ok)
    doc["seconds"] = round(time.perf_counter() - t0, 3)
    return ProofReport(bool(ok), doc)


@dataclass(frozen=True)
class SmallModelSpec:
    key: str  # the JSON document's key
    skip_flag: str
    operations: tuple[str, ...]
    model: Callable[[], small.SmallModel]
    variants: tuple[small.Variant, ...]


SMALL_MODELS = {
    "SPANS": SmallModelSpec(
        "spans", "no_spans", spans.SPAN_OPERATIONS, spans.SpanModel, spans.SPAN_VARIANTS
    ),
    "JOINT": SmallModelSpec(
        "joint", "no_joint", joint.JOINT_OPERATIONS, joint.JointModel, joint.JOINT_VARIANTS
    ),
}
"""The small models' groups, as ``--invariants`` names them (``SPANS``, ``JOINT``)."""


def _small_progress(
    group: str, show: Callable[[str, str, str, float, str], None]
) -> Callable[[small.SmallRow], None]:
    def progress(r: small.SmallRow) -> None:
        show(f"{group}:{r.invariant}", r.operation, r.status, r.seconds, r.model)

    return progress


def _span_drift(args: ProveOptions, doc: dict[str, Any], say: Emit | None) -> bool:
    n = max(1000, args.drift // 5)
    rep = span_drift.run_span_drift(n, seed=args.seed)
    seeded = [
        span_seeded.check_seeded_span(name, d, m, seed=args.seed)
        for name, d, m in span_seeded.SEEDED_SPAN_DRIFTS
    ]
    doc["span_drift"] = {
        "checks": rep.checks,
        "spec_successes": rep.successes,
        "spec_rejections": rep.rejections,
        "out_of_blocks": rep.out_of_blocks,
        "invariant_checks": rep.invariant_checks,
        "clamped_admissions": rep.clamped,
        "chunks_cut_by_a_span": rep.chunk_cuts,
        "split_refusals": rep.split_refusals,
        "seconds": round(rep.seconds, 3),
        "by_operation": rep.by_op,
        "seeded": _seeded_rows(seeded, "checks"),
    }
    if say is not None:
        say(
            f"\nspan drift: {rep.checks} checks against SpecCache ({rep.successes} successful "
            f"steps, {rep.rejections} rejections, {rep.clamped} clamped matches, "
            f"{rep.chunk_cuts} chunks cut by a span, {rep.split_refusals} span refusals) "
            f"in {rep.seconds:.1f}s, no drift"
        )
        _say_seeded(say, seeded)
    return all(s.caught for s in seeded)


def _joint_drift(args: ProveOptions, doc: dict[str, Any], say: Emit | None) -> bool:
    n = max(1000, args.drift // 5)
    rep = joint_drift.run_joint_drift(n, seed=args.seed)
    ex = joint_drift.run_experts_lockstep(n, seed=args.seed)
    seeded = [
        joint_seeded.check_seeded_joint(name, d, c, seed=args.seed)
        for name, d, c in joint_seeded.SEEDED_JOINT_DRIFTS
    ] + [
        joint_seeded.check_seeded_experts(name, d, c, seed=args.seed)
        for name, d, c in joint_seeded.SEEDED_EXPERT_DRIFTS
    ]
    doc["joint_drift"] = {
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
        "seeded": _seeded_rows(seeded, "checks"),
    }
    if say is not None:
        say(
            f"\njoint check: {rep.checks} steps of HybridSpecCache ({rep.invariant_checks} "
            f"states, {rep.restores} restores checked, {rep.stale} stale checkpoints, "
            f"{rep.republished} blocks published again) in {rep.seconds:.1f}s; routed experts: "
            f"{ex.steps} steps in lockstep, {ex.matches} matches equal ({ex.replays} replays) "
            f"in {ex.seconds:.1f}s"
        )
        _say_seeded(say, seeded, unit="steps", width=26)
    return all(s.caught for s in seeded)


def _seeded_rows(seeded: Sequence[SeededResult], checks_key: str) -> list[dict[str, Any]]:
    """The JSON rows of seeded drifts (``checks_key``: the name the model's report uses)."""
    return [
        {"name": s.name, "description": s.description, "caught": s.caught, checks_key: s.checks}
        for s in seeded
    ]


def _say_seeded(
    say: Emit, seeded: Sequence[SeededResult], unit: str = "checks", width: int = 24
) -> None:
    """One text line per seeded drift: caught after how many checks (or steps), or MISSED."""
    for s in seeded:
        verdict = f"caught after {s.checks} {unit}" if s.caught else "MISSED"
        say(f"  seeded drift {s.name:<{width}} {verdict}")
