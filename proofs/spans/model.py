"""Multimodal spans in admission's match, the chunks and the tail: the state, the data
types and the spec's decision points (INV-LIMIT, INV-MATCH).


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
from dataclasses import dataclass

import z3

from ..small import all_of, any_of
from ..terms import Term

__all__ = [
    "REFUSAL_IDS",
    "SPAN_IDS",
    "SPAN_OPERATIONS",
    "STATE_IDS",
    "STEP_IDS",
    "AdmitArgs",
    "Args",
    "CommitArgs",
    "ContinueArgs",
    "CountArgs",
    "SpanBase",
    "SpanBounds",
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


class SpanBase:
    """The model's bounds, fresh terms and the spec's decision points (the clamp, the chunk
    end and its span cut), which the broken variants and seeded drifts override."""

    """The span-relevant part of ``SpecCache`` for one sequence (module doc)."""

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
