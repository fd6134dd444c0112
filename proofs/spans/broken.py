"""Deliberately broken span models: each overrides one decision point or guard, and the
obligation it names must yield a counterexample (:func:`prefixkv.proofs.small.check_variant`).
"""

from __future__ import annotations

import z3

from ..small import Variant
from ..terms import Term
from .model import SpanState
from .obligations import SpanModel

__all__ = [
    "SPAN_VARIANTS",
    "AppendIgnoresSpans",
    "ChunkSplitsSpan",
    "ClampOnce",
    "ClampToSpanStartBlock",
    "CommitPastReserved",
    "CutBackAlways",
    "CutForwardAlways",
    "RollbackIgnoresSpans",
    "WindowNotReclamped",
]


class ChunkSplitsSpan(SpanModel):
    def chunk_end(
        self, start: Term, P: Term, nn: Term, L: Term, on: Term, st: Term, en: Term
    ) -> Term:
        return self.plain_end(start, P, nn, L)


class CutForwardAlways(SpanModel):
    def span_cut(self, start: Term, s: Term, e: Term) -> Term:
        return e


class CutBackAlways(SpanModel):
    def span_cut(self, start: Term, s: Term, e: Term) -> Term:
        return s


class AppendIgnoresSpans(SpanModel):
    def growth_ok(self, x: SpanState, nr: Term) -> Term:
        return z3.Or(x.R >= x.P, z3.Or(x.L == 0, nr - x.C <= x.L))


class RollbackIgnoresSpans(SpanModel):
    def rollback_ok(self, x: SpanState, nr: Term) -> Term:
        return z3.BoolVal(True)


class ClampOnce(SpanModel):
    def clamp(self, k: Term, on: Term, st: Term, en: Term) -> Term:
        pos = self.times_bs(k)
        nk = k
        for i in reversed(range(self.K)):
            nk = z3.If(z3.And(on[i], st[i] < pos, pos < en[i]), self.blocks_below(st[i]), nk)
        return nk


class WindowNotReclamped(SpanModel):
    def reclamp(self, k: Term, on: Term, st: Term, en: Term) -> Term:
        return k


class ClampToSpanStartBlock(SpanModel):
    """Off by one: clamps to the block *before* the span's start block."""

    def blocks_below(self, x: Term) -> Term:
        b = super().blocks_below(x)
        return z3.If(b > 0, b - 1, 0)


class CommitPastReserved(SpanModel):
    def within_reserved(self, x: SpanState, nc: Term) -> Term:
        return z3.BoolVal(True)


SPAN_VARIANTS = (
    Variant(
        "chunk-splits-span",
        "SPAN-LIMIT",
        "continue_prefill",
        "dropped conjunct",
        "chunk_end ignores the spans",
        ChunkSplitsSpan,
    ),
    Variant(
        "chunk-cut-forward-always",
        "SPAN-CHUNK",
        "continue_prefill",
        "broken transition",
        "a chunk ending inside a span always runs on to the span's end",
        CutForwardAlways,
    ),
    Variant(
        "chunk-cut-back-always",
        "CHUNK-END",
        "admit",
        "broken transition",
        "a chunk starting at a span is cut back to its start: an empty chunk",
        CutBackAlways,
    ),
    Variant(
        "append-ignores-spans",
        "SPLIT-REFUSED",
        "append",
        "dropped conjunct",
        "check_growth does not look at the spans",
        AppendIgnoresSpans,
    ),
    Variant(
        "append-ignores-spans-state",
        "SPAN-LIMIT",
        "append",
        "dropped conjunct",
        "check_growth does not look at the spans (the invariant breaks too)",
        AppendIgnoresSpans,
    ),
    Variant(
        "rollback-ignores-spans",
        "SPAN-LIMIT",
        "rollback",
        "dropped conjunct",
        "rollback may land inside a span",
        RollbackIgnoresSpans,
    ),
    Variant(
        "clamp-once",
        "MATCH-CLAMP",
        "admit",
        "broken transition",
        "the clamp moves back once instead of looping",
        ClampOnce,
    ),
    Variant(
        "window-not-reclamped",
        "SPAN-MATCH",
        "admit",
        "dropped conjunct",
        "the prefix left after the window is not clamped again",
        WindowNotReclamped,
    ),
    Variant(
        "commit-past-reserved",
        "SPAN-SHAPE",
        "commit",
        "dropped conjunct",
        "a commit may compute past the reserved tokens",
        CommitPastReserved,
    ),
    Variant(
        "clamp-one-block-short",
        "MATCH-CLAMP",
        "admit",
        "off-by-one",
        "the clamp goes back one block before the span's start block (not maximal)",
        ClampToSpanStartBlock,
    ),
)
