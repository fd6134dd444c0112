"""No drift between the Z3 model and the Python spec.

Each *drift check* takes one concrete pre-state and one operation and evaluates it both ways:

* the spec: :class:`~prefixkv.spec.SpecCache` in that state runs the operation, and either
  raises a :class:`~prefixkv.spec.PrefixCacheError` or reaches a successor;
* the model: the transition of :class:`~.transitions.Encoding` with the pre-state, the
  arguments and the spec's successor substituted in. One formula per operation,
  ``enabled & bounded & choice & post == spec_post``, is built once in a concrete domain;
  a check is one ``substitute`` + ``simplify``, which must give ``True``. When the spec
  failed, ``enabled & bounded`` must be false for every choice of eviction victims
  (``simplify``, or a solver call when the victims are left open).

Pre-states come from two sources: states reached by driving ``SpecCache`` with random
operations (:func:`run_reachable`), and states sampled from Z3 models of the invariants
(:func:`sample_states`, run through :func:`run_sampled`). Reachable states are also checked
against the model's invariants, and sampled states against the spec's ``invariants.check``,
so the two sets of invariant formulas cannot drift apart either.

The checks compare the abstracted components (:meth:`.concrete.AbsState.canonical`): block
refcounts, published flags, identities of published blocks, ages of evictable ones, the
free queue in order, the index, sequences (tokens as block labels, counts, tables, cached
prefix, recompute window, prompt length, ``kv_token_limit``), the clock and the counters.
Events, block hashes, spans and the lost-reuse counters are not modelled. The drifted
encodings this check must catch are in :mod:`.seeded`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from prefixkv.spec import (
    Namespace,
    PrefixCacheError,
    SpecCache,
    invariants,
)
from prefixkv.spec.request import SeqId

from ..driver import DriftError, SeededResult, Substituter
from ..terms import Term
from .calls import SpecCall, Trace, random_call, random_call_for, slots_for
from .concrete import (
    DONT_CARE,
    AbsState,
    Labels,
    OutOfBounds,
    abstract,
    bind,
    bind_values,
    concretize,
    format_state,
    model_reader,
    read,
)
from .model import TXN_ERRORS, Bounds, Domain, OpArgs, State
from .transitions import Encoding

__all__ = [
    "DriftChecker",
    "DriftError",
    "DriftReport",
    "SeededResult",
    "run_reachable",
    "run_sampled",
    "sample_states",
]


@dataclass
class _Compiled:
    ok: Any  # enabled & bounded & choice & post == spec_post
    fail: Any  # enabled & bounded (victims open)
    parts: dict[str, Any]  # for diagnosis only
    args: OpArgs
    names: list[str]  # "p:<leaf>", "q:<leaf>", "a:<arg>" or "a:<arg>[i]", in subst order
    subst: Substituter
    fail_subst: Substituter  # every variable but the victims
    fail_names: list[str]
    errors: dict[str, Any]  # INV-TXN: error class -> failing precondition or out of bounds


@dataclass
class DriftReport:
    checks: int = 0
    successes: int = 0
    failures: int = 0
    solver_calls: int = 0
    skipped: int = 0
    invariant_checks: int = 0
    windows: int = 0
    """Successful admissions that opened a recompute window of at least one block."""
    window_states: int = 0
    """Checks whose pre-state holds a window block that is still to be written."""
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)
    by_error: dict[str, int] = field(default_factory=dict)
    """Rejections by ``"operation: error class"`` (each matched to the model's failing
    precondition of that class)."""

    def merge(self, other: DriftReport) -> None:
        for f in (
            "checks",
            "successes",
            "failures",
            "solver_calls",
            "skipped",
            "invariant_checks",
            "windows",
            "window_states",
            "seconds",
        ):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for k, v in other.by_op.items():
            self.by_op[k] = self.by_op.get(k, 0) + v
        for k, v in other.by_error.items():
            self.by_error[k] = self.by_error.get(k, 0) + v


class DriftChecker:
    """Evaluates the model's transitions on concrete states of a pool of ``n`` blocks."""

    def __init__(self, enc: Encoding, n: int) -> None:
        self.enc, self.n = enc, n
        self.M = enc.bounds.table
        self.d = Domain(n)
        self.pre = enc.fresh_state(self.d, "p.")
        self.spost = enc.fresh_state(self.d, "q.", N=self.pre.N, BS=self.pre.BS)
        self._compiled: dict[tuple[str, int], _Compiled] = {}
        self._inv = z3.And(
            enc.shape(self.pre), enc.in_bounds(self.pre), *enc.invariants(self.d, self.pre).values()
        )
        self._inv_subst: Substituter | None = None
        self._inv_names: list[str] = []

    # -- compiled formulas ----------------------------------------------------------------

    def _eq(self, a: State, b: State) -> Any:
        """``a`` equals ``b`` on the abstracted components (``b`` is a fresh state)."""
        out = [a.clock == b.clock, *[a.ctr[k] == b.ctr[k] for k in a.ctr]]
        for i in range(self.n):
            same_ident = z3.And(
                a.par[i] == b.par[i],
                a.bns[i] == b.bns[i],
                a.btok[i] == b.btok[i],
                a.depth[i] == b.depth[i],
            )
            out += [
                a.rc[i] == b.rc[i],
                a.pub[i] == b.pub[i],
                z3.Implies(b.pub[i], same_ident),
                z3.Implies(z3.And(b.pub[i], b.rc[i] == 0), a.lu[i] == b.lu[i]),
            ]
        out.append(a.qt - a.qh == b.qt - b.qh)
        for i in range(self.n):
            out.append(z3.Implies(i < b.qt - b.qh, a.q[a.qh + i] == b.q[b.qh + i]))
        keys = list(a.idx.support or ()) + [
            k for k in b.idx.support or () if k not in (a.idx.support or ())
        ]
        out += [a.idx.get(k) == b.idx.get(k) for k in keys]
        for sa, sb in zip(a.seqs, b.seqs, strict=True):
            same = [
                sa.ns == sb.ns,
                sa.ntok == sb.ntok,
                sa.nc == sb.nc,
                sa.nr == sb.nr,
                sa.len == sb.len,
                sa.nca == sb.nca,
                sa.win == sb.win,
                sa.np == sb.np,
                sa.lim == sb.lim,
            ]
            for j in range(self.M):
                same.append(z3.Implies(j < sb.len, sa.tab[j] == sb.tab[j]))
                same.append(z3.Implies((j + 1) * b.BS <= sb.ntok, sa.lab[j] == sb.lab[j]))
            out += [sa.live == sb.live, z3.Implies(sb.live, z3.And(same))]
        return z3.And(out)

    def compiled(self, op: str, slot: int) -> _Compiled:
        key = (op, slot)
        if key not in self._compiled:
            args = self.enc.fresh_args(op, "a.")
            st = self.enc.step(self.d, self.pre, op, args, slot)
            shape = self.enc.shape(self.pre)
            eq = self._eq(st.post, self.spost)
            names, variables = self._variables(args)
            fail_idx = [i for i, nm in enumerate(names) if not nm.startswith(("a:victim", "q:"))]
            self._compiled[key] = _Compiled(
                ok=z3.And(shape, st.enabled, st.bounded, st.choice, eq),
                fail=z3.And(shape, st.enabled, st.bounded),
                parts={
                    "enabled": st.enabled,
                    "bounded": st.bounded,
                    "choice": st.choice,
                    "post == spec post": eq,
                },
                args=args,
                names=names,
                subst=Substituter(variables),
                fail_subst=Substituter([variables[i] for i in fail_idx]),
                fail_names=[names[i] for i in fail_idx],
                # A refusal whose successor would not fit the bounds (a table past
                # ``Bounds.table`` blocks) is outside the model; its class is not checked.
                errors={
                    e: z3.And(shape, z3.Or(f, z3.Not(st.bounded)))
                    for e, f in (
                        self.enc.failures(self.d, self.pre, op, args, slot)
                        if op in TXN_ERRORS
                        else {}
                    ).items()
                },
            )
        return self._compiled[key]

    def _variables(self, args: OpArgs) -> tuple[list[str], list[Term]]:
        names, variables = [], []
        for prefix, st in (("p:", self.pre), ("q:", self.spost)):
            for name, v in st.leaves.items():
                names.append(prefix + name)
                variables.append(v)
        for name, var in args._asdict().items():
            if isinstance(var, tuple):
                for i, v in enumerate(var):
                    names.append(f"a:{name}[{i}]")
                    variables.append(v)
            else:
                names.append(f"a:{name}")
                variables.append(var)
        return names, variables

    def _values(
        self, names: list[str], pre: AbsState, post: AbsState | None, args: dict[str, Any]
    ) -> list[int | bool]:
        S = self.enc.bounds.seqs
        table: dict[str, int | bool] = {}
        for k, v in bind_values(pre, S, self.M).items():
            table["p:" + k] = v
        if post is not None:
            for k, v in bind_values(post, S, self.M).items():
                table["q:" + k] = v
        for name, val in args.items():
            if isinstance(val, (list, tuple)):
                for i, x in enumerate(val):
                    table[f"a:{name}[{i}]"] = x
            else:
                table[f"a:{name}"] = val
        return [table.get(nm, 0) for nm in names]

    # -- one check ------------------------------------------------------------------------

    def check(
        self,
        pre: AbsState,
        op: str,
        slot: int,
        values: dict[str, Any],
        post: AbsState | None,
        what: str = "",
        error: type[BaseException] | None = None,
    ) -> str:
        """One drift check. ``post`` is the spec's successor, or None if the spec raised
        ``error``: then the model's failing precondition of that error class must hold
        (INV-TXN's classes are the spec's), and its transition must be disabled.

        Returns ``"ok"``, ``"failed-ok"`` (both sides reject) or ``"skipped"`` (the spec's
        successor does not fit the model's bounds); raises :class:`DriftError` on drift.
        """
        c = self.compiled(op, slot)
        if post is not None:
            try:
                vals = self._values(c.names, pre, post, values)
            except OutOfBounds:
                return "skipped"
            if z3.is_true(c.subst(c.ok, vals)):
                return "ok"
            pairs = self._pairs(c, vals)
            if z3.is_false(z3.simplify(z3.substitute(c.parts["bounded"], *pairs))):
                return "skipped"
            raise DriftError(self._diagnose(c, pairs, pre, post, op, slot, what))
        fail_vals = self._values(c.fail_names, pre, None, values)
        mro = error.__mro__ if error is not None else ()
        cls = next((k.__name__ for k in mro if k.__name__ in c.errors), None)
        if error is not None and c.errors and cls is None:
            raise DriftError(f"the spec raises {error} from {what or op}, no class the model knows")
        if cls is not None:
            fr = c.fail_subst(c.errors[cls], fail_vals)
            if not z3.is_true(fr):
                s = z3.Solver()
                s.add(fr)
                if z3.is_false(fr) or s.check() != z3.sat:
                    raise DriftError(
                        f"the spec raises {cls} from {what or op} (slot {slot}) but the model's "
                        f"failing precondition for {cls} does not hold\n" + format_state(pre)
                    )
        r = c.fail_subst(c.fail, fail_vals)
        if z3.is_false(r):
            return "failed-ok"
        if not z3.is_true(r):
            s = z3.Solver()
            s.add(r)
            if s.check() == z3.unsat:
                return "failed-ok+solver"
        raise DriftError(
            f"the spec rejects {what or op} (slot {slot}) but the model allows it\n"
            + format_state(pre)
        )

    def _pairs(self, c: _Compiled, vals: list[int | bool]) -> list[tuple[Any, Any]]:
        return [(v, _val(v, x)) for v, x in zip(c.subst.vars, vals, strict=True)]

    def _diagnose(
        self,
        c: _Compiled,
        pairs: list[tuple[Any, Any]],
        pre: AbsState,
        post: AbsState,
        op: str,
        slot: int,
        what: str,
    ) -> str:
        bad = [
            name
            for name, f in c.parts.items()
            if not z3.is_true(z3.simplify(z3.substitute(f, *pairs)))
        ]
        lines = [
            f"drift on {what or op} (slot {slot}): model and spec disagree on {', '.join(bad)}",
            "pre-state:",
            format_state(pre),
            "spec post-state:",
            format_state(post),
        ]
        if "post == spec post" in bad and not {"enabled", "bounded"} & set(bad):
            st = self.enc.step(self.d, self.pre, op, c.args, slot).post
            model_post = read(st, lambda t: z3.simplify(z3.substitute(t, *pairs)), self.n, self.M)
            lines += ["model post-state:", format_state(model_post)]
        return "\n".join(lines)

    def invariants_hold(self, a: AbsState) -> bool:
        """The model's invariants evaluated on a concrete state."""
        if self._inv_subst is None:
            self._inv_names = list(self.pre.leaves)
            self._inv_subst = Substituter([self.pre.leaves[k] for k in self._inv_names])
        vals = bind_values(a, self.enc.bounds.seqs, self.M)
        return bool(
            z3.is_true(self._inv_subst(self._inv, [vals.get(k, 0) for k in self._inv_names]))
        )


