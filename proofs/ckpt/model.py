"""INV-CKPT in Z3: the recurrent-state checkpoint lifecycle of :class:`HybridSpecCache`.

The state-slot pool and the checkpoints are encoded over a bounded number of slots, sequence
slots and nodes (published blocks), with every position counted in blocks::

    slots  kind[s] in Free | Runtime(owner) | Reserved(owner, bnd) | Ready(node, bnd, order)
                      | Pinned(node, bnd, order, owner)
    seqs   live[q], rt[q] (runtime slot), cached[q] (hit, blocks), hit[q] (block_ids[cached-1]),
           comp[q] (num_computed // BS), sp[q] (save_point // BS, 0 = none)
    nodes  pub[n], depth[n]
    clock (the next Ready order) and the five checkpoint counters of ``stats()``

NOTE: the KV side (refcounts, index, tables) is the main encoding's business. Here it is an
*environment*: which blocks an admission or growth evicts, which blocks a commit publishes,
which node the index returns for a reservation and where the save point lies are arguments of
the transitions, constrained only by what the proved KV invariants guarantee (an evicted node
is published and held by no live sequence's hit, a freshly published node was unpublished, the
index returns a published node at the right depth, ``save_point`` lies beyond the computed
tokens). The drift check reads those arguments off the spec's own run.

One transition per spec operation, mirroring ``spec/hybrid.py`` statement by statement:
``_take_slot`` (lowest free slot, else evict the oldest Ready checkpoint), ``_retarget``,
``_on_evicted``, ``admit`` (evict, pin, runtime slot, retarget), ``commit`` (publish, Ready
or discard, retarget), ``restore_issued``, ``free``, ``evict``, ``reset``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

__all__ = [
    "CKPT_IDS",
    "CKPT_OPERATIONS",
    "CKPT_VARIANTS",
    "CkptBounds",
    "CkptModel",
    "CkptProver",
    "CkptVariant",
    "check_ckpt_variant",
]

FREE, RUNTIME, RESERVED, READY, PINNED = range(5)
KIND_NAMES = ("free", "runtime", "reserved", "ready", "pinned")
COUNTERS = ("saved", "discarded", "restored", "stale", "evicted")

CKPT_IDS = (
    "CKPT-SLOTS",
    "CKPT-RESERVED",
    "CKPT-NODE",
    "CKPT-PIN",
    "AUX-HIT",
    "AUX-ORDER",
    "PIN-KEEP",
    "RESTORE-EXACT",
    "ACCEPTED",
)
"""State invariants (INV-CKPT split into its clauses, plus two strengthenings), then the
transition properties: PIN-KEEP (every operation), RESTORE-EXACT (admit), ACCEPTED (commit)."""

STATE_IDS = CKPT_IDS[:6]
TRANSITION_IDS = {"PIN-KEEP": None, "RESTORE-EXACT": "admit", "ACCEPTED": "commit"}

CKPT_OPERATIONS = (
    "init",
    "admit",
    "append",
    "continue_prefill",
    "commit",
    "rollback",
    "restore_issued",
    "free",
    "evict",
    "reset_keep",
    "reset_full",
)
SEQ_OPS = frozenset(
    {"admit", "append", "continue_prefill", "commit", "rollback", "restore_issued", "free"}
)

DEFAULT_RLIMIT = 20_000_000

STRENGTHENINGS = {
    "AUX-HIT": "a live sequence's hit ends at a published node of its depth (what INV-REF and "
    "INV-PUBLISH give the KV side), its computed tokens cover the hit, and its save point "
    "is 0 or lies beyond them. CKPT-RESERVED is not inductive over append, "
    "continue_prefill, commit and rollback without it",
    "AUX-ORDER": "Ready and Pinned checkpoints carry distinct orders below the clock. No "
    "other property needs it; it makes 'the oldest Ready checkpoint' one slot, so the "
    "model's slot-pressure eviction is the spec's (the drift check relies on it)",
}


@dataclass(frozen=True)
class CkptBounds:
    """The model's sizes: ``runtime + budget`` slots, ``seqs`` sequence slots, ``nodes``."""

    runtime: int = 2
    budget: int = 1
    seqs: int = 3
    nodes: int = 4

    @property
    def slots(self) -> int:
        return self.runtime + self.budget

    def describe(self) -> str:
        return (
            f"{self.slots} state slots (max_num_seqs {self.runtime}, state_budget "
            f"{self.budget}), {self.seqs} sequence slots, {self.nodes} nodes"
        )


