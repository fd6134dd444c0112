"""The joint model's invariants as formulas: J-REF, J-TREE, J-GEN, J-HIT, J-CKPT and J-EXP
(the module doc of :mod:`.model` says what each ties together)."""

from __future__ import annotations

import z3

from ..small import all_of
from ..terms import Term
from .model import (
    FREE,
    PINNED,
    READY,
    JointBase,
    JState,
    sel,
)

__all__ = ["JointFormulas"]


class JointFormulas(JointBase):
    """The invariants J-REF, J-TREE, J-GEN, J-HIT, J-CKPT and J-EXP of one state."""

    def invariants(self, x: JState) -> dict[str, Term]:
        return {
            "J-REF": self.inv_ref(x),
            "J-TREE": all_of(self.inv_tree(x)),
            "J-GEN": all_of(self.inv_gen(x)),
            "J-HIT": all_of(self.inv_hit(x)),
            "J-CKPT": all_of(self.inv_ckpt(x)),
            "J-EXP": all_of([z3.Implies(x.exp[n] != 0, x.pub[n]) for n in range(self.N)]),
        }

    def inv_ref(self, x: JState) -> Term:
        """J-REF: a node's refcount is the number of sequences holding it; held is published."""
        N, S = range(self.N), range(self.S)
        return all_of(
            [x.rc[n] == z3.Sum([self.holds(x, s, n) for s in S]) for n in N]
            + [z3.Implies(x.rc[n] > 0, x.pub[n]) for n in N]
        )

    def inv_tree(self, x: JState) -> list[Term]:
        """J-TREE: a published node's parent is published, one level up, with the gen the
        node saw when it was published."""
        tree = []
        for n in range(self.N):
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
        return tree

    def inv_gen(self, x: JState) -> list[Term]:
        """J-GEN: gens are below the clock, and published nodes have distinct gens."""
        N, K = range(self.N), range(self.K)
        gen = [x.clock >= 1]
        gen += [z3.And(x.gen[n] >= 0, x.gen[n] < x.clock) for n in N]
        gen += [z3.Implies(x.kind[k] != FREE, x.sgen[k] < x.clock) for k in K]
        gen += [
            z3.Implies(z3.And(x.pub[n], x.pub[m]), x.gen[n] != x.gen[m])
            for n in N
            for m in N
            if n < m
        ]
        return gen

    def inv_hit(self, x: JState) -> list[Term]:
        """J-HIT: a live sequence's hit is a prefix of the published chain it holds."""
        return [
            z3.Implies(
                x.live[s],
                z3.And(x.h[s] >= 0, x.h[s] <= x.held[s], self.chain_ok(x, x.held[s], x.path[s])),
            )
            for s in range(self.S)
        ]

    def inv_ckpt(self, x: JState) -> list[Term]:
        """J-CKPT: each checkpoint sits on a published node at its boundary, saved on that
        node's gen; a Pinned one on its owner's hit; one per node, one pinned per owner; and
        a sequence's pending restore is the slot it pins."""
        S, K = range(self.S), range(self.K)
        ck = []
        for k in K:
            ck += self.ckpt_slot(x, k)
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
        return ck

    def ckpt_slot(self, x: JState, k: int) -> list[Term]:
        """J-CKPT's clauses of slot ``k`` alone."""
        S = range(self.S)
        nd, o = x.node[k], x.owner[k]
        return [
            z3.Or(x.kind[k] == FREE, x.kind[k] == READY, x.kind[k] == PINNED),
            z3.Implies(
                x.kind[k] != FREE,
                z3.And(
                    self.in_nodes(nd),
                    sel(x.pub, nd),
                    sel(x.gen, nd) == x.sgen[k],
                    sel(x.dep, nd) == x.bnd[k],
                ),
            ),
            z3.Implies(x.kind[k] == READY, x.owner[k] == -1),
            z3.Implies(
                x.kind[k] == PINNED,
                z3.And(
                    o >= 0,
                    o < self.S,
                    sel(x.live, o),
                    sel(x.h, o) == x.bnd[k],
                    self.last([sel([x.path[s][j] for s in S], o) for j in range(self.D)], x.bnd[k])
                    == nd,
                ),
            ),
        ]

    def inv(self, x: JState) -> Term:
        return all_of(list(self.invariants(x).values()))
