"""The joint KV + checkpoint model: restore safety over every interleaving (INV-CKPT).

The checkpoint model (:mod:`..ckpt`) takes the KV side as an environment: a hit's node
is published and held, the index returns a published node at the boundary's depth, a commit
publishes only unpublished blocks. This model composes the two transition systems over one
shared node set, so those facts are proved together with the lifecycle instead of assumed:

::

    nodes  pub, gen (ghost: which publication this is), parent, pgen (ghost: the parent's
           gen when this node was published), depth, refcount, routed-expert data
    seqs   live, hit length h (the cached prefix), held length, path (the published chain
           the sequence holds, root first: its hit, then the blocks it published)
    slots  Free | Ready(node, boundary, sgen) | Pinned(node, boundary, sgen, owner)
           sgen (ghost): the node's gen when the checkpoint was saved
    clock  the next gen

The union of both transition sets, in any interleaving: ``admit`` (a verified published
chain, pinned; optionally restoring a Ready checkpoint at its last node), ``publish`` (a
commit publishes a free node under the sequence's last node, with routed experts or none),
``save`` (a commit makes a checkpoint Ready on the published node the index gives),
``experts`` (a later commit enriches a published node that carries none), ``restore_issued``,
``free``, ``evict`` (a published leaf nobody holds; its checkpoint is released, stale),
``drop`` (slot pressure releases a Ready checkpoint), ``reset_full``.

A node that is evicted and published again gets a new gen, so "the KV prefix is gone or
different" is exactly "a node of the prefix is unpublished, or its gen is not the one the
checkpoint (or its child) saw". Obligations (``JOINT-*`` rows of ``prove --json``):

* the invariants J-REF, J-TREE, J-GEN, J-HIT, J-CKPT, J-EXP over every operation;
* RESTORE-SAFE over ``admit`` and ``restore_issued``: the restored checkpoint sits on the
  hit's last node, at exactly the hit's depth, that node is published with the gen the
  checkpoint was saved on, and every node of the hit is published and linked to its parent
  with the gen it was published under: the whole KV prefix is present and unchanged;
* EXPERTS (choice 11) over every operation: two states that differ only in routed-expert
  data enable the same steps, reach states that differ only in routed-expert data, and give
  the same match (hit length and restored checkpoint) for every query. Routed experts take
  no part in identity and never change a match.

Bounds: 3 nodes, 2 sequences, 3 slots (one checkpoint per node); depths, gens and expert
data are unbounded integers. Indices of nodes, sequences and slots are symbolic, so each
obligation covers every choice of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import z3

from ..small import Obligation, ScenarioWitnesses, Variant, all_of, any_of
from ..terms import Evaluator, Term

__all__ = [
    "JOINT_IDS",
    "JOINT_OPERATIONS",
    "JOINT_VARIANTS",
    "JState",
    "JointBounds",
    "JointModel",
]


FREE, READY, PINNED = 0, 1, 2
JOINT_OPERATIONS = (
    "init",
    "admit",
    "publish",
    "save",
    "experts",
    "restore_issued",
    "free",
    "evict",
    "drop",
    "reset_full",
)
STATE_IDS = ("J-REF", "J-TREE", "J-GEN", "J-HIT", "J-CKPT", "J-EXP")
JOINT_IDS = (*STATE_IDS, "RESTORE-SAFE", "EXPERTS")
RESTORE_OPS = ("admit", "restore_issued")


@dataclass(frozen=True)
class JointBounds:
    nodes: int = 3
    seqs: int = 2

    def describe(self) -> str:
        return f"{self.nodes} nodes, {self.seqs} sequences, {self.nodes} checkpoint slots"


@dataclass(frozen=True)
class JState:
    pub: tuple[Term, ...]
    gen: tuple[Term, ...]
    par: tuple[Term, ...]
    pgen: tuple[Term, ...]
    dep: tuple[Term, ...]
    rc: tuple[Term, ...]
    exp: tuple[Term, ...]
    live: tuple[Term, ...]
    h: tuple[Term, ...]  # the hit: the cached prefix attached at admission
    held: tuple[Term, ...]  # the published chain the sequence holds: its hit, then its own
    path: tuple[tuple[Term, ...], ...]
    rs: tuple[Term, ...]  # the slot of the sequence's pending restore (-1: none)
    kind: tuple[Term, ...]
    node: tuple[Term, ...]
    bnd: tuple[Term, ...]
    sgen: tuple[Term, ...]
    owner: tuple[Term, ...]
    clock: Term


@dataclass(frozen=True)
class AdmitArgs:
    """Sequence ``s`` attaches the verified chain ``path[:h]`` and restores slot ``r``
    (-1: no restore). The path is whatever INV-MATCH's lookup returned."""

    s: Term
    h: Term
    path: tuple[Term, ...]
    r: Term


