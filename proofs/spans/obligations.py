"""The span model's proof obligations: each state invariant inductive over every operation,
the step facts (MATCH-CLAMP, CHUNK-END), the refusal SPLIT-REFUSED, and a witness scenario
per operation (non-vacuity). :class:`SpanModel` is the whole model that ``prove`` runs
(:mod:`prefixkv.proofs.small` proves what it states)."""

from __future__ import annotations

from collections.abc import Sequence

import z3

from ..small import Obligation, ScenarioWitnesses, any_of
from ..terms import Term
from .model import (
    REFUSAL_IDS,
    SPAN_OPERATIONS,
    STATE_IDS,
    STEP_IDS,
    AdmitArgs,
    Args,
    CommitArgs,
    ContinueArgs,
    CountArgs,
    SpanState,
    Step,
)
from .transitions import SpanTransitions

__all__ = ["SpanModel"]


class SpanModel(SpanTransitions, ScenarioWitnesses):
    """The span-relevant part of ``SpecCache`` for one sequence (:mod:`.model`), with its
    obligations and witness scenarios."""

    name = "spans"

    def _ops(self, ops: Sequence[str] | None) -> list[str]:
        return [o for o in SPAN_OPERATIONS if ops is None or o in ops]

    def obligations(self, ops: Sequence[str] | None = None) -> list[Obligation]:
        out: list[Obligation] = []
        for op in self._ops(ops):
            if op == "init":
                init = self.init_state()
                invs = self.invariants(init)
                show0 = self.shower(init, None, None, None)
                out += [Obligation(p, op, "state", self.BS >= 1, invs[p], show0) for p in STATE_IDS]
                continue
            pre = self.fresh("p.")
            a = self.fresh_args(op)
            stp = self.step(op, pre, a)
            hyp = z3.And(self.inv(pre), stp.guard)
            post = self.invariants(stp.post)
            show = self.shower(pre, op, a, stp.post)
            out += [Obligation(p, op, "state", hyp, post[p], show) for p in STATE_IDS]
            out += [
                Obligation(p, op, "step", hyp, stp.facts[p], show)
                for p, where in STEP_IDS.items()
                if op in where
            ]
            if op in REFUSAL_IDS["SPLIT-REFUSED"] and isinstance(a, CountArgs):
                refusal = z3.And(self.inv(pre), self.splits(pre, op, a))
                out.append(
                    Obligation("SPLIT-REFUSED", op, "refusal", refusal, z3.Not(stp.guard), show)
                )
        return out

    def scenario(self, op: str, x: SpanState, a: Args, stp: Step) -> tuple[str, Term]:
        two = z3.And(x.on[0], x.on[1]) if self.K >= 2 else x.on[0]
        if op == "admit" and isinstance(a, AdmitArgs):
            k1 = self.clamp(a.m, a.on, a.st, a.en)
            two_req = z3.And(a.on[0], a.on[1]) if self.K >= 2 else a.on[0]
            start = stp.post.C
            plain = self.plain_end(start, a.P, a.nn, a.L)
            moved = any_of(
                [z3.And(a.on[i], a.st[i] == start, plain < a.en[i]) for i in range(self.K)]
            )
            return (
                "two spans; the clamp cuts the match back twice; the chunk starts at a span and "
                "runs on to its end",
                z3.And(
                    two_req,
                    k1 < a.m,
                    self.clamp_rounds(a) == 2,
                    a.L > 0,
                    moved,
                    stp.post.R < a.P,
                ),
            )
        if op == "continue_prefill":
            return (
                "the chunk's end moves back to a span's start",
                z3.And(
                    two,
                    x.L > 0,
                    any_of([x.st[i] == stp.post.R for i in range(self.K)]),
                    stp.post.R < x.R + x.L,
                ),
            )
        at_start = any_of([x.st[i] == stp.post.R for i in range(self.K)])
        if op == "append":
            return (
                "a prompt with two spans grows up to a span's start",
                z3.And(two, stp.post.R < x.P, at_start),
            )
        if op == "rollback":
            at_end = any_of([z3.And(x.en[i] == stp.post.R, x.st[i] < x.C) for i in range(self.K)])
            return (
                "decode rolls back into the prompt, to a span's end",
                z3.And(two, x.R > x.P, at_end),
            )
        if op == "commit":
            return ("the prompt's last chunk is committed", z3.And(two, stp.post.C == x.P))
        return ("a sequence with two spans is freed", two)

    def clamp_rounds(self, a: AdmitArgs) -> Term:
        """How many rounds of the clamp loop moved the match (for the witness)."""
        k, n = a.m, z3.IntVal(0)
        for _ in range(self.K):
            nk = self.clamp_once(k, a)
            n = n + z3.If(nk != k, 1, 0)
            k = nk
        return n

    def clamp_once(self, k: Term, a: AdmitArgs) -> Term:
        pos = self.times_bs(k)
        nk = k
        for i in reversed(range(self.K)):
            nk = z3.If(
                z3.And(a.on[i], a.st[i] < pos, pos < a.en[i]), self.blocks_below(a.st[i]), nk
            )
        return nk

    # -- display ----------------------------------------------------------------------------

    def shower(self, pre: SpanState, op: str | None, a: Args, post: SpanState | None) -> Term:
        def show(ev: Term) -> str:
            lines = [f"  BS={ev(self.BS)}", f"  pre:  {self.format(pre, ev)}"]
            if op is not None:
                lines.append(f"  step: {op}({self.format_args(a, ev)})")
            if post is not None and op is not None:
                lines.append(f"  post: {self.format(post, ev)}")
            return "\n".join(lines)

        return show

    def format(self, x: SpanState, ev: Term) -> str:
        spans = [
            f"[{ev(x.st[i])}, {ev(x.en[i])})" for i in range(self.K) if z3.is_true(ev(x.on[i]))
        ]
        return (
            f"live={ev(x.live)} P={ev(x.P)} L={ev(x.L)} spans={' '.join(spans) or '-'} "
            f"R={ev(x.R)} C={ev(x.C)} Ca={ev(x.Ca)} T={ev(x.T)}"
        )

    def format_args(self, a: Args, ev: Term) -> str:
        if isinstance(a, AdmitArgs):
            spans = [
                f"[{ev(a.st[i])}, {ev(a.en[i])})" for i in range(self.K) if z3.is_true(ev(a.on[i]))
            ]
            return (
                f"P={ev(a.P)}, L={ev(a.L)}, spans={' '.join(spans) or '-'}, raw match "
                f"{ev(a.m)} blocks, recompute_blocks={ev(a.rb)}, num_new_tokens={ev(a.nn)}"
            )
        if isinstance(a, ContinueArgs):
            return f"num_new_tokens={ev(a.nn)}"
        if isinstance(a, CountArgs):
            return f"num_tokens={ev(a.n)}"
        if isinstance(a, CommitArgs):
            return f"num_computed={ev(a.n)}, accepted={ev(a.acc)}"
        return ""
