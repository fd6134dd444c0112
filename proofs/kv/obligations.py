"""Proof obligations: every invariant is inductive over every operation.

One obligation per (invariant, operation). An operation is proved through its *proof
steps*: ``admit`` is ``attach ; evict* ; grow``, ``append`` and ``continue_prefill`` are
``evict* ; grow`` behind their own guards (that is literally how
:class:`~.transitions.Encoding` builds them), every other operation is one step.
A step obligation says::

    shape(pre) & Inv(pre) & enabled & bounded  ==>  I(post)

for one invariant ``I`` and the conjunction ``Inv`` of all invariants, including the
auxiliary ones (the strengthening: see :data:`STRENGTHENINGS`). Steps that act on one
sequence are proved for every slot. ``init`` is the obligation ``init(s) ==> I(s)``.

Two more properties have a row per operation. INV-MATCH: after every proof step, a
lookup of any prompt (any hash candidates, one multimodal span) returns only blocks of the
prompt's identity chain (:data:`MATCH`). INV-TXN: per operation and error class, the
failing precondition makes the call's outcome the pre-state (:data:`TXN`); the stutter is by
construction, the content is that each of the spec's raise sites disables the transition.

Each solver call has a fixed ``rlimit`` and ``random_seed``, so "proved" does not depend on
the machine's speed. Non-vacuity is checked per operation: the hypotheses of each step, and
of the whole operation together with an interesting scenario (a hit, an eviction, a block
released twice by one batch...), are satisfiable; the witness is a concrete state found in
a pool of a few blocks (a model of the concrete-domain formula is a model of the symbolic
one with ``N`` fixed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from prefixkv.spec.invariant_ids import InvariantId

from ..terms import BoolTerm, Evaluator, Term
from .concrete import format_state, model_reader, read
from .model import TXN_ERRORS, Bounds, Domain, EvictManyArgs, FreeArgs, OpArgs, Query, State, Step
from .transitions import Encoding

__all__ = [
    "DEFAULT_RLIMIT",
    "INVARIANT_IDS",
    "MATCH",
    "OPERATIONS",
    "POSTCONDITIONS",
    "PROPERTY_IDS",
    "STRENGTHENINGS",
    "TXN",
    "Counterexample",
    "Prover",
    "Row",
    "find_counterexample",
    "inductive_alone",
]

INVARIANT_IDS = (
    InvariantId.REF,
    InvariantId.PARTITION,
    InvariantId.INDEX,
    InvariantId.ANCESTOR,
    InvariantId.WRITE,
    InvariantId.PUBLISH,
    InvariantId.WINDOW,
    InvariantId.LIMIT,
    InvariantId.STATS,
    "AUX-CHAIN",
    "AUX-CHUNK",
)

OPERATIONS: dict[str, tuple[str, ...]] = {
    "init": ("init",),
    "admit": ("attach", "evict", "grow"),
    "append": ("evict", "grow"),
    "continue_prefill": ("evict", "grow"),
    "commit": ("commit",),
    "rollback": ("rollback",),
    "free": ("free",),
    "evict": ("evict",),
    "reset_keep": ("reset_keep",),
    "reset_full": ("reset_full",),
}
"""Spec operation -> the proof steps its transition is composed of."""

SLOT_STEPS = frozenset({"attach", "grow", "commit", "rollback"})

POSTCONDITIONS: dict[str, tuple[str, str]] = {InvariantId.MATCH: ("admit", "attach")}
"""Properties of one step's result rather than of states: id -> (operation, step). The
INV-MATCH row of ``admit`` proves this postcondition of ``attach`` besides the lookup."""

MATCH = InvariantId.MATCH
"""A lookup of *any* prompt, after every proof step, returns only blocks whose identity
chain is the prompt's prefix (:meth:`~.encoding.Encoding.lookup_ok`). Not a hypothesis of
the other obligations: it follows from them, and is proved, not assumed."""

TXN = InvariantId.TXN
"""Per operation and error class: under the failing precondition the operation's outcome
is the pre-state, every component and counter included (:meth:`~.encoding.Encoding.outcome`)."""

PROPERTY_IDS = (*INVARIANT_IDS, MATCH, TXN)
"""Everything the default run proves: the invariants, INV-MATCH, then INV-TXN."""

STRENGTHENINGS = {
    "AUX-CHAIN": "a published block at table position j is the canonical (indexed) block of "
    "the sequence's identity chain at j. INV-PUBLISH is not inductive over commit without "
    "it: a sequence whose block is a private duplicate publishes its next block under the "
    "canonical twin, and only AUX-CHAIN says the twin is what the table's previous block "
    "stands for (broken variant 'without-aux-chain')",
    "queue ghost": "INV-PARTITION carries a ghost position map: every queued block sits at its "
    "recorded position, every block's position is below the tail, and a position at or "
    "after the head means queued. This makes 'free' quantifier-free and the queue "
    "duplicate-free, so its length is the number of free blocks (broken variant "
    "'queue-without-ghost')",
    "AUX-CHUNK": "1 <= prompt_len <= known tokens, and while the prompt is not computed, "
    "min(num_reserved, prompt_len) - num_computed <= kv_token_limit. INV-LIMIT's chunk form "
    "is not inductive over rollback without it: decode growth reserves past the prompt, and "
    "rolling back into the prompt must land within the limit (broken variant "
    "'without-aux-chunk')",
    "conjunction": "every step obligation assumes all invariants in the pre-state: only "
    "INV-STATS is inductive alone (e.g. INV-REF needs INV-PARTITION because "
    "allocated blocks must have refcount 0, INV-WRITE needs INV-REF because a private block "
    "must not be shared; '--alone' prints a counterexample for every such case)",
}

DEFAULT_RLIMIT = 30_000_000
"""Resource limit of one solver call (Z3 ``rlimit`` units, machine-independent)."""


@dataclass
class Counterexample:
    """A concrete pre-state and step whose post-state breaks an invariant."""

    invariant: str
    step: str
    slot: int
    pre: str
    args: str
    post: str
    pool: int

    def __str__(self) -> str:
        return (
            f"{self.invariant} broken by {self.step} (slot {self.slot}) in a pool of "
            f"{self.pool} blocks\n-- pre-state --\n{self.pre}\n-- step --\n  {self.step}"
            f"({self.args})\n-- post-state --\n{self.post}"
        )


@dataclass
class StepResult:
    invariant: str
    step: str
    status: str  # proved / counterexample / unknown
    seconds: float
    rlimit_used: int
    detail: str = ""


@dataclass
class Witness:
    operation: str
    scenario: str
    status: str  # sat / unsat / unknown
    seconds: float
    state: str = ""


@dataclass
class Row:
    """One obligation (invariant, operation) of the report."""

    invariant: str
    operation: str
    status: str
    seconds: float
    steps: tuple[str, ...]
    rlimit_used: int
    non_vacuous: bool | None = None
    detail: str = ""
    kind: str = "state"
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "operation": self.operation,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "steps": list(self.steps),
            "rlimit_used": self.rlimit_used,
            "non_vacuous": self.non_vacuous,
            "detail": self.detail,
            "kind": self.kind,
        }


def _rlimit_count(s: z3.Solver) -> int:
    st = s.statistics()
    return int(st.get_key_value("rlimit count")) if "rlimit count" in st.keys() else 0  # noqa: SIM118


def _solver(rlimit: int, seed: int) -> z3.Solver:
    s = z3.Solver()
    s.set("rlimit", rlimit, "random_seed", seed)
    return s


def step_formula(
    enc: Encoding, d: Domain, pre: State, step: str, slot: int, prefix: str = "a."
) -> Step:
    args = enc.fresh_args(step, prefix)
    return enc.step(d, pre, step, args, slot)


def hypothesis(enc: Encoding, d: Domain, pre: State) -> z3.BoolRef:
    """What every step obligation assumes of its pre-state."""
    return z3.And(enc.shape(pre), enc.in_bounds(pre), *enc.invariants(d, pre).values())


def goal(
    enc: Encoding,
    d: Domain,
    pre: State,
    st: Step | None,
    slot: int,
    invariant: str,
    query: Query | None = None,
) -> Any:
    """What the obligation (invariant, step) requires after the step (``st`` None: init).
    INV-MATCH looks up ``query`` (fresh when None) in the successor."""
    post = pre if st is None else st.post
    if invariant == MATCH:
        g = enc.lookup_ok(d, post, query or enc.fresh_query("q."))
        if st is not None and st.op == "attach":  # and admission's own match (postcondition)
            g = z3.And(g, enc.inv_match(d, pre, st, slot))
        return g
    return enc.invariants(d, post)[invariant]


TXN_SLOT_OPS = frozenset({"admit", "append", "continue_prefill", "commit", "rollback"})
"""Operations on one sequence: INV-TXN is proved for every sequence slot."""


def txn_slots(enc: Encoding, op: str) -> range:
    return range(enc.bounds.seqs) if op in TXN_SLOT_OPS else range(1)


def txn_formula(
    enc: Encoding, d: Domain, pre: State, op: str, error: str, slot: int, prefix: str = "a."
) -> tuple[BoolTerm, BoolTerm, State, OpArgs]:
    """INV-TXN for (op, error class): ``(failing precondition, outcome == pre, outcome,
    args)``."""
    args = enc.fresh_args(op, prefix)
    fail = enc.failures(d, pre, op, args, slot)[error]
    out = enc.outcome(d, pre, op, args, slot)
    return fail, enc.same_state(out, pre), out, args


def format_args(args: OpArgs | Query | Mapping[str, Term], ev: Evaluator) -> str:
    """``name=value, ...`` of an operation's (or a query's) arguments in a solver model."""
    items = args.items() if isinstance(args, Mapping) else args._asdict().items()
    parts = []
    for name, v in items:
        if isinstance(v, str):
            parts.append(f"{name}={v}")
        elif isinstance(v, tuple):
            parts.append(f"{name}=[{', '.join(str(ev(x)) for x in v)}]")
        else:
            parts.append(f"{name}={ev(v)}")
    return ", ".join(parts)


def find_counterexample(
    enc: Encoding,
    invariant: str,
    step: str,
    *,
    max_pool: int = 5,
    seed: int = 0,
    slots: Iterable[int] | None = None,
) -> Counterexample | None:
    """A smallest concrete counterexample to (invariant, step), pools of 1..max_pool blocks."""
    if slots is not None:
        slot_list = list(slots)
    elif invariant == TXN:
        slot_list = list(txn_slots(enc, step))
    else:
        slot_list = list(range(enc.bounds.seqs)) if step in SLOT_STEPS else [0]
    for n in range(1, max_pool + 1):
        d = Domain(n)
        pre = enc.fresh_state(d, "")
        hyp = hypothesis(enc, d, pre)
        cases: list[tuple[int, BoolTerm, BoolTerm, State, Mapping[str, Term]]] = []
        query = enc.fresh_query("q.") if invariant == MATCH else None
        for slot in slot_list:
            if invariant == TXN:
                for error in TXN_ERRORS[step]:
                    fail, g, post, args = txn_formula(enc, d, pre, step, error, slot)
                    cases.append(
                        (slot, z3.And(hyp, fail), g, post, {"error": error, **args._asdict()})
                    )
            elif step == "init":
                cases.append(
                    (
                        slot,
                        enc.init_state(d, pre),
                        goal(enc, d, pre, None, 0, invariant, query),
                        pre,
                        {},
                    )
                )
            else:
                st = step_formula(enc, d, pre, step, slot)
                guard = z3.And(hyp, st.enabled, st.bounded)
                cases.append(
                    (
                        slot,
                        guard,
                        goal(enc, d, pre, st, slot, invariant, query),
                        st.post,
                        st.args._asdict(),
                    )
                )
        for slot, guard, g, post, shown in cases:
            s = z3.Solver()
            s.set("random_seed", seed)
            s.add(enc.shape(pre), guard, z3.Not(g))
            # prefer small numbers (readable); any counterexample will do otherwise
            if s.check(*_small_values(pre)) != z3.sat and s.check() != z3.sat:
                continue
            m = s.model()
            ev = model_reader(m)
            M = enc.bounds.table
            return Counterexample(
                invariant=invariant,
                step=step,
                slot=slot,
                pre=format_state(read(pre, ev, n, M)),
                args=format_args(shown, ev)
                + ("" if query is None else f") then lookup({format_args(query, ev)}"),
                post=format_state(read(post, ev, n, M)),
                pool=n,
            )
    return None


def inductive_alone(
    enc: Encoding, *, max_pool: int = 3, timeout_ms: int = 20_000
) -> dict[str, list[tuple[str, Counterexample]]]:
    """Which invariants are *not* inductive on their own, and over which steps.

    For each (invariant, step), search a pool of up to ``max_pool`` blocks for a state that
    satisfies that invariant alone (not the others) whose successor breaks it. Every hit is a
    reason the proofs assume the conjunction of all invariants (see :data:`STRENGTHENINGS`).
    """
    steps = [s for s in dict.fromkeys(x for v in OPERATIONS.values() for x in v) if s != "init"]
    found: dict[str, list[tuple[str, Counterexample]]] = {i: [] for i in INVARIANT_IDS}
    M = enc.bounds.table
    for n in range(1, max_pool + 1):
        d = Domain(n)
        pre = enc.fresh_state(d, "")
        inv = enc.invariants(d, pre)
        for step in steps:
            st = step_formula(enc, d, pre, step, 0)
            post = enc.invariants(d, st.post)
            for name in INVARIANT_IDS:
                if any(s == step for s, _ in found[name]):
                    continue
                s = z3.Solver()
                s.set("timeout", timeout_ms, "random_seed", 0)
                s.add(
                    enc.shape(pre),
                    enc.in_bounds(pre),
                    inv[name],
                    st.enabled,
                    st.bounded,
                    z3.Not(post[name]),
                )
                if s.check() != z3.sat:
                    continue
                ev = model_reader(s.model())
                found[name].append(
                    (
                        step,
                        Counterexample(
                            name,
                            step,
                            0,
                            format_state(read(pre, ev, n, M)),
                            format_args(st.args, ev),
                            format_state(read(st.post, ev, n, M)),
                            n,
                        ),
                    )
                )
    return found


def _small_values(st: State) -> list[Any]:
    """Readability hints for a concrete state: small numbers, labels from 0."""
    out = [st.BS <= 4]
    for name, v in st.leaves.items():
        if not z3.is_int(v):
            continue
        label = any(k in name for k in ("ns", "lab", "tok", "bns"))
        out.append(z3.And(v >= (0 if label else -2), v <= 12))
    return out


# -- non-vacuity scenarios -----------------------------------------------------------------


def _scenarios(enc: Encoding) -> dict[str, tuple[str, Callable[[State, Step], Any]]]:
    """Per operation: a scenario that exercises it, as a formula on (pre, transition)."""
    M = enc.bounds.table

    def admit(pre: State, st: Step) -> Any:
        sq = st.post.seqs[0]
        # a window block is allocated (fresh, private, still to be written)
        window = z3.Or([z3.And(j < sq.len, enc.in_window(pre.BS, sq, j)) for j in range(M)])
        return z3.And(sq.nc >= pre.BS, st.post.ctr["evictions"] > pre.ctr["evictions"], window)

    def append(pre: State, st: Step) -> Any:
        return st.post.ctr["evictions"] > pre.ctr["evictions"]

    def continue_prefill(pre: State, st: Step) -> Any:
        sq, sq2 = pre.seqs[0], st.post.seqs[0]
        # a resumed chunk cut by the limit, with part of the prompt still to reserve
        return z3.And(
            sq.nc > 0, sq.lim > 0, sq2.nr - sq.nr == sq.lim, sq2.nr < sq.np, sq2.len > sq.len
        )

    def commit(pre: State, st: Step) -> Any:
        sq, sq2 = pre.seqs[0], st.post.seqs[0]
        published = [z3.And(z3.Not(pre.pub[sq.tab[j]]), st.post.pub[sq.tab[j]]) for j in range(M)]
        stays_private = [
            z3.And(
                (j + 1) * pre.BS > sq.nc, (j + 1) * pre.BS <= sq2.nc, z3.Not(st.post.pub[sq.tab[j]])
            )
            for j in range(M)
        ]
        return z3.And(z3.Or(published), z3.Or(stays_private))

    def rollback(pre: State, st: Step) -> Any:
        return st.post.seqs[0].len < pre.seqs[0].len

    def free(pre: State, st: Step) -> Any:
        a, b = pre.seqs[0], pre.seqs[1]
        shared = z3.Or(
            [z3.And(j < a.len, i < b.len, a.tab[j] == b.tab[i]) for j in range(M) for i in range(M)]
        )
        assert isinstance(st.args, FreeArgs)
        return z3.And(st.args.freed[0], st.args.freed[1], shared)

    def evict(pre: State, st: Step) -> Any:
        assert isinstance(st.args, EvictManyArgs)
        v = st.args.victims[0]
        return z3.And(st.post.ctr["evictions"] > pre.ctr["evictions"], pre.par[v] >= 0)

    def reset_keep(pre: State, st: Step) -> Any:
        return z3.And(pre.seqs[0].live, pre.seqs[1].live)

    def reset_full(pre: State, st: Step) -> Any:
        return z3.Or([pre.pub[b] for b in range(2)])

    return {
        "admit": ("a hit of >= 1 block, a window block allocated and an eviction", admit),
        "append": ("an eviction to make room", append),
        "continue_prefill": (
            "a resumed chunk of kv_token_limit tokens, more to come",
            continue_prefill,
        ),
        "commit": ("one block published, one full block kept private (duplicate)", commit),
        "rollback": ("a block released", rollback),
        "free": ("two freed tables hold the same block", free),
        "evict": ("a non-root leaf evicted", evict),
        "reset_keep": ("two live sequences released", reset_keep),
        "reset_full": ("published blocks dropped", reset_full),
    }


class Prover:
    """Runs the obligations of an :class:`Encoding` (memoising shared proof steps)."""

    def __init__(
        self,
        enc: Encoding | None = None,
        *,
        rlimit: int = DEFAULT_RLIMIT,
        seed: int = 0,
        witness_pool: int = 4,
        txn_witness: bool = True,
    ) -> None:
        self.enc = enc or Encoding(Bounds())
        self.rlimit, self.seed, self.witness_pool = rlimit, seed, witness_pool
        self.txn_witness = txn_witness
        self.d = Domain(None)
        self.pre = self.enc.fresh_state(self.d, "")
        self._hyp = hypothesis(self.enc, self.d, self.pre)
        self._steps: dict[tuple[str, int], Step] = {}
        self._post_inv: dict[tuple[str, int], dict[str, Any]] = {}
        self._results: dict[tuple[str, str], StepResult] = {}

    def _step(self, step: str, slot: int) -> tuple[Step | None, dict[str, Any]]:
        key = (step, slot)
        if key not in self._post_inv:
            if step == "init":
                self._post_inv[key] = self.enc.invariants(self.d, self.pre)
            else:
                st = step_formula(self.enc, self.d, self.pre, step, slot)
                self._steps[key] = st
                self._post_inv[key] = self.enc.invariants(self.d, st.post)
        return self._steps.get(key), self._post_inv[key]

    def prove_step(self, invariant: str, step: str) -> StepResult:
        """Prove (invariant, step) for every slot the step can act on."""

        def negate(slot: int) -> Callable[[z3.Solver], None]:
            st, post_inv = self._step(step, slot)

            def add(s: z3.Solver) -> None:
                if st is None:  # init
                    s.add(self.enc.shape(self.pre), self.enc.init_state(self.d, self.pre))
                else:
                    s.add(self._hyp, st.enabled, st.bounded)
                if invariant in post_inv:
                    s.add(z3.Not(post_inv[invariant]))
                else:
                    s.add(z3.Not(goal(self.enc, self.d, self.pre, st, slot, invariant)))

            return add

        slots = range(self.enc.bounds.seqs) if step in SLOT_STEPS else range(1)
        return self._prove_slots((invariant, step), invariant, step, slots, negate, "")

    def prove_txn(self, op: str, error: str) -> StepResult:
        """INV-TXN for (op, error class), every slot the operation can act on."""

        def negate(slot: int) -> Callable[[z3.Solver], None]:
            fail, g, _, _ = txn_formula(self.enc, self.d, self.pre, op, error, slot)
            return lambda s: s.add(self._hyp, fail, z3.Not(g))

        slots = txn_slots(self.enc, op)
        return self._prove_slots((f"{TXN}:{error}", op), TXN, op, slots, negate, f"{error}, ")

    def _prove_slots(
        self,
        key: tuple[str, str],
        invariant: str,
        step: str,
        slots: Iterable[int],
        negate: Callable[[int], Callable[[z3.Solver], None]],
        where: str,
    ) -> StepResult:
        """The negated obligation is unsatisfiable for every slot (cached under ``key``).

        ``negate(slot)`` builds the step, then adds the negation to a fresh solver.
        NOTE: the step is built before the solver and the rest after it, always in that
        order: Z3's search, and so each row's ``rlimit_used``, depends on term order. If
        an obligation is not proved, a concrete counterexample in a small pool is a real
        one; Z3 often answers "unknown" rather than "sat" on the quantified formula.
        """
        if key in self._results:
            return self._results[key]
        t0 = time.perf_counter()
        status, used, detail = "proved", 0, ""
        for slot in slots:
            add = negate(slot)
            s = _solver(self.rlimit, self.seed)
            add(s)
            before = _rlimit_count(s)
            r = s.check()
            used = max(used, _rlimit_count(s) - before)
            if r == z3.unsat:
                continue
            cex = find_counterexample(self.enc, invariant, step, slots=[slot], max_pool=4)
            if cex is not None:
                status, detail = "counterexample", str(cex)
            elif r == z3.sat:
                status, detail = "counterexample", "counterexample (symbolic model only)"
            else:
                status, detail = "unknown", f"{where}slot {slot}: {s.reason_unknown()}"
            break
        res = StepResult(invariant, step, status, time.perf_counter() - t0, used, detail)
        self._results[key] = res
        return res

    def lookup_witness(self) -> Witness:
        """Non-vacuity of the INV-MATCH lookup: in a state satisfying every invariant, a
        lookup verifies two blocks, and the span clamp cuts the match back to one."""
        n, M = self.witness_pool, self.enc.bounds.table
        d = Domain(n)
        pre = self.enc.fresh_state(d, "w.")
        q = self.enc.fresh_query("w.q.")
        BS = pre.BS
        raw = [
            z3.And(
                (j + 1) * BS <= q.ntok - 1,
                pre.inb(q.cands[j]),
                self.enc.verify(
                    pre,
                    q.cands[j],
                    (q.ns, z3.IntVal(-1) if j == 0 else q.cands[j - 1], q.labels[j]),
                ),
            )
            for j in range(2)
        ]
        hits = self.enc.lookup(pre, q)
        t0 = time.perf_counter()
        s = _solver(self.rlimit, self.seed)
        s.add(hypothesis(self.enc, d, pre), *raw, hits[0], z3.Not(hits[1]))
        r = s.check()
        text = ""
        if r == z3.sat:
            ev = model_reader(s.model())
            text = format_state(read(pre, ev, n, M)) + f"\n  lookup({format_args(q, ev)})"
        scenario = "two verified blocks, the span clamp keeps one"
        return Witness("lookup", scenario, str(r), time.perf_counter() - t0, text)

    def txn_witnesses(self, op: str) -> dict[str, Witness]:
        """Non-vacuity of INV-TXN: every failing precondition of ``op`` holds in some state
        that satisfies every invariant (a pool of ``witness_pool`` blocks)."""
        n, M = self.witness_pool, self.enc.bounds.table
        d = Domain(n)
        pre = self.enc.fresh_state(d, "w.")
        hyp = hypothesis(self.enc, d, pre)
        out = {}
        for error in TXN_ERRORS[op]:
            t0 = time.perf_counter()
            fail, _, _, args = txn_formula(self.enc, d, pre, op, error, 0, prefix="w.a.")
            s = _solver(self.rlimit, self.seed)
            s.add(hyp, fail)
            r = s.check()
            text = ""
            if r == z3.sat:
                ev = model_reader(s.model())
                text = format_state(read(pre, ev, n, M)) + f"\n  {op}({format_args(args, ev)})"
            out[error] = Witness(
                op,
                f"{op} raises {error}",
                "sat" if r == z3.sat else str(r),
                time.perf_counter() - t0,
                text,
            )
        return out

    def rows(
        self,
        invariants: Sequence[str] = PROPERTY_IDS,
        operations: Sequence[str] = tuple(OPERATIONS),
        progress: Callable[[Row], None] | None = None,
    ) -> list[Row]:
        out = []
        for op in operations:
            for inv in invariants:
                kind, non_vacuous = "state", None
                if inv == TXN:
                    if op not in TXN_ERRORS:
                        continue
                    steps: tuple[str, ...] = TXN_ERRORS[op]
                    results = [self.prove_txn(op, e) for e in steps]
                    kind = "txn"
                    if self.txn_witness:
                        ws = self.txn_witnesses(op)
                        non_vacuous = all(w.status == "sat" for w in ws.values())
                else:
                    steps = OPERATIONS[op]
                    results = [self.prove_step(inv, s) for s in steps]
                    if inv == MATCH:
                        kind = "lookup"
                bad = [r for r in results if r.status != "proved"]
                row = Row(
                    invariant=inv,
                    operation=op,
                    status=bad[0].status if bad else "proved",
                    seconds=sum(r.seconds for r in results),
                    steps=steps,
                    rlimit_used=max(r.rlimit_used for r in results),
                    detail="\n".join(r.detail for r in bad),
                    kind=kind,
                    non_vacuous=non_vacuous,
                )
                out.append(row)
                if progress:
                    progress(row)
        return out

    # -- non-vacuity ----------------------------------------------------------------------

    def witnesses(self, operations: Sequence[str] = tuple(OPERATIONS)) -> dict[str, Witness]:
        """Per operation: every proof step's hypotheses are satisfiable, and so is the whole
        operation in an interesting scenario. Returns the first failure or the scenario's
        witness."""
        out: dict[str, Witness] = {}
        scenarios = _scenarios(self.enc)
        n = self.witness_pool
        d = Domain(n)
        pre = self.enc.fresh_state(d, "w.")
        hyp = hypothesis(self.enc, d, pre)
        M = self.enc.bounds.table
        for op in operations:
            t0 = time.perf_counter()
            status, text = "sat", ""
            if op == "init":
                s = _solver(self.rlimit, self.seed)
                s.add(self.enc.shape(pre), self.enc.init_state(d, pre))
                r = s.check()
                status = "sat" if r == z3.sat else str(r)
                if r == z3.sat:
                    text = format_state(read(pre, model_reader(s.model()), n, M))
                out[op] = Witness(op, "a fresh cache", status, time.perf_counter() - t0, text)
                continue
            for step in OPERATIONS[op]:
                st = step_formula(self.enc, d, pre, step, 0, prefix="w.a.")
                s = _solver(self.rlimit, self.seed)
                s.add(hyp, st.enabled, st.bounded)
                r = s.check()
                if r != z3.sat:
                    status, text = str(r), f"step {step}: hypotheses are {r}"
                    break
            desc, scenario = scenarios[op]
            if status == "sat":
                full_op = "evict*1" if op == "evict" else op
                st = step_formula(self.enc, d, pre, full_op, 0, prefix="w.o.")
                s = _solver(self.rlimit, self.seed)
                s.add(hyp, st.enabled, st.bounded, st.choice, scenario(pre, st))
                r = s.check()
                status = "sat" if r == z3.sat else str(r)
                if r == z3.sat:
                    ev = model_reader(s.model())
                    text = (
                        format_state(read(pre, ev, n, M))
                        + f"\n  {op}({format_args(st.args, ev)})\n"
                        + format_state(read(st.post, ev, n, M))
                    )
                else:
                    text = f"scenario '{desc}' is {r}"
            out[op] = Witness(op, desc, status, time.perf_counter() - t0, text)
        return out