def _val(var: Any, x: Any) -> Any:
    return z3.BoolVal(bool(x)) if z3.is_bool(var) else z3.IntVal(int(x))


# -- translating spec calls into model steps -------------------------------------------------


def _victims_after_allocation(
    pre: AbsState, new_blocks: Sequence[int], post: AbsState
) -> list[int]:
    """The blocks an allocation evicted, in eviction order: evicted blocks join the free
    queue's tail in order, and allocation takes from its head."""
    return [b for b in [*new_blocks, *post.queue] if pre.pub[b]]


def model_step(
    call: SpecCall,
    pre: AbsState,
    post: AbsState | None,
    result: Any,
    slots: list[SeqId | None],
    labels: Labels,
    M: int,
) -> tuple[str, int, dict[str, Any]]:
    """The model operation, acting slot and argument values of a spec call."""
    bs = pre.bs
    if call.op == "admit":
        req = call.request
        assert req is not None
        toks = req.token_ids
        vals: dict[str, Any] = {
            "ns": labels.ns(req.namespace.key()),
            "ntok": len(toks),
            "labels": [
                labels.tok(tuple(toks[j * bs : (j + 1) * bs]))
                if (j + 1) * bs <= len(toks)
                else DONT_CARE
                for j in range(M)
            ],
            "whole": call.num_new is None,
            "num_new": 1 if call.num_new is None else call.num_new,
            "recompute_blocks": req.recompute_blocks,
            "limit": req.kv_token_limit or 0,
        }
        slot = slots.index(req.seq_id)
        if post is not None:
            k = result.num_cached_tokens // bs
            vals["victims"] = _victims_after_allocation(pre, result.block_ids[k:], post)
        return "admit", slot, vals
    if call.op in ("append", "continue_prefill", "commit", "rollback"):
        sid = call.seq_ids[0]
        slot = slots.index(sid) if sid in slots else slots.index(None)
        vals = {"n": call.n}
        if call.op == "continue_prefill":
            vals = {
                "whole": call.num_new is None,
                "num_new": 1 if call.num_new is None else call.num_new,
            }
            if post is not None:
                before, after = pre.seqs[slot], post.seqs[slot]
                assert before is not None and after is not None
                vals["victims"] = _victims_after_allocation(
                    pre, after.table[len(before.table) :], post
                )
        if call.op == "append" and post is not None:
            vals["victims"] = _victims_after_allocation(pre, result, post)
        if call.op == "commit":
            sq = pre.seqs[slot]
            vals["accepted"] = len(call.accepted)
            if sq is not None:
                after_toks = [*sq.tokens, *call.accepted]
                vals["labels"] = [
                    labels.tok(tuple(after_toks[j * bs : (j + 1) * bs]))
                    if (j + 1) * bs <= len(after_toks)
                    else DONT_CARE
                    for j in range(M)
                ]
        return call.op, slot, vals
    if call.op == "free":
        flags = [sid is not None and sid in call.seq_ids for sid in slots]
        unknown = [x for x in call.seq_ids if x not in slots]
        empty = [i for i, sid in enumerate(slots) if sid is None]
        if len(unknown) > len(empty):
            raise OutOfBounds("more unknown ids than empty slots")
        for i in empty[: len(unknown)]:
            flags[i] = True  # an unknown id is an empty (not live) slot
        return "free", 0, {"freed": flags}
    if call.op == "evict":
        victims = [] if post is None else post.queue[len(pre.queue) :]
        return f"evict*{call.n}", 0, {"victims": victims}
    return call.op, 0, {}