@dataclass(frozen=True)
class PublishArgs:
    s: Term
    n: Term  # the free node the commit publishes
    e: Term  # routed-expert data (0: none)


@dataclass(frozen=True)
class SaveArgs:
    t: Term  # the published node the index gives for the reservation's boundary
    f: Term  # the free slot


@dataclass(frozen=True)
class NodeArgs:
    n: Term


@dataclass(frozen=True)
class ExpertArgs:
    n: Term
    e: Term


@dataclass(frozen=True)
class SeqArgs:
    s: Term


@dataclass(frozen=True)
class SlotArgs:
    r: Term


Args = AdmitArgs | PublishArgs | SaveArgs | NodeArgs | ExpertArgs | SeqArgs | SlotArgs | None


@dataclass(frozen=True)
class Query:
    """A prompt whose verified chain is ``path[:h]`` (for the match in EXPERTS)."""

    h: Term
    path: tuple[Term, ...]


@dataclass(frozen=True)
class Step:
    guard: Term
    post: JState
    facts: dict[str, Term]


def sel(xs: Sequence[Term], i: Term) -> Term:
    """``xs[i]`` for a symbolic index (the first entry out of range)."""
    out = xs[0]
    for k in range(1, len(xs)):
        out = z3.If(i == k, xs[k], out)
    return out


def put(xs: Sequence[Term], i: Term, v: Term, cond: Term = True) -> tuple[Term, ...]:
    return tuple(z3.If(z3.And(cond, i == k), v, x) for k, x in enumerate(xs))


