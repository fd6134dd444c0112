"""Multimodal spans in admission's match, the chunks and the tail (INV-LIMIT, INV-MATCH).

A span's KV attends to the span's own earlier positions, so half a span is never a
reusable prefix and never a chunk on its own (choices 5 and 8). The main encoding
(:mod:`.transitions`) proves the pool, the index and the lookup's one-span clamp; this model
proves what spans change in one sequence's life, with several spans per prompt:

* admission's match is clamped out of every span (``clamp_out_of_spans``, a loop), before
  and after the recompute window is cut off, and is the *largest* such prefix of the raw
  match;
* every prefill chunk (``chunk_end``, of ``admit`` and ``continue_prefill``) ends at a span
  boundary, makes progress, and stays within ``kv_token_limit``;
* ``append`` (``check_growth``) and ``rollback`` refuse to reserve up to the middle of a
  span: the refusal is written apart from the guard, as the spec's raise sites, and proved
  to disable the step.

::

    state    the sequence's request: prompt_len P, kv_token_limit L (0 = None), spans
             (K slots of on/start/end: sorted, disjoint, inside the prompt, none longer
             than L) and its counters: live, num_reserved R, num_computed C,
             num_cached Ca, known tokens T. BS is one symbolic block size.
    admit    args: a raw match of m blocks (any m up to the cap: whatever the index held),
             recompute_blocks, the step budget (0 = None)

Sequences do not interact through spans, so one sequence slot is the whole model; the pool,
the index and OutOfBlocks are the main encoding's (a refusal for blocks is a stutter). Block
counts are at most ``match_blocks`` (default 3), so every product with ``BS`` is unrolled
and linear; positions, lengths and the limit are unbounded integers.

The invariants (``SPAN-*`` rows of ``prove --json``):

* SPAN-LIMIT (INV-LIMIT's span part, ``spec.invariants._inv_limit``): while prefilling
  (``R <= P`` and ``C < P``), ``R`` is not strictly inside a span;
* SPAN-CHUNK (INV-LIMIT's chunk form, with the span cut): while ``C < P``,
  ``min(R, P) - C <= L``;
* SPAN-MATCH (INV-MATCH's state part, ``_inv_match_state``): the cached prefix ``Ca`` is not
  strictly inside a span;
* SPAN-SHAPE: ``0 <= Ca <= C <= R``, ``C <= T``, ``1 <= P <= T``, a well-formed request.

Step facts: MATCH-CLAMP (admit: the attached prefix is block aligned, ends outside every
span, leaves a token to compute, and the clamp is maximal), CHUNK-END (admit and
continue_prefill: the chunk ends at a span boundary, after its start, within the prompt and
the limit) and SPLIT-REFUSED (append and rollback: the spec's span raise disables the step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import z3

from ..small import Obligation, ScenarioWitnesses, Variant, all_of, any_of
from ..terms import Term

__all__ = [
    "SPAN_IDS",
    "SPAN_OPERATIONS",
    "SPAN_VARIANTS",
    "AdmitArgs",
    "CommitArgs",
    "ContinueArgs",
    "CountArgs",
    "SpanBounds",
    "SpanModel",
    "SpanState",
    "Step",
]


SPAN_OPERATIONS = ("init", "admit", "continue_prefill", "append", "commit", "rollback", "free")
STATE_IDS = ("SPAN-LIMIT", "SPAN-CHUNK", "SPAN-MATCH", "SPAN-SHAPE")
STEP_IDS = {"MATCH-CLAMP": ("admit",), "CHUNK-END": ("admit", "continue_prefill")}
REFUSAL_IDS = {"SPLIT-REFUSED": ("append", "rollback")}
SPAN_IDS = (*STATE_IDS, *STEP_IDS, *REFUSAL_IDS)


@dataclass(frozen=True)
class SpanBounds:
    spans: int = 2  # span slots per prompt
    match_blocks: int = 3  # the largest raw match, in blocks

    def describe(self) -> str:
        return f"{self.spans} spans per prompt, matches of up to {self.match_blocks} blocks"


@dataclass(frozen=True)
class SpanState:
    """One sequence and its request. Every field is a Z3 term (concrete ones for drift)."""

    live: Term
    P: Term
    L: Term
    on: tuple[Term, ...]
    st: tuple[Term, ...]
    en: tuple[Term, ...]
    R: Term
    C: Term
    Ca: Term
    T: Term


@dataclass(frozen=True)
class AdmitArgs:
    """``admit(req, num_new_tokens)``: the request, the raw match ``m`` (the blocks the
    index verified, under the cap, before the span clamp), ``recompute_blocks`` and the step
    budget ``nn`` (0 = None)."""

    P: Term
    L: Term
    on: tuple[Term, ...]
    st: tuple[Term, ...]
    en: tuple[Term, ...]
    m: Term
    rb: Term
    nn: Term


@dataclass(frozen=True)
class ContinueArgs:
    nn: Term  # the step budget, 0 = None


@dataclass(frozen=True)
class CountArgs:
    n: Term  # append's or rollback's num_tokens


@dataclass(frozen=True)
class CommitArgs:
    n: Term
    acc: Term  # number of accepted tokens


Args = AdmitArgs | ContinueArgs | CountArgs | CommitArgs | None


@dataclass(frozen=True)
class Step:
    guard: Term
    post: SpanState
    facts: dict[str, Term]


class SpanModel(ScenarioWitnesses):
    """The span-relevant part of ``SpecCache`` for one sequence (module doc)."""

    name = "spans"

    def __init__(self, bounds: SpanBounds | None = None, block_size: int | None = None) -> None:
        self.b = bounds or SpanBounds()
        self.K, self.M = self.b.spans, self.b.match_blocks
        # symbolic for the proofs; a concrete block size for the drift check
        self.BS: Term = z3.Int("BS") if block_size is None else z3.IntVal(block_size)

    def describe(self) -> str:
        return self.b.describe()

    # -- terms ------------------------------------------------------------------------------

    def fresh(self, p: str) -> SpanState:
        K = range(self.K)
        return SpanState(
            z3.Bool(f"{p}live"),
            z3.Int(f"{p}P"),
            z3.Int(f"{p}L"),
            tuple(z3.Bool(f"{p}on{i}") for i in K),
            tuple(z3.Int(f"{p}st{i}") for i in K),
            tuple(z3.Int(f"{p}en{i}") for i in K),
            z3.Int(f"{p}R"),
            z3.Int(f"{p}C"),
            z3.Int(f"{p}Ca"),
            z3.Int(f"{p}T"),
        )

    def fresh_args(self, op: str, p: str = "a.") -> Args:
        K = range(self.K)
        if op == "admit":
            return AdmitArgs(
                z3.Int(f"{p}P"),
                z3.Int(f"{p}L"),
                tuple(z3.Bool(f"{p}on{i}") for i in K),
                tuple(z3.Int(f"{p}st{i}") for i in K),
                tuple(z3.Int(f"{p}en{i}") for i in K),
                z3.Int(f"{p}m"),
                z3.Int(f"{p}rb"),
                z3.Int(f"{p}nn"),
            )
        if op == "continue_prefill":
            return ContinueArgs(z3.Int(f"{p}nn"))
        if op in ("append", "rollback"):
            return CountArgs(z3.Int(f"{p}n"))
        if op == "commit":
            return CommitArgs(z3.Int(f"{p}n"), z3.Int(f"{p}acc"))
        return None

    def times_bs(self, k: Term) -> Term:
        """``k * BS`` for ``0 <= k <= M``, unrolled (linear in a symbolic ``BS``)."""
        return z3.Sum([z3.If(k > j, self.BS, 0) for j in range(self.M)])

    def blocks_below(self, x: Term) -> Term:
        """``x // BS`` for ``0 <= x < M * BS``: the number of block ends at or before x."""
        return z3.Sum([z3.If(j * self.BS <= x, 1, 0) for j in range(1, self.M + 1)])

    def inside(self, on: Sequence[Term], st: Sequence[Term], en: Sequence[Term], x: Term) -> Term:
        """``span_containing(spans, x) is not None``: x strictly inside some span."""
        return any_of([z3.And(on[i], st[i] < x, x < en[i]) for i in range(self.K)])

    def wf_request(
        self, P: Term, L: Term, on: Sequence[Term], st: Sequence[Term], en: Sequence[Term]
    ) -> Term:
        """What ``Request`` accepts: spans sorted, disjoint, non-empty, inside the prompt,
        none longer than the limit; the used span slots come first."""
        K = self.K
        cs = [P >= 1, L >= 0]
        for i in range(K):
            cs.append(z3.Implies(on[i], z3.And(st[i] >= 0, st[i] < en[i], en[i] <= P)))
            cs.append(z3.Implies(z3.And(on[i], L > 0), en[i] - st[i] <= L))
            if i + 1 < K:
                cs.append(z3.Implies(on[i + 1], z3.And(on[i], en[i] <= st[i + 1])))
        return all_of(cs)

    def clamp(self, k: Term, on: Sequence[Term], st: Sequence[Term], en: Sequence[Term]) -> Term:
        """``clamp_out_of_spans(k, spans, BS)``: while ``k * BS`` is inside a span, go back
        to ``span.start // BS`` blocks. Each round moves before one more span, so K rounds
        are the whole loop (MATCH-CLAMP proves the result is outside every span)."""
        for _ in range(self.K):
            pos = self.times_bs(k)
            nk = k
            for i in reversed(range(self.K)):
                nk = z3.If(z3.And(on[i], st[i] < pos, pos < en[i]), self.blocks_below(st[i]), nk)
            k = nk
        return k

    def chunk_end(
        self,
        start: Term,
        P: Term,
        nn: Term,
        L: Term,
        on: Sequence[Term],
        st: Sequence[Term],
        en: Sequence[Term],
    ) -> Term:
        """``spec.cache.chunk_end``: at most the budget and the limit; an end inside a span
        moves back to the span's start, or forward to its end when the chunk starts there."""
        end = self.plain_end(start, P, nn, L)
        out = end
        for i in reversed(range(self.K)):
            out = z3.If(
                z3.And(on[i], st[i] < end, end < en[i]), self.span_cut(start, st[i], en[i]), out
            )
        return out

    def plain_end(self, start: Term, P: Term, nn: Term, L: Term) -> Term:
        """The chunk's end before the span cut: the prompt, the budget, the limit."""
        end = z3.If(z3.And(nn > 0, start + nn < P), start + nn, P)
        return z3.If(z3.And(L > 0, start + L < end), start + L, end)

    def span_cut(self, start: Term, s: Term, e: Term) -> Term:
        return z3.If(s > start, s, e)

    # -- invariants -------------------------------------------------------------------------

    def invariants(self, x: SpanState) -> dict[str, Term]:
        prefilling = z3.And(x.R <= x.P, x.C < x.P)
        return {
            "SPAN-LIMIT": z3.Implies(
                z3.And(x.live, prefilling), z3.Not(self.inside(x.on, x.st, x.en, x.R))
            ),
            "SPAN-CHUNK": z3.Implies(
                z3.And(x.live, x.C < x.P, x.L > 0), z3.If(x.R < x.P, x.R, x.P) - x.C <= x.L
            ),
            "SPAN-MATCH": z3.Implies(x.live, z3.Not(self.inside(x.on, x.st, x.en, x.Ca))),
            "SPAN-SHAPE": z3.And(
                self.BS >= 1,
                z3.Implies(
                    x.live,
                    z3.And(
                        self.wf_request(x.P, x.L, x.on, x.st, x.en),
                        x.Ca >= 0,
                        x.Ca <= x.C,
                        x.C <= x.R,
                        x.C <= x.T,
                        x.P <= x.T,
                    ),
                ),
            ),
        }

    def inv(self, x: SpanState) -> Term:
        return all_of(list(self.invariants(x).values()))

    # -- transitions ------------------------------------------------------------------------

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

    # -- obligations ------------------------------------------------------------------------

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


# -- broken variants ------------------------------------------------------------------------


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