# -- reachable states --------------------------------------------------------------------------


def _run_call(
    checker: DriftChecker,
    cache: SpecCache,
    call: SpecCall,
    slots: list[SeqId | None],
    labels: Labels,
    report: DriftReport,
) -> None:
    M = checker.M
    try:
        pre = abstract(cache, slots, labels, M)
    except OutOfBounds:
        report.skipped += 1
        return
    try:
        result = call.run(cache)
        post: AbsState | None = abstract(cache, slots, labels, M)
    except PrefixCacheError as e:
        result, post = e, None
        after = abstract(cache, slots, labels, M)
        if after.canonical(M) != pre.canonical(M):  # INV-TXN, on the modelled components
            raise DriftError(
                f"{call} was rejected ({type(e).__name__}) but changed the "
                "state:\n" + format_state(pre) + "\n" + format_state(after)
            ) from e
    except OutOfBounds:
        report.skipped += 1
        return
    try:
        op, slot, values = model_step(call, pre, post, result, slots, labels, M)
    except OutOfBounds:
        report.skipped += 1
        return
    error = type(result) if isinstance(result, PrefixCacheError) else None
    outcome = checker.check(pre, op, slot, values, post, str(call), error)
    if outcome == "skipped":
        report.skipped += 1
        return
    report.checks += 1
    report.by_op[call.op] = report.by_op.get(call.op, 0) + 1
    report.window_states += _pending_window(pre)
    if post is None:
        report.failures += 1
        key = f"{op}: {type(result).__name__}"
        report.by_error[key] = report.by_error.get(key, 0) + 1
        report.solver_calls += outcome.endswith("solver")
    else:
        report.successes += 1
        if call.op == "admit" and result.num_window_blocks > 0:
            report.windows += 1