class JointModel(ScenarioWitnesses):
    """KV nodes, hits and checkpoints in one transition system (module doc)."""

    name = "joint"

    def __init__(self, bounds: JointBounds | None = None) -> None:
        self.b = bounds or JointBounds()
        self.N, self.S = self.b.nodes, self.b.seqs
        self.K, self.D = self.N, self.N  # one checkpoint per node; chains of at most N

    def describe(self) -> str:
        return self.b.describe()

    # -- terms ------------------------------------------------------------------------------

    def fresh(self, p: str) -> JState:
        N, S, K, D = range(self.N), range(self.S), range(self.K), range(self.D)

        def ints(name: str, r: range) -> tuple[Term, ...]:
            return tuple(z3.Int(f"{p}{name}{i}") for i in r)

        return JState(
            tuple(z3.Bool(f"{p}pub{i}") for i in N),
            ints("gen", N),
            ints("par", N),
            ints("pgen", N),
            ints("dep", N),
            ints("rc", N),
            ints("exp", N),
            tuple(z3.Bool(f"{p}live{s}") for s in S),
            ints("h", S),
            ints("held", S),
            tuple(tuple(z3.Int(f"{p}path{s}_{j}") for j in D) for s in S),
            ints("rs", S),
            ints("kind", K),
            ints("node", K),
            ints("bnd", K),
            ints("sgen", K),
            ints("owner", K),
            z3.Int(f"{p}clock"),
        )

    def fresh_args(self, op: str, p: str = "a.") -> Args:
        def i(name: str) -> Term:
            return z3.Int(f"{p}{name}")

        if op == "admit":
            return AdmitArgs(i("s"), i("h"), tuple(i(f"path{j}") for j in range(self.D)), i("r"))
        if op == "publish":
            return PublishArgs(i("s"), i("n"), i("e"))
        if op == "save":
            return SaveArgs(i("t"), i("f"))
        if op == "experts":
            return ExpertArgs(i("n"), i("e"))
        if op == "evict":
            return NodeArgs(i("n"))
        if op in ("restore_issued", "free"):
            return SeqArgs(i("s"))
        if op == "drop":
            return SlotArgs(i("r"))
        return None

    def fresh_query(self, p: str = "q.") -> Query:
        return Query(z3.Int(f"{p}h"), tuple(z3.Int(f"{p}path{j}") for j in range(self.D)))

    def in_nodes(self, n: Term) -> Term:
        return z3.And(n >= 0, n < self.N)

    def holds(self, x: JState, s: int, n: int) -> Term:
        """How many times sequence ``s``'s hit holds node ``n``."""
        return z3.Sum(
            [
                z3.If(z3.And(x.live[s], j < x.held[s], x.path[s][j] == n), 1, 0)
                for j in range(self.D)
            ]
        )

    def is_leaf(self, x: JState, n: Term) -> Term:
        return all_of([z3.Not(z3.And(x.pub[m], x.par[m] == n)) for m in range(self.N)])

    def chain_ok(self, x: JState, h: Term, path: Sequence[Term]) -> Term:
        """``path[:h]`` is a published chain from a root: depth j+1 at position j, each
        node's parent the previous one. (The lookup's verified hits, INV-MATCH.)"""
        cs = [h >= 0, h <= self.D]
        for j in range(self.D):
            n = path[j]
            here = [self.in_nodes(n), sel(x.pub, n), sel(x.dep, n) == j + 1]
            here.append(sel(x.par, n) == (-1 if j == 0 else path[j - 1]))
            cs.append(z3.Implies(j < h, all_of(here)))
        return all_of(cs)

    def prefix_intact(self, x: JState, h: Term, path: Sequence[Term]) -> Term:
        """Every node of ``path[:h]`` is published and is still the publication its child
        was published under: the KV prefix is present and unchanged."""
        cs = []
        for j in range(self.D):
            n = path[j]
            here = [self.in_nodes(n), sel(x.pub, n), sel(x.dep, n) == j + 1]
            if j == 0:
                here.append(sel(x.par, n) == -1)
            else:
                here += [sel(x.par, n) == path[j - 1], sel(x.pgen, n) == sel(x.gen, path[j - 1])]
            cs.append(z3.Implies(j < h, all_of(here)))
        return all_of(cs)

    def last(self, path: Sequence[Term], h: Term) -> Term:
        return sel(path, h - 1)

    # -- invariants -------------------------------------------------------------------------

    def invariants(self, x: JState) -> dict[str, Term]:
        N, S, K = range(self.N), range(self.S), range(self.K)
        ref = all_of(
            [x.rc[n] == z3.Sum([self.holds(x, s, n) for s in S]) for n in N]
            + [z3.Implies(x.rc[n] > 0, x.pub[n]) for n in N]
        )
        tree = []
        for n in N:
            p = x.par[n]
            tree.append(
                z3.Implies(
                    x.pub[n],
                    z3.And(
                        x.dep[n] >= 1,
                        x.dep[n] <= self.D,
                        (x.dep[n] == 1) == (p == -1),
                        z3.Implies(
                            p != -1,
                            z3.And(
                                self.in_nodes(p),
                                sel(x.pub, p),
                                sel(x.dep, p) == x.dep[n] - 1,
                                sel(x.gen, p) == x.pgen[n],
                            ),
                        ),
                    ),
                )
            )
        gen = [x.clock >= 1]
        gen += [z3.And(x.gen[n] >= 0, x.gen[n] < x.clock) for n in N]
        gen += [z3.Implies(x.kind[k] != FREE, x.sgen[k] < x.clock) for k in K]
        gen += [
            z3.Implies(z3.And(x.pub[n], x.pub[m]), x.gen[n] != x.gen[m])
            for n in N
            for m in N
            if n < m
        ]
        hit = [
            z3.Implies(
                x.live[s],
                z3.And(x.h[s] >= 0, x.h[s] <= x.held[s], self.chain_ok(x, x.held[s], x.path[s])),
            )
            for s in S
        ]
        ck = []
        for k in K:
            nd = x.node[k]
            ck.append(z3.Or(x.kind[k] == FREE, x.kind[k] == READY, x.kind[k] == PINNED))
            ck.append(
                z3.Implies(
                    x.kind[k] != FREE,
                    z3.And(
                        self.in_nodes(nd),
                        sel(x.pub, nd),
                        sel(x.gen, nd) == x.sgen[k],
                        sel(x.dep, nd) == x.bnd[k],
                    ),
                )
            )
            ck.append(z3.Implies(x.kind[k] == READY, x.owner[k] == -1))
            o = x.owner[k]
            ck.append(
                z3.Implies(
                    x.kind[k] == PINNED,
                    z3.And(
                        o >= 0,
                        o < self.S,
                        sel(x.live, o),
                        sel(x.h, o) == x.bnd[k],
                        self.last(
                            [sel([x.path[s][j] for s in S], o) for j in range(self.D)], x.bnd[k]
                        )
                        == nd,
                    ),
                )
            )
            for k2 in K:
                if k < k2:
                    both = z3.And(x.kind[k] != FREE, x.kind[k2] != FREE)
                    ck.append(z3.Implies(both, x.node[k] != x.node[k2]))
                    pinned = z3.And(x.kind[k] == PINNED, x.kind[k2] == PINNED)
                    ck.append(z3.Implies(pinned, x.owner[k] != x.owner[k2]))
        for s in S:
            r = x.rs[s]
            pending = z3.And(r < self.K, sel(x.kind, r) == PINNED, sel(x.owner, r) == s)
            ck.append(z3.If(z3.And(x.live[s], r >= 0), pending, r == -1))
        for k in K:
            ck.append(z3.Implies(x.kind[k] == PINNED, sel(x.rs, x.owner[k]) == k))
        exp = [z3.Implies(x.exp[n] != 0, x.pub[n]) for n in N]
        return {
            "J-REF": ref,
            "J-TREE": all_of(tree),
            "J-GEN": all_of(gen),
            "J-HIT": all_of(hit),
            "J-CKPT": all_of(ck),
            "J-EXP": all_of(exp),
        }

    def inv(self, x: JState) -> Term:
        return all_of(list(self.invariants(x).values()))

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
        """``_on_evicted``: the evicted node's checkpoint is released at once."""
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


