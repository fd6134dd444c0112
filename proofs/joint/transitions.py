"""The joint model's transitions: ``admit``, ``publish``, ``save``, ``experts``,
``restore_issued``, ``free``, ``evict``, ``drop`` and ``reset_full`` over one node set, and the
hybrid match they are checked against."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import z3

from ..small import all_of, any_of
from ..terms import Term
from .formulas import JointFormulas
from .model import (
    FREE,
    PINNED,
    READY,
    AdmitArgs,
    Args,
    ExpertArgs,
    JState,
    NodeArgs,
    PublishArgs,
    Query,
    SaveArgs,
    SeqArgs,
    SlotArgs,
    Step,
    put,
    sel,
)

__all__ = ["JointTransitions"]


class JointTransitions(JointFormulas):
    """One :class:`~.model.Step` per operation of the union of both transition sets, and the
    hybrid match (the deepest boundary of the chain with a Ready checkpoint)."""

    # -- the match (hybrid): deepest boundary of the chain with a Ready checkpoint -----------

    def ready_at(self, x: JState, n: Term, depth: int) -> Term:
        return any_of(
            [z3.And(x.kind[k] == READY, x.node[k] == n, x.bnd[k] == depth) for k in range(self.K)]
        )

    def match(self, x: JState, q: Query) -> tuple[Term, Term]:
        """(hit length, replay): the deepest c <= h whose node has a Ready checkpoint (0 if
        none), and whether routed experts are replayed (every hit node carries some)."""
        c: Term = z3.IntVal(0)
        for j in range(self.D):  # deeper wins: later assignments override
            c = z3.If(z3.And(j < q.h, self.ready_at(x, q.path[j], j + 1)), j + 1, c)
        c = self.cut_for_experts(x, q, c)
        replay = all_of([z3.Implies(j < c, sel(x.exp, q.path[j]) != 0) for j in range(self.D)])
        return c, replay

    def cut_for_experts(self, x: JState, q: Query, c: Term) -> Term:
        return c

    # -- transitions ------------------------------------------------------------------------

    def admit(self, x: JState, a: AdmitArgs) -> Step:
        S, K = self.S, self.K
        s_ok = z3.And(a.s >= 0, a.s < S, z3.Not(sel(x.live, a.s)))
        restore = a.r >= 0
        pick = z3.And(
            a.r < K,
            a.h >= 1,
            sel(x.kind, a.r) == READY,
            self.restore_source(x, a),
        )
        guard = z3.And(s_ok, self.hit_ok(x, a), a.r >= -1, z3.Implies(restore, pick))
        rc = tuple(
            x.rc[n] + z3.Sum([z3.If(z3.And(j < a.h, a.path[j] == n), 1, 0) for j in range(self.D)])
            for n in range(self.N)
        )
        path = tuple(
            tuple(z3.If(a.s == s, a.path[j], x.path[s][j]) for j in range(self.D)) for s in range(S)
        )
        post = replace(
            x,
            rc=rc,
            live=put(x.live, a.s, z3.BoolVal(True)),
            h=put(x.h, a.s, a.h),
            held=put(x.held, a.s, a.h),
            path=path,
            rs=put(x.rs, a.s, a.r),
            kind=put(x.kind, a.r, z3.IntVal(PINNED), restore),
            owner=put(x.owner, a.r, a.s, restore),
        )
        safe = z3.Implies(restore, self.restore_safe(post, a.r, a.h, a.path))
        return Step(guard, post, {"RESTORE-SAFE": safe})

    def hit_ok(self, x: JState, a: AdmitArgs) -> Term:
        """The hit is a verified published chain (what INV-MATCH's lookup returns)."""
        return self.chain_ok(x, a.h, a.path)

    def restore_source(self, x: JState, a: AdmitArgs) -> Term:
        """The checkpoint restored is the one on the hit's last node, at the hit's depth."""
        return z3.And(sel(x.node, a.r) == self.last(a.path, a.h), sel(x.bnd, a.r) == a.h)

    def restore_safe(self, x: JState, r: Term, h: Term, path: Sequence[Term]) -> Term:
        nd = sel(x.node, r)
        return z3.And(
            h >= 1,
            nd == self.last(path, h),
            sel(x.bnd, r) == h,
            self.in_nodes(nd),
            sel(x.pub, nd),
            sel(x.gen, nd) == sel(x.sgen, r),
            self.prefix_intact(x, h, path),
        )

    def publish(self, x: JState, a: PublishArgs) -> Step:
        s, n = a.s, a.n
        h = sel(x.held, s)
        mypath = [sel([x.path[q][j] for q in range(self.S)], s) for j in range(self.D)]
        parent = z3.If(h == 0, z3.IntVal(-1), self.last(mypath, h))
        pgen = z3.If(h == 0, z3.IntVal(0), sel(x.gen, parent))
        guard = z3.And(
            s >= 0,
            s < self.S,
            sel(x.live, s),
            h < self.D,
            self.in_nodes(n),
            self.publishable(x, n),
            a.e >= 0,
        )
        path = tuple(
            tuple(z3.If(z3.And(s == q, h == j), n, x.path[q][j]) for j in range(self.D))
            for q in range(self.S)
        )
        post = replace(
            x,
            pub=put(x.pub, n, z3.BoolVal(True)),
            gen=put(x.gen, n, self.new_gen(x, n)),
            par=put(x.par, n, parent),
            pgen=put(x.pgen, n, pgen),
            dep=put(x.dep, n, h + 1),
            rc=put(x.rc, n, z3.IntVal(1)),
            exp=put(x.exp, n, a.e),
            held=put(x.held, s, h + 1),
            path=path,
            clock=x.clock + 1,
        )
        return Step(guard, post, {})

    def publishable(self, x: JState, n: Term) -> Term:
        """A commit publishes a block it holds privately: never a published one."""
        return z3.And(z3.Not(sel(x.pub, n)), sel(x.rc, n) == 0)

    def new_gen(self, x: JState, n: Term) -> Term:
        return x.clock

    def save(self, x: JState, a: SaveArgs) -> Step:
        t, f = a.t, a.f
        taken = any_of([z3.And(x.kind[k] != FREE, x.node[k] == t) for k in range(self.K)])
        guard = z3.And(
            self.in_nodes(t),
            self.save_target(x, t),
            z3.Not(taken),
            f >= 0,
            f < self.K,
            sel(x.kind, f) == FREE,
        )
        post = replace(
            x,
            kind=put(x.kind, f, z3.IntVal(READY)),
            node=put(x.node, f, t),
            bnd=put(x.bnd, f, sel(x.dep, t)),
            sgen=put(x.sgen, f, sel(x.gen, t)),
            owner=put(x.owner, f, z3.IntVal(-1)),
        )
        return Step(guard, post, {})

    def save_target(self, x: JState, t: Term) -> Term:
        """The index returns a published node (INV-INDEX)."""
        return sel(x.pub, t)

    def experts(self, x: JState, a: ExpertArgs) -> Step:
        guard = z3.And(self.in_nodes(a.n), sel(x.pub, a.n), sel(x.exp, a.n) == 0, a.e > 0)
        return Step(guard, replace(x, exp=put(x.exp, a.n, a.e)), {})

    def restore_issued(self, x: JState, a: SeqArgs) -> Step:
        """The engine copied the checkpoint of ``pending_restore`` (the sequence's slot)."""
        s = a.s
        r = sel(x.rs, s)
        guard = z3.And(s >= 0, s < self.S, sel(x.live, s), r >= 0)
        h = sel(x.h, s)
        path = [sel([x.path[q][j] for q in range(self.S)], s) for j in range(self.D)]
        post = replace(
            x,
            rs=put(x.rs, s, z3.IntVal(-1)),
            kind=put(x.kind, r, z3.IntVal(READY)),
            owner=put(x.owner, r, z3.IntVal(-1)),
        )
        return Step(guard, post, {"RESTORE-SAFE": self.restore_safe(x, r, h, path)})

    def free(self, x: JState, a: SeqArgs) -> Step:
        s = a.s
        guard = z3.And(s >= 0, s < self.S, sel(x.live, s))
        rc = tuple(x.rc[n] - self.released(x, a.s, n) for n in range(self.N))
        mine = [z3.And(x.kind[k] == PINNED, x.owner[k] == s) for k in range(self.K)]
        post = replace(
            x,
            rc=rc,
            live=put(x.live, s, z3.BoolVal(False)),
            rs=put(x.rs, s, z3.IntVal(-1)),
            kind=tuple(z3.If(mine[k], READY, x.kind[k]) for k in range(self.K)),
            owner=tuple(z3.If(mine[k], -1, x.owner[k]) for k in range(self.K)),
        )
        return Step(guard, post, {})

    def released(self, x: JState, s: Term, n: int) -> Term:
        """How many holds on node ``n`` freeing sequence ``s`` gives back."""
        return z3.Sum([z3.If(s == q, self.holds(x, q, n), 0) for q in range(self.S)])

    def evict(self, x: JState, a: NodeArgs) -> Step:
        n = a.n
        guard = z3.And(self.in_nodes(n), self.evictable(x, n))
        stale = [self.stale(x, k, n) for k in range(self.K)]
        post = replace(
            x,
            pub=put(x.pub, n, z3.BoolVal(False)),
            exp=self.evicted_experts(x, n),
            kind=tuple(z3.If(stale[k], FREE, x.kind[k]) for k in range(self.K)),
            owner=tuple(z3.If(stale[k], -1, x.owner[k]) for k in range(self.K)),
        )
        return Step(guard, post, {})

    def evicted_experts(self, x: JState, n: Term) -> tuple[Term, ...]:
        """Routed experts ride on the published block: they go with it."""
        return put(x.exp, n, z3.IntVal(0))

    def evictable(self, x: JState, n: Term) -> Term:
        """Choice 3: a published leaf that no table holds."""
        return z3.And(sel(x.pub, n), sel(x.rc, n) == 0, self.is_leaf(x, n))

    def stale(self, x: JState, k: int, n: Term) -> Term:
        """``on_evict``: the evicted node's checkpoint is released at once."""
        return z3.And(x.kind[k] != FREE, x.node[k] == n)

    def drop(self, x: JState, a: SlotArgs) -> Step:
        guard = z3.And(a.r >= 0, a.r < self.K, self.droppable(x, a.r))
        return Step(guard, replace(x, kind=put(x.kind, a.r, z3.IntVal(FREE))), {})

    def droppable(self, x: JState, r: Term) -> Term:
        """Slot pressure evicts a Ready checkpoint, never a Pinned one."""
        return sel(x.kind, r) == READY

    def reset_full(self, x: JState) -> Step:
        guard = all_of([z3.Not(v) for v in x.live])
        f = z3.BoolVal(False)
        z = z3.IntVal(0)
        post = replace(
            x,
            pub=(f,) * self.N,
            exp=(z,) * self.N,
            kind=(z3.IntVal(FREE),) * self.K,
            owner=(z3.IntVal(-1),) * self.K,
        )
        return Step(guard, post, {})

    def step(self, op: str, x: JState, a: Args) -> Step:
        if isinstance(a, AdmitArgs):
            return self.admit(x, a)
        if isinstance(a, PublishArgs):
            return self.publish(x, a)
        if isinstance(a, SaveArgs):
            return self.save(x, a)
        if isinstance(a, ExpertArgs):
            return self.experts(x, a)
        if isinstance(a, NodeArgs):
            return self.evict(x, a)
        if isinstance(a, SlotArgs):
            return self.drop(x, a)
        if isinstance(a, SeqArgs):
            return self.restore_issued(x, a) if op == "restore_issued" else self.free(x, a)
        if op == "reset_full":
            return self.reset_full(x)
        raise ValueError(f"no joint step {op!r} with {a!r}")

    def init_state(self) -> JState:
        f, z, m1 = z3.BoolVal(False), z3.IntVal(0), z3.IntVal(-1)
        N, S, K = self.N, self.S, self.K
        return JState(
            (f,) * N,
            (z,) * N,
            (m1,) * N,
            (z,) * N,
            (z,) * N,
            (z,) * N,
            (z,) * N,
            (f,) * S,
            (z,) * S,
            (z,) * S,
            tuple((z,) * self.D for _ in range(S)),
            (m1,) * S,
            (z3.IntVal(FREE),) * K,
            (z,) * K,
            (z,) * K,
            (z,) * K,
            (m1,) * K,
            z3.IntVal(1),
        )
