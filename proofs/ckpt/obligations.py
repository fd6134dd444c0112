"""INV-CKPT's proof obligations: each clause inductive over every operation, non-vacuity.

:class:`CkptProver` proves each state clause (``CKPT-*``, ``AUX-*``) preserved by every
operation and each transition property (PIN-KEEP, RESTORE-EXACT, ACCEPTED) of its step,
and finds a witness scenario per operation so that no proof holds vacuously.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from ..terms import BoolTerm, Evaluator
from .model import (
    CKPT_IDS,
    CKPT_OPERATIONS,
    COUNTERS,
    DEFAULT_RLIMIT,
    FREE,
    KIND_NAMES,
    LIST_FIELDS,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    SEQ_OPS,
    STATE_IDS,
    TRANSITION_IDS,
    AdmitArgs,
    CkptArgs,
    CState,
    EvictArgs,
    GrowArgs,
    NoArgs,
    Step,
)
from .transitions import CkptModel

__all__ = ["CkptProver", "CkptRow", "applies", "format_cstate", "read_state"]

# -- reading and printing concrete states ---------------------------------------------------


def read_state(st: CState, ev: Callable[[Any], Any]) -> dict[str, Any]:
    """A concrete state (plain ints and bools) from an evaluator of Z3 terms."""

    def val(x: Any) -> Any:
        if not z3.is_expr(x):  # a plain value the transition assigned
            return x
        v = ev(x)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()

    out: dict[str, Any] = {f: [val(x) for x in getattr(st, f)] for f in LIST_FIELDS}
    out["clock"] = val(st.clock)
    out["ctr"] = {k: val(st.ctr[k]) for k in COUNTERS}
    return out


def format_cstate(c: dict[str, Any], indent: str = "  ") -> str:
    lines = []
    for s, k in enumerate(c["kind"]):
        name = KIND_NAMES[k] if 0 <= k < len(KIND_NAMES) else f"kind {k}"
        extra = ""
        if k in (RUNTIME, RESERVED, PINNED):
            extra += f" owner=q{c['owner'][s]}"
        if k in (RESERVED, READY, PINNED):
            extra += f" boundary={c['bnd'][s]}"
        if k in (READY, PINNED):
            extra += f" node={c['node'][s]} order={c['order'][s]}"
        lines.append(f"{indent}slot {s}: {name}{extra}")
    for q, live in enumerate(c["live"]):
        if live:
            lines.append(
                f"{indent}q{q}: runtime slot {c['rt'][q]}, hit {c['cached'][q]} "
                f"blocks ending at node {c['hit'][q]}, computed {c['comp'][q]}, "
                f"save point {c['sp'][q]}"
            )
    pub = [f"{n}@{c['depth'][n]}" for n, p in enumerate(c["pub"]) if p]
    lines.append(
        f"{indent}published nodes (node@depth): {', '.join(pub) or 'none'}; "
        f"clock {c['clock']}; {c['ctr']}"
    )
    return "\n".join(lines)


def _format_args(args: CkptArgs, ev: Evaluator) -> str:
    parts = []
    for k, v in args._asdict().items():
        if isinstance(v, list):
            vals = [ev(x) for x in v]
            picked = [
                i
                for i, x in enumerate(vals)
                if z3.is_true(x) or (not z3.is_bool(x) and k == "ndepth")
            ]
            if k != "ndepth":
                parts.append(f"{k}={picked}")
        else:
            parts.append(f"{k}={ev(v)}")
    return ", ".join(parts)


def _call(op: str, q: int, args: str) -> str:
    return f"{op}({', '.join(x for x in (f'q{q}' if op in SEQ_OPS else '', args) if x)})"


# -- obligations ----------------------------------------------------------------------------


@dataclass
class CkptRow:
    invariant: str
    operation: str
    status: str  # proved / counterexample / unknown
    seconds: float
    rlimit_used: int
    non_vacuous: bool | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "operation": self.operation,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "rlimit_used": self.rlimit_used,
            "non_vacuous": self.non_vacuous,
            "detail": self.detail,
            "kind": "checkpoint",
        }


def applies(prop: str, op: str) -> bool:
    """Which (property, operation) pairs are obligations."""
    if prop in STATE_IDS:
        return True
    if op == "init":
        return False
    target = TRANSITION_IDS[prop]
    return target is None or target == op


def _solver(rlimit: int, seed: int) -> z3.Solver:
    """Equalities first: the transitions are chains of ``If`` over small integers, and
    solving the post-state's definitions away before SMT is five times faster."""
    s = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    s.set("rlimit", rlimit, "random_seed", seed)
    return s


def _rlimit_now() -> int:
    """Z3's resource counter is global to the process: obligations report differences."""
    s = z3.Solver()
    s.check()
    st = s.statistics()
    return int(st.get_key_value("rlimit count")) if "rlimit count" in st.keys() else 0  # noqa: SIM118