# -- broken variants ------------------------------------------------------------------------


class EvictKeepsCheckpoint(JointModel):
    def stale(self, x: JState, k: int, n: Term) -> Term:
        return z3.BoolVal(False)


class EvictHeldNode(JointModel):
    def evictable(self, x: JState, n: Term) -> Term:
        return z3.And(sel(x.pub, n), self.is_leaf(x, n))


class EvictNonLeaf(JointModel):
    def evictable(self, x: JState, n: Term) -> Term:
        return z3.And(sel(x.pub, n), sel(x.rc, n) == 0)


class RestoreByBoundary(JointModel):
    """Checkpoints looked up by token position only, not by the KV node."""

    def restore_source(self, x: JState, a: AdmitArgs) -> Term:
        return sel(x.bnd, a.r) == a.h


class PublishOverPublished(JointModel):
    def publishable(self, x: JState, n: Term) -> Term:
        return sel(x.rc, n) == 0


class SaveOnUnpublished(JointModel):
    def save_target(self, x: JState, t: Term) -> Term:
        return z3.BoolVal(True)


class DropPinned(JointModel):
    def droppable(self, x: JState, r: Term) -> Term:
        return sel(x.kind, r) != FREE


class GenNotFresh(JointModel):
    """A republished node keeps its old gen: a checkpoint could not tell the KV changed."""

    def new_gen(self, x: JState, n: Term) -> Term:
        return sel(x.gen, n)


