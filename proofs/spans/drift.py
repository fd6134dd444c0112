"""No drift between the span model (:mod:`.obligations`) and :class:`~prefixkv.spec.SpecCache`.

Random runs of the executable spec with prompts of one or two multimodal spans, chunked
under a ``kv_token_limit`` or not, with recompute windows, appends and rollbacks around the
spans. Each step abstracts the touched sequence (its request and counters) to the model's
state, reads admission's raw match off the spec's own :meth:`SpecCache.match` (the blocks
the index verified before the span clamp: attached + window + the span loss), and builds the
model's transition on those concrete values. The model's guard must hold exactly when the
spec accepts, and its successor must be the spec's. A rejection for blocks (``OutOfBlocks``)
is the main encoding's business and is only counted. Every reachable live sequence must
satisfy the model's invariants and the spec's ``invariants.check``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import z3
from prefixkv.spec import (
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    PrefixCacheError,
    Request,
    SpecCache,
    invariants,
)
from prefixkv.spec.state import SeqView

from ..driver import DriftError, Substituter, drive
from .model import SPAN_OPERATIONS, AdmitArgs, CommitArgs, ContinueArgs, CountArgs, SpanState
from .obligations import SpanModel

__all__ = ["SpanDriftReport", "run_span_drift"]

NS = Namespace("span-proofs@1")
BS = 2
SEQ_IDS = ("s0", "s1", "s2")


def _fields(x: SpanState) -> list[z3.ExprRef]:
    return [x.live, x.P, x.L, *x.on, *x.st, *x.en, x.R, x.C, x.Ca, x.T]


def _values(v: SeqView | None, K: int) -> list[int | bool]:
    """The model's state of one sequence, in :func:`_fields` order (a dead slot when
    ``v`` is None)."""
    if v is None:
        return [False, 1, 0, *[False] * K, *[0] * (2 * K), 0, 0, 0, 1]
    spans = list(v.spans) + [(0, 0)] * (K - len(v.spans))
    return [
        True,
        v.num_prompt_tokens,
        v.kv_token_limit or 0,
        *[i < len(v.spans) for i in range(K)],
        *[s for s, _ in spans],
        *[e for _, e in spans],
        v.num_reserved,
        v.num_computed,
        v.num_cached_tokens,
        len(v.token_ids),
    ]


def _norm(vals: list[int | bool], K: int) -> tuple[int | bool, ...]:
    """What the spec's state determines: a dead slot is only 'not live', and unused span
    slots do not count."""
    if not vals[0]:
        return (False,)
    on, st, en = vals[3 : 3 + K], vals[3 + K : 3 + 2 * K], vals[3 + 2 * K : 3 + 3 * K]
    spans = [x for i in range(K) if on[i] for x in (st[i], en[i])]
    return (True, vals[1], vals[2], *spans, *vals[3 + 3 * K :])


def _value(x: z3.ExprRef) -> int | bool:
    if z3.is_true(x):
        return True
    if z3.is_false(x):
        return False
    if z3.is_int_value(x):
        return int(x.as_long())
    raise DriftError(f"the model left a term symbolic on concrete values: {x}")


class _Compiled:
    """One operation's transition, built once on fresh variables; each check substitutes
    the concrete pre-state and arguments (fast) instead of rebuilding the terms (slow)."""

    def __init__(self, m: SpanModel, op: str) -> None:
        self.pre = m.fresh("p.")
        self.args = m.fresh_args(op, "a.")
        stp = m.step(op, self.pre, self.args)
        self.pre_vars = _fields(self.pre)
        self.arg_vars: list[z3.ExprRef] = []
        a = self.args
        if isinstance(a, AdmitArgs):
            self.arg_vars = [a.P, a.L, *a.on, *a.st, *a.en, a.m, a.rb, a.nn]
        elif isinstance(a, ContinueArgs):
            self.arg_vars = [a.nn]
        elif isinstance(a, CountArgs):
            self.arg_vars = [a.n]
        elif isinstance(a, CommitArgs):
            self.arg_vars = [a.n, a.acc]
        splits = m.splits(self.pre, op, a) if isinstance(a, CountArgs) else z3.BoolVal(False)
        self.outputs = [stp.guard, splits, *_fields(stp.post)]
        self.sub = Substituter(self.pre_vars + self.arg_vars)

    def run(
        self, pre: list[int | bool], args: list[int | bool]
    ) -> tuple[bool, bool, list[int | bool]]:
        out = [_value(self.sub(t, pre + args)) for t in self.outputs]
        return bool(out[0]), bool(out[1]), out[2:]


class _InvCheck:
    def __init__(self, m: SpanModel) -> None:
        x = m.fresh("i.")
        self.invs = m.invariants(x)
        self.sub = Substituter(_fields(x))

    def failing(self, vals: list[int | bool]) -> list[str]:
        return [name for name, f in self.invs.items() if _value(self.sub(f, vals)) is not True]


@dataclass
class SpanDriftReport:
    checks: int = 0
    successes: int = 0
    rejections: int = 0
    out_of_blocks: int = 0
    invariant_checks: int = 0
    clamped: int = 0  # admissions whose match the span clamp cut
    chunk_cuts: int = 0  # chunks whose end a span moved
    split_refusals: int = 0  # appends/rollbacks refused for a span
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)


LAYOUTS: tuple[tuple[tuple[int, int], ...] | None, ...] = (
    None,
    None,
    (),
    ((1, 4),),
    ((2, 5),),
    ((1, 3), (3, 5)),  # a match of 2 blocks is clamped twice, back to 0
    ((1, 3), (3, 6)),
    ((0, 3), (3, 5)),
    ((2, 3), (3, 7)),
)
"""Span layouts that cross block boundaries (``BS`` 2), adjacent ones included: a clamp out
of the second span lands inside the first. ``None``: spans anywhere."""


def _request(rng: random.Random, seq_id: str, past: list[Request]) -> Request:
    """Prompts of 3 to 7 tokens from a small alphabet with zero to two spans whose content is
    one of two images (equal placeholders, other KV). Most repeat an earlier prompt, spans
    included, possibly longer, so that hits meet spans and the clamp has work to do."""
    if past and rng.random() < 0.7:
        old = rng.choice(past)
        extra = rng.randint(0, 7 - old.num_tokens)
        tokens = [*old.token_ids, *(rng.choice((1, 2)) for _ in range(extra))]
        spans = list(old.spans)
    else:
        n = rng.randint(3, 7)
        tokens = [rng.choice((1, 2)) for _ in range(n)]
        layout = rng.choice(LAYOUTS)
        if layout is None:  # anywhere
            cuts = sorted(rng.sample(range(n + 1), rng.choice((0, 2, 4))))
            layout = tuple(zip(cuts[::2], cuts[1::2], strict=True))
        spans = [
            MultimodalSpan(s, e, "image", rng.choice((b"cat", b"dog"))) for s, e in layout if e <= n
        ]
    longest = max((s.length for s in spans), default=1)
    limit = rng.choice((None, longest, longest + 1, longest + 2))
    return Request(
        seq_id,
        tokens,
        NS,
        spans=tuple(spans),
        recompute_blocks=rng.choice((0, 0, 1, 2)),
        kv_token_limit=limit,
    )


class _Runner:
    def __init__(
        self,
        model: SpanModel,
        rng: random.Random,
        report: SpanDriftReport,
        compiled: dict[str, _Compiled],
        inv: _InvCheck,
        *,
        check_states: bool = True,
    ) -> None:
        self.m, self.rng, self.r = model, rng, report
        self.check_states = check_states
        self.cache = SpecCache(num_blocks=10, block_size=BS)
        self.past: list[Request] = []
        self.compiled, self.inv = compiled, inv

    def view(self, seq_id: str) -> SeqView | None:
        for v in self.cache.snapshot().sequences:
            if v.seq_id == seq_id:
                return v
        return None

    def check_state(self) -> None:
        invariants.check(self.cache)
        for v in self.cache.snapshot().sequences:
            bad = self.inv.failing(_values(v, self.m.K))
            if bad:
                raise DriftError(f"the spec reached a state that breaks {', '.join(bad)}: {v}")
            self.r.invariant_checks += 1

    def step(self) -> None:
        if self.check_states:
            self.check_state()
        seq_id = self.rng.choice(SEQ_IDS)
        v = self.view(seq_id)
        op, args, call = self.draw(seq_id, v)
        guard, splits, post = self.compiled[op].run(_values(v, self.m.K), args)
        self.r.checks += 1
        self.r.by_op[op] = self.r.by_op.get(op, 0) + 1
        try:
            call()
        except OutOfBlocks:
            self.r.out_of_blocks += 1
            return
        except PrefixCacheError as e:
            self.r.rejections += 1
            if guard:
                raise DriftError(
                    f"the spec refused {op}{tuple(args)} on {v} ({type(e).__name__}: {e}) "
                    "but the model's guard holds"
                ) from None
            self.r.split_refusals += splits
            return
        self.r.successes += 1
        if not guard:
            raise DriftError(f"the spec accepted {op}{tuple(args)} on {v}; the model's guard fails")
        self.compare(seq_id, op, args, v, post)

    def draw(
        self, seq_id: str, v: SeqView | None
    ) -> tuple[str, list[int | bool], Callable[[], object]]:
        """A random operation on ``seq_id``: its name, the model's arguments, and the call
        that runs it on the spec."""
        rng = self.rng
        ops = ["admit"] if v is None else ["continue_prefill"] * 4 + ["append", "rollback"] * 2
        op = rng.choice([*ops, *["commit"] * 5 * (v is not None), "free", "admit"])
        if v is None and op == "free":
            op = "admit"
        if op == "admit":
            return (op, *self.draw_admit(seq_id))
        args: list[int | bool] = []
        call: Callable[[], object]
        if op == "continue_prefill":
            nn = rng.choice((None, 1, 2, 3))
            args = [nn or 0]

            def call() -> object:
                return self.cache.continue_prefill(seq_id, nn)

        elif op in ("append", "rollback"):
            n = rng.randint(1, 3)
            args = [n]
            grow = self.cache.append if op == "append" else self.cache.rollback

            def call() -> object:
                return grow(seq_id, n)

        elif op == "commit":
            assert v is not None
            room = v.num_reserved - v.num_computed
            n = rng.choice((room, room, rng.randint(0, room + 1)))
            acc = max(0, v.num_computed + n - len(v.token_ids)) + rng.choice((0, 0, 1))
            args = [n, acc]
            accepted = [1] * acc

            def call() -> object:
                self.cache.commit(seq_id, n, accepted)
                return None

        else:

            def call() -> object:
                self.cache.free([seq_id])
                return None

        return op, args, call

    def draw_admit(self, seq_id: str) -> tuple[list[int | bool], Callable[[], object]]:
        """A random request admitted as ``seq_id``; the model's arguments carry the raw match
        read off the spec's own :meth:`~prefixkv.spec.SpecCache.match`."""
        rng, K = self.rng, self.m.K
        req = _request(rng, seq_id, self.past)
        self.past.append(req)
        nn = rng.choice((None, 1, 2, 3, 5))
        match = self.cache.match(req)
        raw = match.num_blocks + match.num_window_blocks + match.lost.span // BS
        self.r.clamped += match.lost.span > 0
        pad = [(0, 1)] * (K - len(req.spans))
        bounds = [(s.start, s.end) for s in req.spans] + pad
        args: list[int | bool] = [
            req.num_tokens,
            req.kv_token_limit or 0,
            *[i < len(req.spans) for i in range(K)],
            *[s for s, _ in bounds],
            *[e for _, e in bounds],
            raw,
            req.recompute_blocks,
            nn or 0,
        ]

        def call() -> object:
            return self.cache.admit(req, nn)

        return args, call

    def compare(
        self,
        seq_id: str,
        op: str,
        args: list[int | bool],
        v: SeqView | None,
        post: list[int | bool],
    ) -> None:
        """The spec's successor of an accepted step must be the model's."""
        K = self.m.K
        after = self.view(seq_id)
        want, got = _norm(_values(after, K), K), _norm(post, K)
        if want != got:
            raise DriftError(f"{op}{tuple(args)} on {v}: the spec reached {want}, the model {got}")
        if op in ("admit", "continue_prefill") and after is not None:
            start = after.num_computed if op == "admit" else (v.num_reserved if v else 0)
            plain = min(
                after.num_prompt_tokens, start + (after.kv_token_limit or after.num_prompt_tokens)
            )
            self.r.chunk_cuts += any(s < plain < e for s, e in after.spans)


def run_span_drift(
    checks: int,
    seed: int = 0,
    model: type[SpanModel] = SpanModel,
    report: SpanDriftReport | None = None,
    *,
    check_states: bool = True,
) -> SpanDriftReport:
    """``checks`` model-vs-spec steps over fresh caches of 10 blocks (``BS`` 2); with
    ``check_states``, every state before a step is also checked against the invariants."""
    m = model(None, BS)
    compiled = {op: _Compiled(m, op) for op in SPAN_OPERATIONS if op != "init"}
    inv = _InvCheck(m)
    rep = report or SpanDriftReport()

    def start(rng: random.Random) -> _Runner:
        return _Runner(m, rng, rep, compiled, inv, check_states=check_states)

    return drive(rep, checks, lambda r: r.checks, start, seed=seed)
