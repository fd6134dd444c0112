"""Seeded drifts of the span model: broken variants (:mod:`.broken`) that the drift check
(:mod:`.drift`) must catch against ``SpecCache``; a drift check that misses one is too weak.
"""

from __future__ import annotations

from ..driver import SeededResult, seeded
from . import broken as sp
from .drift import SpanDriftReport, run_span_drift
from .obligations import SpanModel

__all__ = ["SEEDED_SPAN_DRIFTS", "check_seeded_span"]

SEEDED_SPAN_DRIFTS: tuple[tuple[str, str, type[SpanModel]], ...] = (
    ("chunk-ignores-spans", "chunk_end without the span cut", sp.ChunkSplitsSpan),
    ("chunk-cut-forward", "a cut chunk always runs to the span's end", sp.CutForwardAlways),
    ("clamp-once", "the match clamp moves back once", sp.ClampOnce),
    ("window-not-reclamped", "the prefix after the window is not clamped", sp.WindowNotReclamped),
    ("rollback-ignores-spans", "rollback may land inside a span", sp.RollbackIgnoresSpans),
    ("append-ignores-spans", "check_growth without the span test", sp.AppendIgnoresSpans),
)


def check_seeded_span(
    name: str, description: str, model: type[SpanModel], limit: int = 20_000, seed: int = 0
) -> SeededResult:
    """The drifted model must disagree with the spec within ``limit`` checks."""
    return seeded(
        name,
        description,
        SpanDriftReport(),
        lambda r: r.checks,
        lambda r: run_span_drift(limit, seed, model, r, check_states=False),
    )
