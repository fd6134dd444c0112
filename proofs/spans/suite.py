"""The span model as ``prove`` runs it: its :class:`~prefixkv.proofs.suite.ProofSuite`
(``--invariants SPANS``, off with ``--no-spans``; the ``spans``, ``broken`` and
``span_drift`` keys of ``--json``)."""

from __future__ import annotations

from ..suite import Part, ProofSuite, Selection, say_seeded, seeded_rows, small_suite
from . import drift, seeded
from .broken import SPAN_VARIANTS
from .model import SPAN_OPERATIONS
from .obligations import SpanModel

__all__ = ["SUITE"]


def _drift(sel: Selection) -> Part:
    opts = sel.opts
    rep = drift.run_span_drift(max(1000, opts.drift // 5), seed=opts.seed)
    caught = [
        seeded.check_seeded_span(name, d, m, seed=opts.seed)
        for name, d, m in seeded.SEEDED_SPAN_DRIFTS
    ]
    doc = {
        "span_drift": {
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
            "seeded": seeded_rows(caught, "checks"),
        }
    }
    line = (
        f"\nspan drift: {rep.checks} checks against SpecCache ({rep.successes} successful "
        f"steps, {rep.rejections} rejections, {rep.clamped} clamped matches, "
        f"{rep.chunk_cuts} chunks cut by a span, {rep.split_refusals} span refusals) "
        f"in {rep.seconds:.1f}s, no drift"
    )
    return Part(all(s.caught for s in caught), doc, [line, *say_seeded(caught)])


SUITE: ProofSuite = small_suite(
    "SPANS",
    "spans",
    "no_spans",
    SpanModel,
    SPAN_OPERATIONS,
    SPAN_VARIANTS,
    _drift,
    seeded.SEEDED_SPAN_DRIFTS,
)
"""The span parts of INV-LIMIT and INV-MATCH, for one sequence with several spans."""
