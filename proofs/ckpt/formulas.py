"""INV-CKPT as formulas: its clauses over one state, and the two-state PIN-KEEP.

:meth:`CkptFormulas.invariants` splits INV-CKPT into its clauses (``CKPT-*``) plus the two
strengthenings the induction needs (``AUX-*``, :data:`~.model.STRENGTHENINGS`).
"""

from __future__ import annotations

from typing import Any

import z3

from ..terms import Term
from .model import (
    COUNTERS,
    FREE,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    CState,
    SpecDecisions,
    count_true,
)

__all__ = ["CkptFormulas"]


class CkptFormulas(SpecDecisions):
    """The invariant formulas; :class:`~.transitions.CkptModel` adds the transitions."""

    def invariants(self, st: CState) -> dict[str, Any]:
        return {
            "CKPT-SLOTS": z3.And(self.slots_clauses(st)),
            "CKPT-RESERVED": z3.And(self.reserved_clauses(st)),
            "CKPT-NODE": z3.And(self.node_clauses(st)),
            "CKPT-PIN": z3.And(self.pin_clauses(st)),
            "AUX-HIT": z3.And(self.hit_clauses(st)),
            "AUX-ORDER": z3.And(self.order_clauses(st)),
        }

    def slots_clauses(self, st: CState) -> list[Any]:
        """CKPT-SLOTS: a slot's kind is one of the five; a Runtime slot and its live owner
        point at each other; at most ``runtime`` live sequences."""
        K, S, R = self.K, self.S, self.b.runtime
        slots = []
        for s in range(K):
            slots.append(z3.And(st.kind[s] >= FREE, st.kind[s] <= PINNED))
            slots.append(
                z3.Implies(
                    st.kind[s] == RUNTIME,
                    self.at_seq(st.owner[s], lambda q, s=s: z3.And(st.live[q], st.rt[q] == s)),
                )
            )
        for q in range(S):
            slots.append(
                z3.Implies(
                    st.live[q],
                    self.at_slot(
                        st.rt[q], lambda s, q=q: z3.And(st.kind[s] == RUNTIME, st.owner[s] == q)
                    ),
                )
            )
        slots.append(count_true(st.live) <= R)
        return slots

    def reserved_clauses(self, st: CState) -> list[Any]:
        """CKPT-RESERVED: a Reserved slot belongs to a live sequence, at its save point; one
        per sequence."""
        K = self.K
        reserved = []
        for s in range(K):
            reserved.append(
                z3.Implies(
                    st.kind[s] == RESERVED,
                    z3.And(
                        st.bnd[s] >= 1,
                        self.at_seq(
                            st.owner[s], lambda q, s=s: z3.And(st.live[q], st.sp[q] == st.bnd[s])
                        ),
                    ),
                )
            )
            for t in range(s + 1, K):
                reserved.append(
                    z3.Not(
                        z3.And(
                            st.kind[s] == RESERVED,
                            st.kind[t] == RESERVED,
                            st.owner[s] == st.owner[t],
                        )
                    )
                )
        return reserved

    def node_clauses(self, st: CState) -> list[Any]:
        """CKPT-NODE: a restorable checkpoint sits on a published node at its boundary; a Ready
        one has no owner; one per node."""
        K = self.K
        node = []
        for s in range(K):
            node.append(
                z3.Implies(
                    self.restorable(st, s),
                    z3.And(
                        st.bnd[s] >= 1,
                        self.at_node(
                            st.node[s], lambda n, s=s: z3.And(st.pub[n], st.depth[n] == st.bnd[s])
                        ),
                    ),
                )
            )
            node.append(z3.Implies(st.kind[s] == READY, st.owner[s] == -1))
            for t in range(s + 1, K):
                node.append(
                    z3.Not(
                        z3.And(
                            self.restorable(st, s), self.restorable(st, t), st.node[s] == st.node[t]
                        )
                    )
                )
        return node

    def pin_clauses(self, st: CState) -> list[Any]:
        """CKPT-PIN: a Pinned checkpoint is its live owner's hit; one per owner."""
        K = self.K
        pin = []
        for s in range(K):
            pin.append(
                z3.Implies(
                    st.kind[s] == PINNED,
                    self.at_seq(
                        st.owner[s],
                        lambda q, s=s: z3.And(
                            st.live[q], st.cached[q] == st.bnd[s], st.hit[q] == st.node[s]
                        ),
                    ),
                )
            )
            for t in range(s + 1, K):
                pin.append(
                    z3.Not(
                        z3.And(
                            st.kind[s] == PINNED, st.kind[t] == PINNED, st.owner[s] == st.owner[t]
                        )
                    )
                )
        return pin

    def hit_clauses(self, st: CState) -> list[Any]:
        """AUX-HIT: a live sequence's hit is a published node at its cached depth (none when
        nothing is cached), within its computed blocks; its save point, if any, is ahead."""
        S = self.S
        hit = []
        for q in range(S):
            hit.append(
                z3.Implies(
                    st.live[q],
                    z3.And(
                        st.comp[q] >= st.cached[q],
                        z3.Or(st.sp[q] == 0, st.sp[q] > st.comp[q]),
                        z3.Or(
                            z3.And(st.cached[q] == 0, st.hit[q] == -1),
                            z3.And(
                                st.cached[q] >= 1,
                                self.at_node(
                                    st.hit[q],
                                    lambda n, q=q: z3.And(st.pub[n], st.depth[n] == st.cached[q]),
                                ),
                            ),
                        ),
                    ),
                )
            )
        return hit

    def order_clauses(self, st: CState) -> list[Any]:
        """AUX-ORDER: restorable checkpoints have distinct orders below the clock."""
        K = self.K
        order = [st.clock >= 0]
        for s in range(K):
            order.append(
                z3.Implies(self.restorable(st, s), z3.And(st.order[s] >= 0, st.order[s] < st.clock))
            )
            for t in range(s + 1, K):
                order.append(
                    z3.Not(
                        z3.And(
                            self.restorable(st, s),
                            self.restorable(st, t),
                            st.order[s] == st.order[t],
                        )
                    )
                )
        return order

    def inv(self, st: CState) -> Term:
        return z3.And(list(self.invariants(st).values()))

    def pin_keep(self, pre: CState, post: CState) -> Term:
        """A pinned checkpoint stays put: pinned, or unpinned (Ready) on the same node."""
        return z3.And(
            [
                z3.Implies(
                    pre.kind[s] == PINNED,
                    z3.And(
                        z3.Or(post.kind[s] == PINNED, post.kind[s] == READY),
                        post.node[s] == pre.node[s],
                        post.bnd[s] == pre.bnd[s],
                    ),
                )
                for s in range(self.K)
            ]
        )

    def same(self, a: CState, b: CState) -> Term:
        """Equal on what the spec observes: fields that matter for each slot's kind."""
        out = [a.clock == b.clock, *[a.ctr[k] == b.ctr[k] for k in COUNTERS]]
        for s in range(self.K):
            k = b.kind[s]
            out += [
                a.kind[s] == k,
                z3.Implies(
                    z3.Or(k == RUNTIME, k == RESERVED, k == PINNED), a.owner[s] == b.owner[s]
                ),
                z3.Implies(z3.Or(k == RESERVED, k == READY, k == PINNED), a.bnd[s] == b.bnd[s]),
                z3.Implies(
                    z3.Or(k == READY, k == PINNED),
                    z3.And(a.node[s] == b.node[s], a.order[s] == b.order[s]),
                ),
            ]
        for q in range(self.S):
            out += [
                a.live[q] == b.live[q],
                z3.Implies(
                    b.live[q],
                    z3.And(
                        a.rt[q] == b.rt[q],
                        a.cached[q] == b.cached[q],
                        a.hit[q] == b.hit[q],
                        a.comp[q] == b.comp[q],
                        a.sp[q] == b.sp[q],
                    ),
                ),
            ]
        for n in range(self.M):
            out += [a.pub[n] == b.pub[n], z3.Implies(b.pub[n], a.depth[n] == b.depth[n])]
        return z3.And(out)
