"""The span model's transitions, one per ``SpecCache`` operation of one sequence: admit
(the clamp, the window, the first chunk), continue_prefill, append, rollback, commit, free;
and the spec's span raise sites (:meth:`SpanTransitions.splits`), apart from the guards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import z3

from ..small import all_of
from ..terms import Term
from .formulas import SpanFormulas
from .model import (
    AdmitArgs,
    Args,
    CommitArgs,
    ContinueArgs,
    CountArgs,
    SpanState,
    Step,
)

__all__ = ["SpanTransitions"]


class SpanTransitions(SpanFormulas):
    """One :class:`~.model.Step` per operation: its guard, post-state and step facts."""

    def admit(self, x: SpanState, a: AdmitArgs) -> Step:
        M = self.M
        on, st, en = a.on, a.st, a.en
        # the raw match: whatever the index verified, under the cap (choice 4)
        match_ok = z3.And(a.m >= 0, a.m <= M, self.times_bs(a.m) <= a.P - 1)
        k1 = self.clamp(a.m, on, st, en)  # choice 5
        window = z3.If(a.rb < k1, a.rb, k1)  # choice 6
        attached = self.reclamp(k1 - window, on, st, en)
        cached = self.times_bs(attached)
        end = self.chunk_end(cached, a.P, a.nn, a.L, on, st, en)
        guard = z3.And(
            z3.Not(x.live),
            self.wf_request(a.P, a.L, on, st, en),
            match_ok,
            a.rb >= 0,
            a.nn >= 0,
        )
        post = SpanState(z3.BoolVal(True), a.P, a.L, on, st, en, end, cached, cached, a.P)
        maximal = all_of(
            [
                z3.Implies(
                    z3.And(k1 < k, k <= a.m), self.inside(on, st, en, self.times_bs(z3.IntVal(k)))
                )
                for k in range(M + 1)
            ]
        )
        facts = {
            "MATCH-CLAMP": z3.And(
                attached >= 0,
                attached <= k1,
                k1 <= a.m,
                cached <= a.P - 1,
                z3.Not(self.inside(on, st, en, cached)),
                z3.Not(self.inside(on, st, en, self.times_bs(k1))),
                window == z3.If(a.rb < k1, a.rb, k1),
                maximal,
            ),
            "CHUNK-END": self.chunk_ok(cached, end, a.P, a.L, on, st, en),
        }
        return Step(guard, post, facts)

    def reclamp(self, k: Term, on: Sequence[Term], st: Sequence[Term], en: Sequence[Term]) -> Term:
        """After the window is cut off, the attached prefix is clamped again (the window's
        first block may start inside a span)."""
        return self.clamp(k, on, st, en)

    def chunk_ok(
        self,
        start: Term,
        end: Term,
        P: Term,
        L: Term,
        on: Sequence[Term],
        st: Sequence[Term],
        en: Sequence[Term],
    ) -> Term:
        return z3.And(
            start < end,
            end <= P,
            z3.Not(self.inside(on, st, en, end)),
            z3.Implies(L > 0, end - start <= L),
        )

    def continue_prefill(self, x: SpanState, a: ContinueArgs) -> Step:
        end = self.chunk_end(x.R, x.P, a.nn, x.L, x.on, x.st, x.en)
        guard = z3.And(x.live, a.nn >= 0, x.R < x.P, x.C == x.R)
        facts = {"CHUNK-END": self.chunk_ok(x.R, end, x.P, x.L, x.on, x.st, x.en)}
        return Step(guard, replace(x, R=end), facts)

    def growth_ok(self, x: SpanState, nr: Term) -> Term:
        """``check_growth``: only while the prompt is not fully reserved."""
        return z3.Or(
            x.R >= x.P,
            z3.And(
                z3.Or(x.L == 0, nr - x.C <= x.L),
                z3.Not(self.inside(x.on, x.st, x.en, nr)),
            ),
        )

    def append(self, x: SpanState, a: CountArgs) -> Step:
        nr = x.R + a.n
        return Step(z3.And(x.live, a.n >= 1, self.growth_ok(x, nr)), replace(x, R=nr), {})

    def rollback_ok(self, x: SpanState, nr: Term) -> Term:
        return z3.Not(self.inside(x.on, x.st, x.en, nr))

    def rollback(self, x: SpanState, a: CountArgs) -> Step:
        nr = x.R - a.n
        guard = z3.And(x.live, a.n >= 1, nr >= x.C, self.rollback_ok(x, nr))
        return Step(guard, replace(x, R=nr), {})

    def commit(self, x: SpanState, a: CommitArgs) -> Step:
        nc = x.C + a.n
        guard = z3.And(x.live, a.n >= 0, a.acc >= 0, self.within_reserved(x, nc), nc <= x.T + a.acc)
        return Step(guard, replace(x, C=nc, T=x.T + a.acc), {})

    def within_reserved(self, x: SpanState, nc: Term) -> Term:
        return nc <= x.R

    def free(self, x: SpanState) -> Step:
        return Step(x.live, replace(x, live=z3.BoolVal(False)), {})

    def step(self, op: str, x: SpanState, a: Args) -> Step:
        if op == "admit" and isinstance(a, AdmitArgs):
            return self.admit(x, a)
        if op == "continue_prefill" and isinstance(a, ContinueArgs):
            return self.continue_prefill(x, a)
        if op == "append" and isinstance(a, CountArgs):
            return self.append(x, a)
        if op == "rollback" and isinstance(a, CountArgs):
            return self.rollback(x, a)
        if op == "commit" and isinstance(a, CommitArgs):
            return self.commit(x, a)
        if op == "free":
            return self.free(x)
        raise ValueError(f"no span step {op!r} with {a!r}")

    def splits(self, x: SpanState, op: str, a: CountArgs) -> Term:
        """The spec's span raise sites, apart from the guard: ``check_growth`` raises when a
        prompt not fully reserved would be reserved up to the middle of a span;
        ``rollback`` raises when the new tail would be inside a span."""
        if op == "append":
            return z3.And(x.R < x.P, self.inside(x.on, x.st, x.en, x.R + a.n))
        return self.inside(x.on, x.st, x.en, x.R - a.n)

    def init_state(self) -> SpanState:
        z = z3.IntVal(0)
        f = z3.BoolVal(False)
        return SpanState(
            f, z3.IntVal(1), z, (f,) * self.K, (z,) * self.K, (z,) * self.K, z, z, z, z3.IntVal(1)
        )