def _pending_window(a: AbsState) -> bool:
    """Some live sequence holds a recompute-window block not yet fully computed."""
    for sq in a.seqs:
        if sq is None or sq.win <= 0:
            continue
        first = sq.nca // a.bs
        if any((j + 1) * a.bs > sq.nc for j in range(first, min(first + sq.win, len(sq.table)))):
            return True
    return False


def run_reachable(
    enc: Encoding,
    checks: int,
    *,
    seed: int = 0,
    n: int = 5,
    block_sizes: Sequence[int] = (1, 2, 3),
    trace_len: int = 40,
    check_invariants_every: int = 4,
    checker: DriftChecker | None = None,
    report: DriftReport | None = None,
) -> DriftReport:
    """Drive ``SpecCache`` with random operations; check every step against the model.

    Every ``check_invariants_every``-th reachable state is also checked against the model's
    invariants (and the spec's own ``invariants.check``). ``report`` (updated in place) lets
    a caller see how far a run got when it raises :class:`DriftError`.
    """
    rng = random.Random(seed)
    checker = checker or DriftChecker(enc, n)
    S, M = enc.bounds.seqs, enc.bounds.table
    report = DriftReport() if report is None else report
    t0 = time.perf_counter()
    namespaces = (Namespace("model-a"), Namespace("model-a", adapter="lora-1"))
    while report.checks < checks:
        cache = SpecCache(n, rng.choice(block_sizes))
        trace = Trace(cache, Labels())
        for _ in range(trace_len):
            call = random_call(cache, rng, M, S, trace, namespaces)
            slots = slots_for(cache, call, S, rng)
            if call.op == "admit":
                assert call.request is not None
                if call.request.seq_id not in slots:
                    continue
            _run_call(checker, cache, call, slots, trace.labels, report)
            if report.checks % check_invariants_every == 0:
                state = abstract(
                    cache, slots_for(cache, SpecCall("evict"), S, rng), trace.labels, M
                )
                invariants.check(cache)
                if not checker.invariants_hold(state):
                    raise DriftError(
                        "a reachable spec state violates the model's invariants:\n"
                        + format_state(state)
                        + "\n"
                        + _failing_invariants(checker, state)
                    )
                report.invariant_checks += 1
            if report.checks >= checks:
                break
    report.seconds = time.perf_counter() - t0
    return report