@dataclass
class CState:
    """One state of the model, as Z3 terms (lists are indexed by slot, sequence, node)."""

    kind: list[Any]
    owner: list[Any]
    node: list[Any]
    bnd: list[Any]
    order: list[Any]
    live: list[Any]
    rt: list[Any]
    cached: list[Any]
    hit: list[Any]
    comp: list[Any]
    sp: list[Any]
    pub: list[Any]
    depth: list[Any]
    clock: Any
    ctr: dict[str, Any]

    @classmethod
    def of(cls, lists: Sequence[list[Any]], clock: Any, ctr: dict[str, Any]) -> CState:
        """The state whose list fields are ``lists``, in ``_LIST_FIELDS`` order."""
        fields: dict[str, Any] = dict(zip(_LIST_FIELDS, lists, strict=True))
        return cls(**fields, clock=clock, ctr=ctr)

    def copy(self) -> CState:
        return CState.of([list(getattr(self, f)) for f in _LIST_FIELDS], self.clock, dict(self.ctr))

    def leaves(self) -> list[Any]:
        out = [x for f in _LIST_FIELDS for x in getattr(self, f)]
        return [*out, self.clock, *(self.ctr[k] for k in COUNTERS)]


_LIST_FIELDS = (
    "kind",
    "owner",
    "node",
    "bnd",
    "order",
    "live",
    "rt",
    "cached",
    "hit",
    "comp",
    "sp",
    "pub",
    "depth",
)
_BOOL_FIELDS = frozenset({"live", "pub"})


def merge(c: Any, a: CState, b: CState) -> CState:
    """``If(c, a, b)`` field by field."""
    out = a.copy()
    for f in _LIST_FIELDS:
        setattr(out, f, [z3.If(c, x, y) for x, y in zip(getattr(a, f), getattr(b, f), strict=True)])
    out.clock = z3.If(c, a.clock, b.clock)
    out.ctr = {k: z3.If(c, a.ctr[k], b.ctr[k]) for k in COUNTERS}
    return out


def _count(conds: Sequence[Any]) -> Any:
    return z3.Sum([z3.If(c, 1, 0) for c in conds]) if conds else z3.IntVal(0)


@dataclass
class Step:
    guard: Any
    post: CState
    facts: dict[str, Any] = field(default_factory=dict)
    """Transition properties of this step (RESTORE-EXACT, ACCEPTED), as formulas."""