class MatchPrefersExperts(JointModel):
    """The hit is cut back to the deepest prefix whose nodes all carry routed experts."""

    def cut_for_experts(self, x: JState, q: Query, c: Term) -> Term:
        out = c
        for j in reversed(range(self.D)):
            out = z3.If(z3.And(j < out, sel(x.exp, q.path[j]) == 0), j, out)
        return out


class EvictSparesExperts(JointModel):
    """Eviction skips blocks that carry routed experts."""

    def evictable(self, x: JState, n: Term) -> Term:
        return z3.And(super().evictable(x, n), sel(x.exp, n) == 0)


class AdmitUnverifiedHit(JointModel):
    """The hit's nodes are whatever the hash bucket offered: published, not a chain."""

    def hit_ok(self, x: JState, a: AdmitArgs) -> Term:
        return all_of(
            [
                z3.Implies(j < a.h, z3.And(self.in_nodes(a.path[j]), sel(x.pub, a.path[j])))
                for j in range(self.D)
            ]
            + [a.h >= 0, a.h <= self.D]
        )


class FreeKeepsHolds(JointModel):
    """Freeing a sequence does not give its holds back (a leak: its prefix is never evictable)."""

    def released(self, x: JState, s: Term, n: int) -> Term:
        return z3.IntVal(0)


class EvictKeepsExperts(JointModel):
    def evicted_experts(self, x: JState, n: Term) -> tuple[Term, ...]:
        return tuple(x.exp)


JOINT_VARIANTS = (
    Variant(
        "evict-keeps-checkpoint",
        "J-CKPT",
        "evict",
        "dropped conjunct",
        "eviction does not release the checkpoint on the evicted node",
        EvictKeepsCheckpoint,
    ),
    Variant(
        "evict-held-node",
        "J-CKPT",
        "evict",
        "dropped conjunct",
        "eviction ignores the refcount: a pinned restore's node can go",
        EvictHeldNode,
    ),
    Variant(
        "evict-non-leaf",
        "J-TREE",
        "evict",
        "dropped conjunct",
        "eviction takes a node with published children: a checkpoint's prefix is gone",
        EvictNonLeaf,
    ),
    Variant(
        "restore-by-boundary",
        "RESTORE-SAFE",
        "admit",
        "broken transition",
        "a restore checks the checkpoint's position, not its KV node",
        RestoreByBoundary,
    ),
    Variant(
        "publish-over-published",
        "J-CKPT",
        "publish",
        "dropped conjunct",
        "a commit re-publishes a published node (another identity under its checkpoint)",
        PublishOverPublished,
    ),
    Variant(
        "save-on-unpublished",
        "J-CKPT",
        "save",
        "dropped conjunct",
        "a checkpoint becomes Ready on a node the index does not hold",
        SaveOnUnpublished,
    ),
    Variant(
        "drop-pinned",
        "J-CKPT",
        "drop",
        "broken transition",
        "slot pressure may release a pinned checkpoint",
        DropPinned,
    ),
    Variant(
        "gen-not-fresh",
        "J-GEN",
        "publish",
        "off-by-one",
        "a republished node keeps its old identity instance",
        GenNotFresh,
    ),
    Variant(
        "admit-unverified-hit",
        "J-HIT",
        "admit",
        "dropped conjunct",
        "the hit's nodes are published but not checked to be the prompt's chain",
        AdmitUnverifiedHit,
    ),
    Variant(
        "free-keeps-holds",
        "J-REF",
        "free",
        "broken transition",
        "freeing a sequence does not release its nodes",
        FreeKeepsHolds,
    ),
    Variant(
        "evict-keeps-experts",
        "J-EXP",
        "evict",
        "dropped conjunct",
        "routed experts stay on an evicted node",
        EvictKeepsExperts,
    ),
    Variant(
        "match-prefers-experts",
        "EXPERTS",
        "save",
        "broken transition",
        "the hit is cut back to the nodes that carry routed experts",
        MatchPrefersExperts,
    ),
    Variant(
        "evict-spares-experts",
        "EXPERTS",
        "evict",
        "broken transition",
        "eviction skips nodes that carry routed experts",
        EvictSparesExperts,
    ),
)
