"""Seeded drifts of the KV model: encodings that still satisfy every invariant but no longer
describe the spec. The drift check (:mod:`.drift`) must catch each one; the invariant proofs
cannot, so a drift check that misses one is too weak.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from ..driver import SeededResult, seeded
from ..terms import Term
from .drift import DriftChecker, DriftReport, run_reachable
from .model import Bounds, ContinueArgs, Domain, OpArgs, SeqState, State
from .transitions import Encoding

__all__ = ["SEEDED_DRIFTS", "check_seeded"]


class _LifoQueue(Encoding):
    def allocate(self, st: State, need: Any) -> tuple[State, list[Any]]:
        taken = [st.q[st.qt - 1 - i] for i in range(self.bounds.table)]
        x = z3.Int("lam!x")
        hit = z3.Or([z3.And(i < need, b == x) for i, b in enumerate(taken)])
        return st.replace(rc=z3.Lambda([x], z3.If(hit, 1, st.rc[x])), qt=st.qt - need), taken

    def grow(self, d: Domain, st: State, s: int, n: Any) -> Any:
        step = super().grow(d, st, s, n)
        sq, post = st.seqs[s], step.post
        tab = tuple(
            z3.If(
                j < sq.len,
                sq.tab[j],
                z3.If(j < post.seqs[s].len, st.q[st.qt - 1 - (j - sq.len)], sq.tab[j]),
            )
            for j in range(self.bounds.table)
        )
        return type(step)(
            step.op, step.enabled, step.bounded, step.choice, post.seq(s, tab=tab), step.args
        )


class _NewestFirstEviction(Encoding):
    def evict_order_before(self, st: State, a: Any, b: Any) -> Any:
        return z3.Or(st.lu[a] > st.lu[b], z3.And(st.lu[a] == st.lu[b], a <= b))


class _FullPromptHit(Encoding):
    def within_cap(self, BS: Any, j: int, ntok: Any) -> Any:
        return (j + 1) * BS <= ntok


class _HeadFirstRelease(Encoding):
    def free_seqs(self, st: State, freed: Sequence[Any]) -> State:
        post = self.release_all(
            st.replace(clock=st.clock + 1),
            [
                (sq.tab[j], z3.And(f, j < sq.len))
                for f, sq in zip(freed, st.seqs, strict=True)
                for j in range(self.bounds.table)
            ],
        )
        for s, f in enumerate(freed):
            post = post.seq(s, live=z3.And(st.seqs[s].live, z3.Not(f)))
        return post


class _FreeKeepsClock(Encoding):
    def free_seqs(self, st: State, freed: Sequence[Any]) -> State:
        return super().free_seqs(st, freed).replace(clock=st.clock)


class _PublishFirstOnly(Encoding):
    def newly_committed(self, BS: Any, j: int, sq: Any, new_nc: Any, ntok: Any) -> Any:
        first = z3.And((j + 1) * BS > sq.nc, j * BS <= sq.nc)
        return z3.And(first, (j + 1) * BS <= new_nc)


class _WindowIgnored(Encoding):
    def window_size(self, rb: Any, m: Any) -> Any:
        return z3.IntVal(0)


class _WindowNotClamped(Encoding):
    def window_size(self, rb: Any, m: Any) -> Any:
        return rb


class _ChunkIgnoresLimit(Encoding):
    def chunk_size(self, remaining: Any, whole: Any, num_new: Any, limit: Any) -> Any:
        return super().chunk_size(remaining, whole, num_new, z3.IntVal(0))


class _ContinueBeforeCommit(Encoding):
    def continue_guard(self, sq: SeqState, a: ContinueArgs) -> Term:
        return z3.And(sq.live, z3.Or(a.whole, a.num_new >= 1), sq.nr < sq.np)


class _ErrorClassSwapped(Encoding):
    def refusals(self, d: Domain, st: State, op: str, a: OpArgs, s: int) -> list[tuple[str, Term]]:
        out = super().refusals(d, st, op, a, s)
        if op != "rollback":
            return out
        # DRIFT: an unwritten-slot shortfall is labelled a bad argument, not a bad operation
        swap = {"InvalidOperation": "InvalidRequest", "InvalidRequest": "InvalidOperation"}
        return [(swap.get(cls, cls), cond) for cls, cond in out]


SEEDED_DRIFTS: tuple[tuple[str, str, type[Encoding]], ...] = (
    ("lifo-free-queue", "allocation takes the most recently freed block (LIFO)", _LifoQueue),
    ("newest-first-eviction", "eviction picks the most recently used leaf", _NewestFirstEviction),
    ("full-prompt-hit", "the match is not capped: a whole cached prompt is a hit", _FullPromptHit),
    (
        "head-first-release",
        "a freed table is released head first, not tail first",
        _HeadFirstRelease,
    ),
    ("free-keeps-clock", "free() does not advance the eviction clock", _FreeKeepsClock),
    ("publish-first-only", "commit publishes only the first block it completes", _PublishFirstOnly),
    (
        "window-ignored",
        "admission ignores recompute_blocks: the whole match is attached",
        _WindowIgnored,
    ),
    (
        "window-not-clamped",
        "the window is recompute_blocks even beyond the match",
        _WindowNotClamped,
    ),
    ("chunk-ignores-limit", "a prefill chunk is not cut at kv_token_limit", _ChunkIgnoresLimit),
    (
        "continue-before-commit",
        "continue_prefill does not wait for the chunk's commit",
        _ContinueBeforeCommit,
    ),
    (
        "error-class-swapped",
        "rollback's refusals carry each other's error class (INV-TXN's classes drift)",
        _ErrorClassSwapped,
    ),
)


def check_seeded(
    name: str,
    description: str,
    enc_type: type[Encoding],
    *,
    budget: int = 4_000,
    seed: int = 0,
    bounds: Bounds | None = None,
) -> SeededResult:
    """Run the reachable-state drift check on a mutated encoding until it fails."""
    enc = enc_type(bounds or Bounds())
    checker = DriftChecker(enc, 5)
    return seeded(
        name,
        description,
        DriftReport(),
        lambda r: r.checks,
        lambda r: run_reachable(enc, budget, seed=seed, checker=checker, report=r),
        counts_the_catch=True,
    )