class CkptModel:
    """The transition system. Broken variants and seeded drifts override one method each."""

    def __init__(self, bounds: CkptBounds | None = None) -> None:
        self.b = bounds or CkptBounds()
        self.K, self.S, self.M = self.b.slots, self.b.seqs, self.b.nodes

    # -- states and arguments --------------------------------------------------------------

    def fresh(self, prefix: str) -> CState:
        K, S, M = self.K, self.S, self.M
        sizes = {
            "kind": K,
            "owner": K,
            "node": K,
            "bnd": K,
            "order": K,
            "live": S,
            "rt": S,
            "cached": S,
            "hit": S,
            "comp": S,
            "sp": S,
            "pub": M,
            "depth": M,
        }
        lists = [
            [
                (z3.Bool if f in _BOOL_FIELDS else z3.Int)(f"{prefix}{f}[{i}]")
                for i in range(sizes[f])
            ]
            for f in _LIST_FIELDS
        ]
        return CState.of(
            lists, z3.Int(prefix + "clock"), {k: z3.Int(f"{prefix}{k}") for k in COUNTERS}
        )

    def init_state(self) -> CState:
        K, S, M = self.K, self.S, self.M
        z, n1, f = z3.IntVal(0), z3.IntVal(-1), z3.BoolVal(False)
        return CState(
            [z3.IntVal(FREE)] * K,
            [n1] * K,
            [n1] * K,
            [z] * K,
            [z] * K,
            [f] * S,
            [n1] * S,
            [z] * S,
            [n1] * S,
            [z] * S,
            [z] * S,
            [f] * M,
            [z] * M,
            z,
            dict.fromkeys(COUNTERS, z),
        )

    def fresh_args(self, op: str, prefix: str = "a.") -> dict[str, Any]:
        M = self.M
        victims = [z3.Bool(f"{prefix}victim[{n}]") for n in range(M)]
        if op == "admit":
            return {
                "c": z3.Int(prefix + "c"),
                "h": z3.Int(prefix + "h"),
                "r": z3.Int(prefix + "r"),
                "victim": victims,
                "sp": z3.Int(prefix + "sp"),
            }
        if op in ("append", "continue_prefill"):
            return {"victim": victims, "sp": z3.Int(prefix + "sp")}
        if op == "rollback":
            return {"sp": z3.Int(prefix + "sp")}
        if op == "commit":
            return {
                "comp": z3.Int(prefix + "comp"),
                "t": z3.Int(prefix + "t"),
                "sp": z3.Int(prefix + "sp"),
                "newpub": [z3.Bool(f"{prefix}newpub[{n}]") for n in range(M)],
                "ndepth": [z3.Int(f"{prefix}ndepth[{n}]") for n in range(M)],
            }
        if op == "evict":
            return {"victim": victims}
        return {}

    # -- symbolic indexing -----------------------------------------------------------------

    def at_seq(self, idx: Any, f: Callable[..., Any]) -> Any:
        return z3.Or([z3.And(idx == q, f(q)) for q in range(self.S)])

    def at_node(self, idx: Any, f: Callable[..., Any]) -> Any:
        return z3.Or([z3.And(idx == n, f(n)) for n in range(self.M)])

    def at_slot(self, idx: Any, f: Callable[..., Any]) -> Any:
        return z3.Or([z3.And(idx == s, f(s)) for s in range(self.K)])

    @staticmethod
    def restorable(st: CState, s: int) -> Any:
        return z3.Or(st.kind[s] == READY, st.kind[s] == PINNED)

    # -- the invariant ---------------------------------------------------------------------

    def invariants(self, st: CState) -> dict[str, Any]:
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
        slots.append(_count(st.live) <= R)

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
        return {
            "CKPT-SLOTS": z3.And(slots),
            "CKPT-RESERVED": z3.And(reserved),
            "CKPT-NODE": z3.And(node),
            "CKPT-PIN": z3.And(pin),
            "AUX-HIT": z3.And(hit),
            "AUX-ORDER": z3.And(order),
        }

    def inv(self, st: CState) -> Any:
        return z3.And(list(self.invariants(st).values()))

    def pin_keep(self, pre: CState, post: CState) -> Any:
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

    # -- building blocks (spec/hybrid.py, one helper per spec helper) -----------------------

    def drop(self, st: CState, conds: Sequence[Any], counter: str) -> CState:
        """``_drop`` of every slot whose condition holds, counted under ``counter``."""
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, FREE, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
            out.node[s] = z3.If(c, -1, st.node[s])
        out.ctr[counter] = st.ctr[counter] + _count(conds)
        return out

    def evictable(self, st: CState, n: int) -> Any:
        """KV eviction needs a published block with refcount 0 (INV-REF): no live hit holds it."""
        return z3.And(
            st.pub[n], *[z3.Not(z3.And(st.live[q], st.hit[q] == n)) for q in range(self.S)]
        )

    def evict_node(self, st: CState, n: int, c: Any) -> CState:
        """``_on_evicted(n)`` when ``c``: the node goes, its checkpoint is released (stale)."""
        out = self.drop(
            st, [z3.And(c, self.restorable(st, s), st.node[s] == n) for s in range(self.K)], "stale"
        )
        out.pub[n] = z3.If(c, False, st.pub[n])
        return out

    def evict_nodes(self, st: CState, victim: Sequence[Any]) -> tuple[Any, CState]:
        guard = z3.And([z3.Implies(v, self.evictable(st, n)) for n, v in enumerate(victim)])
        for n, v in enumerate(victim):
            st = self.evict_node(st, n, v)
        return guard, st

    def pressure_victim(self, st: CState, s: int) -> Any:
        """Slot ``s`` holds the oldest unpinned Ready checkpoint (``_evict_checkpoint``)."""
        return z3.And(
            st.kind[s] == READY,
            *[
                # NOTE: orders are distinct (AUX-ORDER); the slot tie-break only makes it total
                z3.Implies(
                    st.kind[t] == READY,
                    st.order[s] <= st.order[t] if t > s else st.order[s] < st.order[t],
                )
                for t in range(self.K)
                if t != s
            ],
        )

    def lowest_free(self, st: CState, s: int) -> Any:
        return z3.And(st.kind[s] == FREE, *[st.kind[t] != FREE for t in range(s)])

    def take_slot(self, st: CState, kind: int, owner: Any, bnd: Any) -> tuple[Any, Any, CState]:
        """``_take_slot``: (taken?, slot, state). Evicts a Ready checkpoint when all are held."""
        full = z3.And([st.kind[s] != FREE for s in range(self.K)])
        vic = [z3.And(full, self.pressure_victim(st, s)) for s in range(self.K)]
        can = z3.Or(z3.Not(full), z3.Or(vic))
        st1 = self.drop(st, vic, "evicted")
        first = [self.lowest_free(st1, s) for s in range(self.K)]
        out = st1.copy()
        for s, c in enumerate(first):
            out.kind[s] = z3.If(c, kind, st1.kind[s])
            out.owner[s] = z3.If(c, owner, st1.owner[s])
            out.bnd[s] = z3.If(c, bnd, st1.bnd[s])
        slot = z3.Sum([z3.If(c, s, 0) for s, c in enumerate(first)])
        return can, slot, merge(can, out, st)

    def retarget(self, st: CState, q: int, target: Any) -> CState:
        """``_retarget``: keep the reservation at the save point; a new one is best-effort."""
        cur = [z3.And(st.kind[s] == RESERVED, st.owner[s] == q) for s in range(self.K)]
        keep = z3.Or([z3.And(c, st.bnd[s] == target) for s, c in enumerate(cur)])
        dropped = self.drop(st, cur, "discarded")
        _, _, taken = self.take_slot(dropped, RESERVED, z3.IntVal(q), target)
        return merge(keep, st, merge(target != 0, taken, dropped))

    def save_guard(self, sp: Any, comp: Any) -> Any:
        """``save_point`` returns 0 or a point beyond the computed tokens."""
        return z3.Or(sp == 0, sp > comp)

    # -- the operations --------------------------------------------------------------------

    def hit_depth(self, st: CState, n: int, c: Any) -> Any:
        """The hit's last node ends the hit: it sits at depth ``c``."""
        return st.depth[n] == c

    def pin_guard(self, st: CState, r: Any, h: Any) -> Any:
        """A hybrid hit restores the Ready checkpoint on the hit's last node (``match``)."""
        return self.at_slot(r, lambda s: z3.And(st.kind[s] == READY, st.node[s] == h))

    def admit(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        c, h, r, sp = a["c"], a["h"], a["r"], a["sp"]
        hit_ok = z3.Or(
            z3.And(c == 0, h == -1, r == -1),
            z3.And(
                c >= 1,
                self.at_node(h, lambda n: z3.And(st.pub[n], self.hit_depth(st, n, c))),
                self.pin_guard(st, r, h),
            ),
        )
        vguard, st1 = self.evict_nodes(st, [z3.And(v, h != n) for n, v in enumerate(a["victim"])])
        can, slot, st3, room = self.pin_then_take(st1, q, r)
        out = st3.copy()
        out.live[q], out.rt[q], out.cached[q], out.hit[q] = True, slot, c, h
        out.comp[q], out.sp[q] = c, sp
        post = self.retarget(out, q, sp)
        guard = z3.And(z3.Not(st.live[q]), hit_ok, vguard, self.save_guard(sp, c), room, can)
        exact = z3.Implies(
            c >= 1,
            self.at_slot(
                r,
                lambda s: z3.And(
                    st.kind[s] == READY,
                    st.bnd[s] == c,
                    st.node[s] == h,
                    self.at_node(h, lambda n: st.pub[n]),
                ),
            ),
        )
        return Step(guard, post, {"RESTORE-EXACT": exact})

    def pin_then_take(self, st: CState, q: int, r: Any) -> tuple[Any, Any, CState, Any]:
        """NOTE: the spec pins before it takes the runtime slot, so slot pressure cannot
        evict the very checkpoint this admission restores (variant 'runtime-before-pin')."""
        return self.runtime_slot(self.pin(st, q, r), q)

    def pin(self, st: CState, q: int, r: Any) -> CState:
        out = st.copy()
        for s in range(self.K):
            out.kind[s] = z3.If(r == s, PINNED, st.kind[s])
            out.owner[s] = z3.If(r == s, q, st.owner[s])
        return out

    def runtime_slot(self, st: CState, q: int) -> tuple[Any, Any, CState, Any]:
        """(taken?, slot, state, room): room is ``len(runtime) < max_num_seqs``."""
        room = _count(st.live) < self.b.runtime
        can, slot, out = self.take_slot(st, RUNTIME, z3.IntVal(q), z3.IntVal(0))
        return can, slot, out, room

    def grow(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        """``append`` / ``continue_prefill``: the KV growth may evict nodes; then retarget."""
        vguard, st1 = self.evict_nodes(st, a["victim"])
        st1.sp[q] = a["sp"]
        guard = z3.And(st.live[q], vguard, self.save_guard(a["sp"], st.comp[q]))
        return Step(guard, self.retarget(st1, q, a["sp"]))

    def rollback(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        out = st.copy()
        out.sp[q] = a["sp"]
        guard = z3.And(st.live[q], self.save_guard(a["sp"], st.comp[q]))
        return Step(guard, self.retarget(out, q, a["sp"]))

    def commit(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        comp, t, sp = a["comp"], a["t"], a["sp"]
        newpub, ndepth = a["newpub"], a["ndepth"]
        pguard = z3.And(
            [
                z3.Implies(p, z3.And(self.fresh_block(st, n), ndepth[n] >= 1))
                for n, p in enumerate(newpub)
            ]
        )
        st1 = st.copy()
        for n in range(self.M):
            st1.pub[n] = z3.Or(st.pub[n], newpub[n])
            st1.depth[n] = z3.If(newpub[n], ndepth[n], st.depth[n])
        st1.comp[q] = comp
        cur = [z3.And(st.kind[s] == RESERVED, st.owner[s] == q) for s in range(self.K)]
        covered = [z3.And(c, self.covers(st, s, comp)) for s, c in enumerate(cur)]
        discard = z3.Or(t == -1, self.node_taken(st1, t))
        # the index lookup: None, or the published node at the reservation's depth
        tguard = z3.And(
            [
                z3.Implies(
                    z3.And(c, t != -1),
                    self.at_node(t, lambda n, s=s: z3.And(st1.pub[n], st1.depth[n] == st.bnd[s])),
                )
                for s, c in enumerate(covered)
            ]
        )
        dropped = self.drop(st1, [z3.And(c, discard) for c in covered], "discarded")
        ready = self.make_ready(st1, [z3.And(c, z3.Not(discard)) for c in covered], t)
        st2 = merge(discard, dropped, ready)
        st2.sp[q] = sp
        post = self.retarget(st2, q, sp)
        guard = z3.And(
            st.live[q],
            comp >= st.comp[q],
            pguard,
            tguard,
            self.save_guard(sp, comp),
            t >= -1,
            t < self.M,
        )
        accepted = z3.And(
            [
                z3.Implies(z3.And(st.kind[s] == RESERVED, st2.kind[s] == READY), st.bnd[s] <= comp)
                for s in range(self.K)
            ]
        )
        return Step(guard, post, {"ACCEPTED": accepted})

    def node_taken(self, st: CState, t: Any) -> Any:
        """``_ckpt_at(node)``: the node already carries a checkpoint (an equal one)."""
        return z3.Or([z3.And(self.restorable(st, s), st.node[s] == t) for s in range(self.K)])

    def fresh_block(self, st: CState, n: int) -> Any:
        """A commit publishes only blocks that were unpublished (INV-WRITE)."""
        return z3.Not(st.pub[n])

    def covers(self, st: CState, s: int, comp: Any) -> Any:
        """A commit covers a reservation whose boundary it reaches."""
        return st.bnd[s] <= comp

    def make_ready(self, st: CState, conds: Sequence[Any], t: Any) -> CState:
        out = st.copy()
        any_ready = z3.Or(list(conds))
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
            out.node[s] = z3.If(c, t, st.node[s])
            out.order[s] = z3.If(c, st.clock, st.order[s])
        out.clock = z3.If(any_ready, st.clock + 1, st.clock)
        out.ctr["saved"] = st.ctr["saved"] + _count(conds)
        return out

    def restore_issued(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        pinned = [z3.And(st.kind[s] == PINNED, st.owner[s] == q) for s in range(self.K)]
        out = self.unpin(st, pinned)
        out.ctr["restored"] = st.ctr["restored"] + _count(pinned)
        return Step(z3.And(st.live[q], z3.Or(pinned)), out)

    def unpin(self, st: CState, conds: Sequence[Any]) -> CState:
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
        return out

    def release_seq(self, st: CState, q: int) -> CState:
        """``_release_seq``: runtime slot back, reservation discarded, restore abandoned."""
        rt = [z3.And(st.kind[s] == RUNTIME, st.rt[q] == s) for s in range(self.K)]
        out = st.copy()
        for s, c in enumerate(rt):
            out.kind[s] = z3.If(c, FREE, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
        out = self.drop(
            out,
            [z3.And(out.kind[s] == RESERVED, out.owner[s] == q) for s in range(self.K)],
            "discarded",
        )
        out = self.unpin(
            out, [z3.And(out.kind[s] == PINNED, out.owner[s] == q) for s in range(self.K)]
        )
        out.live[q], out.rt[q], out.cached[q], out.hit[q] = False, -1, 0, -1
        out.comp[q], out.sp[q] = 0, 0
        return out

    def free(self, st: CState, q: int, a: dict[str, Any]) -> Step:
        return Step(st.live[q], self.release_seq(st, q))

    def evict(self, st: CState, a: dict[str, Any]) -> Step:
        guard, out = self.evict_nodes(st, a["victim"])
        return Step(guard, out)

    def reset_keep(self, st: CState, a: dict[str, Any]) -> Step:
        out = st
        for q in range(self.S):
            out = merge(st.live[q], self.release_seq(out, q), out)
        return Step(z3.BoolVal(True), out)

    def reset_full(self, st: CState, a: dict[str, Any]) -> Step:
        """Every node goes, so does every (Ready) checkpoint, counted stale."""
        out = self.drop(st, [st.kind[s] != FREE for s in range(self.K)], "stale")
        for n in range(self.M):
            out.pub[n] = z3.BoolVal(False)
        return Step(z3.Not(z3.Or(st.live)), out)

    def step(self, op: str, st: CState, q: int, a: dict[str, Any]) -> Step:
        if op in ("append", "continue_prefill"):
            return self.grow(st, q, a)
        fn = getattr(self, op)
        return fn(st, q, a) if op in SEQ_OPS else fn(st, a)  # type: ignore[no-any-return]

    def seq_range(self, op: str) -> range:
        return range(self.S) if op in SEQ_OPS else range(1)

    # -- equality of a model state with a concrete one (drift) ------------------------------

    def same(self, a: CState, b: CState) -> Any:
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


# -- reading and printing concrete states ---------------------------------------------------


def read_state(st: CState, ev: Callable[[Any], Any]) -> dict[str, Any]:
    """A concrete state (plain ints and bools) from an evaluator of Z3 terms."""

    def val(x: Any) -> Any:
        if not z3.is_expr(x):  # a plain value the transition assigned
            return x
        v = ev(x)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()

    out: dict[str, Any] = {f: [val(x) for x in getattr(st, f)] for f in _LIST_FIELDS}
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


def _format_args(args: dict[str, Any], ev: Callable[[Any], Any]) -> str:
    parts = []
    for k, v in args.items():
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
        self._steps: dict[tuple[str, int], tuple[CState, dict[str, Any], Step, Any, Any]] = {}

    def _built(self, op: str, q: int) -> tuple[CState, dict[str, Any], Step, Any, Any]:
        """The step's formulas, built once per (operation, sequence slot)."""
        key = (op, q)
        if key not in self._steps:
            m = self.model
            pre = m.fresh("p.")
            args = m.fresh_args(op)
            st = m.step(op, pre, q, args)
            self._steps[key] = (pre, args, st, z3.And(m.inv(pre), st.guard), m.invariants(st.post))
        return self._steps[key]

    def goal(self, prop: str, op: str, q: int) -> tuple[Any, Any, CState, Step, dict[str, Any]]:
        """(hypothesis, conclusion, pre, step, args) of one obligation for sequence slot q."""
        m = self.model
        if op == "init":
            init = m.init_state()
            return (
                z3.BoolVal(True),
                m.invariants(init)[prop],
                init,
                Step(z3.BoolVal(True), init),
                {},
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

    def scenario(self, op: str, pre: CState, st: Step, args: dict[str, Any]) -> tuple[str, Any]:
        """Each operation's interesting case: the part of the guard that exercises INV-CKPT."""
        K, M = self.model.K, self.model.M
        stale = z3.Or([z3.And(st.post.kind[s] == FREE, pre.kind[s] == READY) for s in range(K)])
        if op == "admit":
            return (
                "a hit restores a Ready checkpoint and the runtime slot evicts another",
                z3.And(args["r"] >= 0, st.post.ctr["evicted"] > pre.ctr["evicted"]),
            )
        if op in ("append", "continue_prefill", "evict"):
            return (
                "the growth evicts a node whose checkpoint goes stale",
                z3.And(z3.Or(args["victim"]), stale),
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


class FreeReleasesPinned(CkptModel):
    def release_seq(self, st: CState, q: int) -> CState:
        out = st.copy()
        pinned = [z3.And(st.kind[s] == PINNED, st.owner[s] == q) for s in range(self.K)]
        return super().release_seq(self.drop(out, pinned, "discarded"), q)


class RestoreReserved(CkptModel):
    def pin_guard(self, st: CState, r: Any, h: Any) -> Any:
        return self.at_slot(
            r, lambda s: z3.And(z3.Or(st.kind[s] == READY, st.kind[s] == RESERVED), st.node[s] == h)
        )


class PressureEvictsPinned(CkptModel):
    def pressure_victim(self, st: CState, s: int) -> Any:
        return z3.And(
            self.restorable(st, s),
            *[
                z3.Implies(
                    self.restorable(st, t),
                    st.order[s] <= st.order[t] if t > s else st.order[s] < st.order[t],
                )
                for t in range(self.K)
                if t != s
            ],
        )


class EvictHeldNode(CkptModel):
    def evictable(self, st: CState, n: int) -> Any:
        return st.pub[n]


class RuntimeBeforePin(CkptModel):
    def pin_then_take(self, st: CState, q: int, r: Any) -> tuple[Any, Any, CState, Any]:
        can, slot, out, room = self.runtime_slot(st, q)
        return can, slot, self.pin(out, q, r), room


class ReadyUncovered(CkptModel):
    def covers(self, st: CState, s: int, comp: Any) -> Any:
        return z3.BoolVal(True)


class OrderNotAdvanced(CkptModel):
    def make_ready(self, st: CState, conds: Sequence[Any], t: Any) -> CState:
        out = super().make_ready(st, conds, t)
        out.clock = st.clock
        return out


class NoLiveLimit(CkptModel):
    def runtime_slot(self, st: CState, q: int) -> tuple[Any, Any, CState, Any]:
        can, slot, out, _ = super().runtime_slot(st, q)
        return can, slot, out, z3.BoolVal(True)


class RetargetKeepsOld(CkptModel):
    def drop(self, st: CState, conds: Sequence[Any], counter: str) -> CState:
        return st if counter == "discarded" else super().drop(st, conds, counter)


class UnpinKeepsOwner(CkptModel):
    def unpin(self, st: CState, conds: Sequence[Any]) -> CState:
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
        return out


class SavePointAtComputed(CkptModel):
    def save_guard(self, sp: Any, comp: Any) -> Any:
        return z3.Or(sp == 0, sp >= comp)


class HitDepthOffByOne(CkptModel):
    def hit_depth(self, st: CState, n: int, c: Any) -> Any:
        return st.depth[n] == c + 1


class RepublishNode(CkptModel):
    def node_taken(self, st: CState, t: Any) -> Any:
        """``_ckpt_at(node)``: the node already carries a checkpoint (an equal one)."""
        return z3.Or([z3.And(self.restorable(st, s), st.node[s] == t) for s in range(self.K)])

    def fresh_block(self, st: CState, n: int) -> Any:
        return z3.BoolVal(True)


@dataclass(frozen=True)
class CkptVariant:
    name: str
    invariant: str
    step: str
    kind: str
    description: str
    model: type[CkptModel]


CKPT_VARIANTS = (
    CkptVariant(
        "free-releases-pinned",
        "PIN-KEEP",
        "free",
        "broken transition",
        "freeing a sequence releases its pinned checkpoint",
        FreeReleasesPinned,
    ),
    CkptVariant(
        "restore-reserved",
        "RESTORE-EXACT",
        "admit",
        "broken transition",
        "a hit may restore a Reserved checkpoint",
        RestoreReserved,
    ),
    CkptVariant(
        "pressure-evicts-pinned",
        "PIN-KEEP",
        "admit",
        "broken transition",
        "slot pressure evicts the oldest Ready or Pinned checkpoint",
        PressureEvictsPinned,
    ),
    CkptVariant(
        "evict-held-node",
        "PIN-KEEP",
        "evict",
        "dropped conjunct",
        "KV eviction ignores that a live hit holds the node",
        EvictHeldNode,
    ),
    CkptVariant(
        "runtime-before-pin",
        "CKPT-SLOTS",
        "admit",
        "broken transition",
        "admit takes the runtime slot before it pins the restore source",
        RuntimeBeforePin,
    ),
    CkptVariant(
        "ready-uncovered",
        "ACCEPTED",
        "commit",
        "dropped conjunct",
        "a commit readies a reservation it does not reach",
        ReadyUncovered,
    ),
    CkptVariant(
        "order-not-advanced",
        "AUX-ORDER",
        "commit",
        "off-by-one",
        "a new Ready checkpoint does not advance the order clock",
        OrderNotAdvanced,
    ),
    CkptVariant(
        "no-live-limit",
        "CKPT-SLOTS",
        "admit",
        "dropped conjunct",
        "admit does not check max_num_seqs",
        NoLiveLimit,
    ),
    CkptVariant(
        "retarget-keeps-old",
        "CKPT-RESERVED",
        "rollback",
        "broken transition",
        "a reservation is never discarded when the save point moves",
        RetargetKeepsOld,
    ),
    CkptVariant(
        "unpin-keeps-owner",
        "CKPT-NODE",
        "restore_issued",
        "broken transition",
        "restore_issued leaves the owner on the Ready checkpoint",
        UnpinKeepsOwner,
    ),
    CkptVariant(
        "save-point-at-computed",
        "AUX-HIT",
        "rollback",
        "off-by-one",
        "a save point may equal the computed tokens",
        SavePointAtComputed,
    ),
    CkptVariant(
        "hit-depth-off-by-one",
        "CKPT-PIN",
        "admit",
        "off-by-one",
        "the hit's last node sits one block deeper than the hit",
        HitDepthOffByOne,
    ),
    CkptVariant(
        "republish-node",
        "CKPT-NODE",
        "commit",
        "dropped conjunct",
        "a commit may re-publish a node that carries a checkpoint",
        RepublishNode,
    ),
)


@dataclass
class CkptVariantResult:
    variant: CkptVariant
    row: CkptRow

    @property
    def caught(self) -> bool:
        return self.row.status == "counterexample"


def check_ckpt_variant(
    v: CkptVariant, bounds: CkptBounds | None = None, rlimit: int = DEFAULT_RLIMIT
) -> CkptVariantResult:
    """The variant's obligation must yield a counterexample."""
    return CkptVariantResult(v, CkptProver(v.model(bounds), rlimit).prove(v.invariant, v.step))
