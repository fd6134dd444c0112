"""The joint model's proof obligations: the invariants over every operation, RESTORE-SAFE over
``admit`` and ``restore_issued``, EXPERTS as non-interference, and a witness scenario per
operation. :class:`JointModel` is the whole model that ``prove`` runs
(:mod:`prefixkv.proofs.small` proves what it states)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import z3

from ..small import Obligation, ScenarioWitnesses, all_of, any_of
from ..terms import Evaluator, Term
from .model import (
    FREE,
    JOINT_OPERATIONS,
    PINNED,
    READY,
    RESTORE_OPS,
    STATE_IDS,
    AdmitArgs,
    Args,
    JState,
    NodeArgs,
    PublishArgs,
    Step,
    sel,
)
from .transitions import JointTransitions

__all__ = ["JointModel"]


class JointModel(JointTransitions, ScenarioWitnesses):
    """KV nodes, hits and checkpoints in one transition system (:mod:`.model`), with its
    obligations, EXPERTS' non-interference and witness scenarios."""

    name = "joint"

    # -- EXPERTS: non-interference ----------------------------------------------------------

    def with_experts(self, x: JState, p: str) -> JState:
        """``x`` with other routed-expert data (the same everywhere else)."""
        return replace(x, exp=tuple(z3.Int(f"{p}exp{n}") for n in range(self.N)))

    def same_but_experts(self, a: JState, b: JState) -> Term:
        def eq(u: Sequence[Term], v: Sequence[Term]) -> list[Term]:
            return [p == q for p, q in zip(u, v, strict=True)]

        cs = [a.clock == b.clock]
        for f in ("pub", "gen", "par", "pgen", "dep", "rc", "live", "h", "held", "rs", "kind"):
            cs += eq(getattr(a, f), getattr(b, f))
        cs += eq(a.node, b.node) + eq(a.bnd, b.bnd) + eq(a.sgen, b.sgen) + eq(a.owner, b.owner)
        for s in range(self.S):
            cs += eq(a.path[s], b.path[s])
        return all_of(cs)

    def non_interference(self, op: str, x: JState, a: Args) -> tuple[Term, Term]:
        """(hypothesis, conclusion) of EXPERTS over ``op``."""
        y = self.with_experts(x, "ni.")
        q = self.fresh_query("ni.q.")
        if op == "init":
            x = self.init_state()
            y = self.with_experts(x, "ni.")
            c1, _ = self.match(x, q)
            c2, _ = self.match(y, q)
            return z3.BoolVal(True), c1 == c2
        sx, sy = self.step(op, x, a), self.step(op, y, a)
        c1, _ = self.match(sx.post, q)
        c2, _ = self.match(sy.post, q)
        hyp = z3.And(self.inv(x), self.inv(y))
        if op == "experts":
            # NOTE: attaching experts reads expert data (a node keeps the first it gets), so
            # whether it is enabled may differ; what it may not do is change anything else.
            c0, _ = self.match(x, q)
            return hyp, z3.Implies(sx.guard, z3.And(self.same_but_experts(sx.post, x), c1 == c0))
        concl = z3.And(
            sx.guard == sy.guard,
            z3.Implies(sx.guard, z3.And(self.same_but_experts(sx.post, sy.post), c1 == c2)),
        )
        return hyp, concl

    # -- obligations ------------------------------------------------------------------------

    def _ops(self, ops: Sequence[str] | None) -> list[str]:
        return [o for o in JOINT_OPERATIONS if ops is None or o in ops]

    def obligations(self, ops: Sequence[str] | None = None) -> list[Obligation]:
        out: list[Obligation] = []
        for op in self._ops(ops):
            if op == "init":
                init = self.init_state()
                invs = self.invariants(init)
                show0 = self.shower(init, None, None, None)
                out += [
                    Obligation(p, op, "state", z3.BoolVal(True), invs[p], show0) for p in STATE_IDS
                ]
                h, c = self.non_interference(op, init, None)
                out.append(Obligation("EXPERTS", op, "two-state", h, c, show0))
                continue
            x = self.fresh("p.")
            a = self.fresh_args(op)
            stp = self.step(op, x, a)
            hyp = z3.And(self.inv(x), stp.guard)
            post = self.invariants(stp.post)
            show = self.shower(x, op, a, stp.post)
            out += [Obligation(p, op, "state", hyp, post[p], show) for p in STATE_IDS]
            if op in RESTORE_OPS:
                out.append(
                    Obligation("RESTORE-SAFE", op, "step", hyp, stp.facts["RESTORE-SAFE"], show)
                )
            h, c = self.non_interference(op, x, a)
            y = self.with_experts(x, "ni.")
            out.append(
                Obligation(
                    "EXPERTS", op, "two-state", h, c, self.shower(x, op, a, y, "other experts")
                )
            )
        return out

    def scenario(self, op: str, x: JState, a: Args, stp: Step) -> tuple[str, Term]:
        N, K = range(self.N), range(self.K)
        if op == "admit" and isinstance(a, AdmitArgs):
            other = any_of(
                [z3.And(x.kind[k] == READY, x.node[k] != self.last(a.path, a.h)) for k in K]
            )
            return (
                "a hit of 2 blocks restores the checkpoint at its end; another one is Ready",
                z3.And(a.h == 2, a.r >= 0, other),
            )
        if op == "publish" and isinstance(a, PublishArgs):
            return (
                "a node evicted before is published again as a child, with experts",
                z3.And(sel(x.held, a.s) >= 1, sel(x.gen, a.n) >= 1, a.e > 0),
            )
        if op == "save":
            return (
                "a checkpoint is saved on a node nobody holds",
                all_of([x.rc[n] == 0 for n in N]),
            )
        if op == "evict" and isinstance(a, NodeArgs):
            had = any_of([z3.And(x.kind[k] == READY, x.node[k] == a.n) for k in K])
            return (
                "an evicted node's Ready checkpoint goes stale",
                z3.And(had, sel(x.exp, a.n) > 0),
            )
        if op == "free":
            return (
                "an abandoned restore is unpinned while another sequence holds the prefix",
                z3.And(any_of([x.kind[k] == PINNED for k in K]), z3.And(*x.live)),
            )
        if op == "restore_issued":
            return (
                "a restore of a 2-block prefix is issued",
                any_of([z3.And(x.kind[k] == PINNED, x.bnd[k] == 2) for k in K]),
            )
        if op == "drop":
            return (
                "slot pressure drops a Ready checkpoint while one is pinned",
                any_of([x.kind[k] == PINNED for k in K]),
            )
        if op == "experts":
            return (
                "experts enrich a node on a pinned prefix",
                any_of([x.kind[k] == PINNED for k in K]),
            )
        return ("a full reset drops a Ready checkpoint", any_of([x.kind[k] == READY for k in K]))

    # -- display ----------------------------------------------------------------------------

    def shower(
        self, x: JState, op: str | None, a: Args, post: JState | None, label: str = "post"
    ) -> Callable[[Evaluator], str]:
        def show(ev: Evaluator) -> str:
            lines = [f"  pre:  {self.format(x, ev)}"]
            if op is not None:
                lines.append(f"  step: {op}({self.format_args(a, ev)})")
            if post is not None and op is not None:
                lines.append(f"  {label}: {self.format(post, ev)}")
            return "\n".join(lines)

        return show

    def format(self, x: JState, ev: Evaluator) -> str:
        nodes = []
        for n in range(self.N):
            if z3.is_true(ev(x.pub[n])):
                nodes.append(
                    f"n{n}(gen {ev(x.gen[n])}, parent {ev(x.par[n])}@{ev(x.pgen[n])}, "
                    f"depth {ev(x.dep[n])}, rc {ev(x.rc[n])}, experts {ev(x.exp[n])})"
                )
            else:
                e = ev(x.exp[n])
                extra = "" if z3.is_int_value(e) and e.as_long() == 0 else f", experts {e}"
                nodes.append(f"n{n}(free, gen {ev(x.gen[n])}, rc {ev(x.rc[n])}{extra})")
        seqs = []
        for s in range(self.S):
            if z3.is_true(ev(x.live[s])):
                h, held = ev(x.h[s]).as_long(), ev(x.held[s]).as_long()
                path = [str(ev(x.path[s][j])) for j in range(max(0, min(held, self.D)))]
                seqs.append(f"s{s} holds [{' '.join(path)}], hit {h}")
        cks = []
        names = {FREE: "free", READY: "ready", PINNED: "pinned"}
        for k in range(self.K):
            kind = ev(x.kind[k]).as_long()
            if kind != FREE:
                cks.append(
                    f"c{k} {names.get(kind, kind)} on n{ev(x.node[k])} at {ev(x.bnd[k])} "
                    f"(saved at gen {ev(x.sgen[k])}, owner {ev(x.owner[k])})"
                )
        return (
            f"clock {ev(x.clock)}; nodes {'; '.join(nodes)}; seqs {', '.join(seqs) or '-'}; "
            f"checkpoints {', '.join(cks) or '-'}"
        )

    def format_args(self, a: Args, ev: Evaluator) -> str:
        if a is None:
            return ""
        fields = []
        for k, v in vars(a).items():
            if isinstance(v, tuple):
                fields.append(f"{k}=[{' '.join(str(ev(t)) for t in v)}]")
            else:
                fields.append(f"{k}={ev(v)}")
        return ", ".join(fields)