def _failing_invariants(checker: DriftChecker, a: AbsState) -> str:
    pairs = bind(checker.pre, a, checker.M)
    bad = [
        name
        for name, f in checker.enc.invariants(checker.d, checker.pre).items()
        if not z3.is_true(z3.simplify(z3.substitute(f, *pairs)))
    ]
    return "failing: " + ", ".join(bad)


# -- sampled states ----------------------------------------------------------------------------


def sample_states(
    enc: Encoding, n: int, count: int, *, seed: int = 0, block_sizes: Sequence[int] = (1, 2, 3)
) -> list[AbsState]:
    """``count`` distinct states satisfying the model's invariants, from Z3 models.

    Values are kept small (labels, namespaces, counters) so the states are readable and
    concretizable; each model is steered by a few random literals (live slots, published
    and refcounted blocks, computed tokens) so the samples spread out.
    """
    rng = random.Random(seed)
    d = Domain(n)
    st = enc.fresh_state(d, "s.")
    M = enc.bounds.table
    solver = z3.Solver()
    solver.set("random_seed", seed)
    solver.add(enc.shape(st), enc.in_bounds(st), *enc.invariants(d, st).values())
    small = [max(block_sizes) >= st.BS, st.clock >= 0, st.clock <= 6]
    for b in range(n):
        small += [
            st.bns[b] >= 0,
            st.bns[b] <= 1,
            st.btok[b] >= 0,
            st.btok[b] <= 3,
            st.lu[b] >= 0,
            st.lu[b] <= st.clock,
            st.depth[b] >= 0,
        ]
    for sq in st.seqs:
        small += [
            sq.ns >= 0,
            sq.ns <= 1,
            sq.ntok >= 1,
            sq.ntok <= (M + 1) * st.BS,
            sq.win >= 0,
            sq.win <= M,
            sq.lim <= 2 * st.BS,
        ]
        small += [z3.And(x >= 0, x <= 3) for x in sq.lab]
    small += [v <= 60 for v in st.ctr.values()]
    solver.add(*small)
    out: list[AbsState] = []
    seen: set[tuple[Any, ...]] = set()
    tries = 0
    while len(out) < count and tries < count * 6:
        tries += 1
        hints = [rng.choice(block_sizes) == st.BS]
        for sq in st.seqs:
            hints.append(sq.live if rng.random() < 0.6 else z3.Not(sq.live))
            if rng.random() < 0.5:
                hints.append(sq.nc == rng.randint(0, M * 2))
            if rng.random() < 0.5:  # a recompute window, often with blocks still to write
                hints.append(sq.win == rng.randint(1, 2))
                hints.append(sq.nca == rng.choice((0, 0, 1)) * st.BS)
            if rng.random() < 0.4:  # chunked prefill, part of the prompt still to reserve
                hints.append(sq.lim == rng.randint(1, 3))
                hints.append(sq.np > sq.nr)
        for b in rng.sample(range(n), k=min(n, 2)):
            hints.append(st.pub[b] if rng.random() < 0.6 else z3.Not(st.pub[b]))
            hints.append(st.rc[b] == rng.choice((0, 0, 1, 2)))
        r = solver.check(*hints)
        if r != z3.sat:
            continue
        a = read(st, model_reader(solver.model()), n, M)
        key = a.canonical(M)
        if key in seen:
            continue
        seen.add(key)
        out.append(a)
    return out