class CkptProver:
    """Proves every (property, operation) obligation of :data:`CKPT_IDS` for ``model``."""

    def __init__(
        self, model: CkptModel | None = None, rlimit: int = DEFAULT_RLIMIT, seed: int = 0
    ) -> None:
        self.model = model or CkptModel()
        self.rlimit, self.seed = rlimit, seed
        self._steps: dict[
            tuple[str, int], tuple[CState, CkptArgs, Step, BoolTerm, dict[str, BoolTerm]]
        ] = {}

    def _built(
        self, op: str, q: int
    ) -> tuple[CState, CkptArgs, Step, BoolTerm, dict[str, BoolTerm]]:
        """The step's formulas, built once per (operation, sequence slot)."""
        key = (op, q)
        if key not in self._steps:
            m = self.model
            pre = m.fresh("p.")
            args = m.fresh_args(op)
            st = m.step(op, pre, q, args)
            self._steps[key] = (pre, args, st, z3.And(m.inv(pre), st.guard), m.invariants(st.post))
        return self._steps[key]

    def goal(self, prop: str, op: str, q: int) -> tuple[BoolTerm, BoolTerm, CState, Step, CkptArgs]:
        """(hypothesis, conclusion, pre, step, args) of one obligation for sequence slot q."""
        m = self.model
        if op == "init":
            init = m.init_state()
            return (
                z3.BoolVal(True),
                m.invariants(init)[prop],
                init,
                Step(z3.BoolVal(True), init),
                NoArgs(),
            )
        pre, args, st, hyp, post_inv = self._built(op, q)
        if prop in STATE_IDS:
            concl = post_inv[prop]
        elif prop == "PIN-KEEP":
            concl = m.pin_keep(pre, st.post)
        else:
            concl = st.facts[prop]
        return hyp, concl, pre, st, args

    def prove(self, prop: str, op: str) -> CkptRow:
        t0 = time.perf_counter()
        used = 0
        for q in self.model.seq_range(op):
            hyp, concl, pre, st, args = self.goal(prop, op, q)
            s = _solver(self.rlimit, self.seed)
            s.add(hyp, z3.Not(concl))
            base = _rlimit_now()
            r = s.check()
            used = max(used, _rlimit_now() - base)
            if r == z3.sat:
                mdl = s.model()

                def ev(x: Any, mdl: Any = mdl) -> Any:
                    return mdl.eval(x, model_completion=True)

                detail = (
                    f"pre-state:\n{format_cstate(read_state(pre, ev))}\n"
                    f"step: {_call(op, q, _format_args(args, ev))}\n"
                    f"post-state:\n{format_cstate(read_state(st.post, ev))}"
                )
                return CkptRow(
                    prop, op, "counterexample", time.perf_counter() - t0, used, detail=detail
                )
            if r != z3.unsat:
                return CkptRow(
                    prop, op, "unknown", time.perf_counter() - t0, used, detail=s.reason_unknown()
                )
        return CkptRow(prop, op, "proved", time.perf_counter() - t0, used)

    def rows(
        self,
        props: Sequence[str] = CKPT_IDS,
        ops: Sequence[str] = CKPT_OPERATIONS,
        progress: Callable[[CkptRow], None] | None = None,
    ) -> list[CkptRow]:
        out = []
        for op in ops:
            for prop in props:
                if applies(prop, op):
                    row = self.prove(prop, op)
                    out.append(row)
                    if progress:
                        progress(row)
        return out

    # -- non-vacuity ------------------------------------------------------------------------

    def scenario(self, op: str, pre: CState, st: Step, args: CkptArgs) -> tuple[str, BoolTerm]:
        """Each operation's interesting case: the part of the guard that exercises INV-CKPT."""
        K, M = self.model.K, self.model.M
        stale = z3.Or([z3.And(st.post.kind[s] == FREE, pre.kind[s] == READY) for s in range(K)])
        if op == "admit":
            assert isinstance(args, AdmitArgs)
            return (
                "a hit restores a Ready checkpoint and the runtime slot evicts another",
                z3.And(args.r >= 0, st.post.ctr["evicted"] > pre.ctr["evicted"]),
            )
        if op in ("append", "continue_prefill", "evict"):
            assert isinstance(args, GrowArgs | EvictArgs)
            return (
                "the growth evicts a node whose checkpoint goes stale",
                z3.And(z3.Or(args.victim), stale),
            )
        if op == "commit":
            return (
                "a reservation becomes Ready and the next one is reserved",
                z3.And(
                    st.post.ctr["saved"] > pre.ctr["saved"],
                    z3.Or([st.post.kind[s] == RESERVED for s in range(K)]),
                ),
            )
        if op == "rollback":
            return (
                "the reservation moves back to an earlier save point",
                st.post.ctr["discarded"] > pre.ctr["discarded"],
            )
        if op == "restore_issued":
            return ("the pinned checkpoint becomes Ready", z3.BoolVal(True))
        if op == "free":
            return (
                "an abandoned restore is unpinned",
                z3.Or([pre.kind[s] == PINNED for s in range(K)]),
            )
        if op == "reset_keep":
            return ("two live sequences are released", z3.And(pre.live[0], pre.live[1]))
        if op == "reset_full":
            return (
                "a Ready checkpoint goes stale with its node",
                z3.And(stale, z3.Or([pre.pub[n] for n in range(M)])),
            )
        return ("initial state", z3.BoolVal(True))

    def witnesses(self, ops: Sequence[str] = CKPT_OPERATIONS) -> dict[str, tuple[str, str, str]]:
        """op -> (scenario, sat/unsat/unknown, witness): the hypotheses are satisfiable."""
        out = {}
        m = self.model
        for op in ops:
            if op == "init":
                continue
            pre = m.fresh("p.")
            args = m.fresh_args(op)
            st = m.step(op, pre, 0, args)
            name, extra = self.scenario(op, pre, st, args)
            s = _solver(self.rlimit, self.seed)
            s.add(m.inv(pre), st.guard, extra)
            r = s.check()
            text = ""
            if r == z3.sat:
                mdl = s.model()

                def ev(x: Any, mdl: Any = mdl) -> Any:
                    return mdl.eval(x, model_completion=True)

                text = (
                    f"{format_cstate(read_state(pre, ev))}\n"
                    f"  step: {_call(op, 0, _format_args(args, ev))}"
                )
            out[op] = (name, str(r), text)
        return out


# -- broken variants ------------------------------------------------------------------------
