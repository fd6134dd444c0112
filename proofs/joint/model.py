"""The joint KV + checkpoint model: its state, data types and terms (INV-CKPT's restore
safety over every interleaving).

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

from collections.abc import Sequence
from dataclasses import dataclass

import z3

from ..small import all_of
from ..terms import Term

__all__ = [
    "FREE",
    "JOINT_IDS",
    "JOINT_OPERATIONS",
    "PINNED",
    "READY",
    "RESTORE_OPS",
    "STATE_IDS",
    "AdmitArgs",
    "Args",
    "ExpertArgs",
    "JState",
    "JointBase",
    "JointBounds",
    "NodeArgs",
    "PublishArgs",
    "Query",
    "SaveArgs",
    "SeqArgs",
    "SlotArgs",
    "Step",
    "put",
    "sel",
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


class JointBase:
    """The model's bounds, fresh terms and the helpers its formulas share (chains, holds)."""

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