def run_sampled(
    enc: Encoding,
    states: Sequence[AbsState],
    ops_per_state: int,
    *,
    seed: int = 0,
    checkers: dict[int, DriftChecker] | None = None,
) -> DriftReport:
    """Concretize each sampled state into a ``SpecCache``, check the spec's invariants on
    it, then drift-check ``ops_per_state`` random operations from it."""
    rng = random.Random(seed)
    checkers = {} if checkers is None else checkers
    S, M = enc.bounds.seqs, enc.bounds.table
    report = DriftReport()
    t0 = time.perf_counter()
    for a in states:
        checker = checkers.get(a.n)
        if checker is None:
            checker = checkers[a.n] = DriftChecker(enc, a.n)
        labels = Labels()
        cache, slots = concretize(a, labels)
        invariants.check(cache)  # a model of the Z3 invariants satisfies the spec's
        back = abstract(cache, slots, labels, M)
        if back.canonical(M) != a.canonical(M):
            raise DriftError(
                "concretize/abstract round trip changed the state:\n"
                + format_state(a)
                + "\n"
                + format_state(back)
            )
        report.invariant_checks += 1
        for _ in range(ops_per_state):
            cache, slots = concretize(a, labels)
            call = random_call_for(a, slots, labels, rng, M, S)
            if call.op == "admit":
                assert call.request is not None
                slots[slots.index(None)] = call.request.seq_id
            _run_call(checker, cache, call, slots, labels, report)
    report.seconds = time.perf_counter() - t0
    return report


def default_run(
    enc: Encoding | None = None,
    checks: int = 10_000,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> DriftReport:
    """The CI drift run: about 85 % reachable-state checks and 15 % sampled-state checks."""
    t0 = time.perf_counter()
    enc = enc or Encoding(Bounds())
    sampled_checks = checks * 15 // 100
    per_state = 25  # sampling a state costs more than checking an operation on it
    states = sample_states(enc, 4, max(1, sampled_checks // per_state), seed=seed)
    report = run_sampled(enc, states, per_state, seed=seed)
    if progress:
        progress(f"sampled: {report.checks} checks on {len(states)} states")
    rest = run_reachable(enc, max(0, checks - report.checks), seed=seed)
    report.merge(rest)
    report.seconds = time.perf_counter() - t0  # sampling included
    return report
