"""INV-CKPT in Z3: the checkpoint lifecycle of :class:`~prefixkv.spec.HybridSpecCache`.

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

One transition per spec operation, mirroring the spec's checkpoint store
(``spec/checkpoint_store.py``, through the hooks ``SpecCache`` calls) statement by statement:
``_take_slot`` (lowest free slot, else evict the oldest Ready checkpoint), ``on_reserve``,
``on_evict``, ``admit`` (evict, pin, runtime slot, reserve), ``commit`` (publish, Ready
or discard, reserve), ``restore_issued``, ``free``, ``evict``, ``reset``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import z3

from ..terms import BoolTerm, IntTerm, Term

__all__ = [
    "CKPT_IDS",
    "CKPT_OPERATIONS",
    "COUNTERS",
    "AdmitArgs",
    "CState",
    "CkptArgs",
    "CkptBase",
    "CkptBounds",
    "CommitArgs",
    "EvictArgs",
    "GrowArgs",
    "NoArgs",
    "RollbackArgs",
    "SpecDecisions",
    "Step",
    "count_true",
    "merge",
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

    kind: list[Term]
    owner: list[Term]
    node: list[Term]
    bnd: list[Term]
    order: list[Term]
    live: list[Term]
    rt: list[Term]
    cached: list[Term]
    hit: list[Term]
    comp: list[Term]
    sp: list[Term]
    pub: list[Term]
    depth: list[Term]
    clock: Term
    ctr: dict[str, Any]

    @classmethod
    def of(cls, lists: Sequence[list[Term]], clock: Term, ctr: dict[str, Any]) -> CState:
        """The state whose list fields are ``lists``, in ``LIST_FIELDS`` order."""
        fields: dict[str, Any] = dict(zip(LIST_FIELDS, lists, strict=True))
        return cls(**fields, clock=clock, ctr=ctr)

    def copy(self) -> CState:
        return CState.of([list(getattr(self, f)) for f in LIST_FIELDS], self.clock, dict(self.ctr))

    def leaves(self) -> list[Term]:
        out = [x for f in LIST_FIELDS for x in getattr(self, f)]
        return [*out, self.clock, *(self.ctr[k] for k in COUNTERS)]


LIST_FIELDS = (
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
BOOL_FIELDS = frozenset({"live", "pub"})


def merge(c: Term, a: CState, b: CState) -> CState:
    """``If(c, a, b)`` field by field."""
    out = a.copy()
    for f in LIST_FIELDS:
        setattr(out, f, [z3.If(c, x, y) for x, y in zip(getattr(a, f), getattr(b, f), strict=True)])
    out.clock = z3.If(c, a.clock, b.clock)
    out.ctr = {k: z3.If(c, a.ctr[k], b.ctr[k]) for k in COUNTERS}
    return out


def count_true(conds: Sequence[Term]) -> Term:
    """How many of ``conds`` hold, as a term."""
    return z3.Sum([z3.If(c, 1, 0) for c in conds]) if conds else z3.IntVal(0)


# -- the arguments of a transition: what the KV side decides --------------------------------


class AdmitArgs(NamedTuple):
    """admit: the hit (``c`` blocks ending at node ``h``), the restore slot ``r`` (-1 for
    none), which nodes the admission evicts, and the save point ``sp``."""

    c: IntTerm
    h: IntTerm
    r: IntTerm
    victim: list[BoolTerm]
    sp: IntTerm


class GrowArgs(NamedTuple):
    """append and continue_prefill: the nodes the growth evicts and the new save point."""

    victim: list[BoolTerm]
    sp: IntTerm


class RollbackArgs(NamedTuple):
    """rollback: the save point after the tail shrinks."""

    sp: IntTerm


class CommitArgs(NamedTuple):
    """commit: computed blocks ``comp``, the node ``t`` the index returns for the reservation,
    the new save point, and which nodes the commit publishes, at which depths."""

    comp: IntTerm
    t: IntTerm
    sp: IntTerm
    newpub: list[BoolTerm]
    ndepth: list[IntTerm]


class EvictArgs(NamedTuple):
    """evict: which nodes go."""

    victim: list[BoolTerm]


class NoArgs(NamedTuple):
    """An operation the environment does not steer (restore_issued, free, reset)."""


CkptArgs = AdmitArgs | GrowArgs | RollbackArgs | CommitArgs | EvictArgs | NoArgs
"""The arguments of any transition (:meth:`CkptBase.fresh_args`)."""


@dataclass
class Step:
    guard: Term
    post: CState
    facts: dict[str, Any] = field(default_factory=dict)
    """Transition properties of this step (RESTORE-EXACT, ACCEPTED), as formulas."""


class CkptBase:
    """The model's bounds, fresh states and arguments, and symbolic indexing;
    :class:`~.transitions.CkptModel` is the whole model."""

    def __init__(self, bounds: CkptBounds | None = None) -> None:
        self.b = bounds or CkptBounds()
        self.K, self.S, self.M = self.b.slots, self.b.seqs, self.b.nodes

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
                (z3.Bool if f in BOOL_FIELDS else z3.Int)(f"{prefix}{f}[{i}]")
                for i in range(sizes[f])
            ]
            for f in LIST_FIELDS
        ]
        return CState.of(
            lists, z3.Int(prefix + "clock"), {k: z3.Int(f"{prefix}{k}") for k in COUNTERS}
        )

    def fresh_args(self, op: str, prefix: str = "a.") -> CkptArgs:
        """Fresh variables for the environment of ``op`` (what the KV side decides)."""
        M = self.M
        victims = [z3.Bool(f"{prefix}victim[{n}]") for n in range(M)]
        if op == "admit":
            return AdmitArgs(
                z3.Int(prefix + "c"),
                z3.Int(prefix + "h"),
                z3.Int(prefix + "r"),
                victims,
                z3.Int(prefix + "sp"),
            )
        if op in ("append", "continue_prefill"):
            return GrowArgs(victims, z3.Int(prefix + "sp"))
        if op == "rollback":
            return RollbackArgs(z3.Int(prefix + "sp"))
        if op == "commit":
            return CommitArgs(
                z3.Int(prefix + "comp"),
                z3.Int(prefix + "t"),
                z3.Int(prefix + "sp"),
                [z3.Bool(f"{prefix}newpub[{n}]") for n in range(M)],
                [z3.Int(f"{prefix}ndepth[{n}]") for n in range(M)],
            )
        if op == "evict":
            return EvictArgs(victims)
        return NoArgs()

    def at_seq(self, idx: Term, f: Callable[..., Term]) -> Term:
        return z3.Or([z3.And(idx == q, f(q)) for q in range(self.S)])

    def at_node(self, idx: Term, f: Callable[..., Term]) -> Term:
        return z3.Or([z3.And(idx == n, f(n)) for n in range(self.M)])

    def at_slot(self, idx: Term, f: Callable[..., Term]) -> Term:
        return z3.Or([z3.And(idx == s, f(s)) for s in range(self.K)])

    @staticmethod
    def restorable(st: CState, s: int) -> Term:
        return z3.Or(st.kind[s] == READY, st.kind[s] == PINNED)

    def seq_range(self, op: str) -> range:
        return range(self.S) if op in SEQ_OPS else range(1)


# == decision points of the spec ===========================================================


class SpecDecisions(CkptBase):
    """The spec's decision points (``spec/checkpoint_store.py``): one hook per choice it
    makes.

    Broken variants (:mod:`.broken`) and seeded drifts (:mod:`.drift`) override these to
    make a different choice, and the proofs or the drift check must notice. Three variants
    replace a step of :mod:`.transitions` instead (``pin_then_take``, ``runtime_slot``,
    ``restore_issued``).
    """

    def save_guard(self, sp: Term, comp: Term) -> Term:
        """``save_point`` returns 0 or a point beyond the computed tokens."""
        return z3.Or(sp == 0, sp > comp)

    def hit_depth(self, st: CState, n: int, c: Term) -> Term:
        """The hit's last node ends the hit: it sits at depth ``c``."""
        return st.depth[n] == c

    def pin_guard(self, st: CState, r: Term, h: Term) -> Term:
        """A hybrid hit restores the Ready checkpoint on the hit's last node (``match``)."""
        return self.at_slot(r, lambda s: z3.And(st.kind[s] == READY, st.node[s] == h))

    def lowest_free(self, st: CState, s: int) -> Term:
        """``_take_slot`` takes the lowest free slot: ``s`` is free and no lower one is."""
        return z3.And(st.kind[s] == FREE, *[st.kind[t] != FREE for t in range(s)])

    def pressure_victim(self, st: CState, s: int) -> Term:
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

    def evictable(self, st: CState, n: int) -> Term:
        """KV eviction needs a published block with refcount 0 (INV-REF): no live hit holds it."""
        return z3.And(
            st.pub[n], *[z3.Not(z3.And(st.live[q], st.hit[q] == n)) for q in range(self.S)]
        )

    def evict_node(self, st: CState, n: int, c: Term) -> CState:
        """``on_evict(n)`` when ``c``: the node goes, its checkpoint is released (stale)."""
        out = self.drop(
            st, [z3.And(c, self.restorable(st, s), st.node[s] == n) for s in range(self.K)], "stale"
        )
        out.pub[n] = z3.If(c, False, st.pub[n])
        return out

    def drop(self, st: CState, conds: Sequence[Term], counter: str) -> CState:
        """``_drop`` of every slot whose condition holds, counted under ``counter``."""
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, FREE, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
            out.node[s] = z3.If(c, -1, st.node[s])
        out.ctr[counter] = st.ctr[counter] + count_true(conds)
        return out

    def node_taken(self, st: CState, t: Term) -> Term:
        """``_ckpt_at(node)``: the node already carries a checkpoint (an equal one)."""
        return z3.Or([z3.And(self.restorable(st, s), st.node[s] == t) for s in range(self.K)])

    def fresh_block(self, st: CState, n: int) -> Term:
        """A commit publishes only blocks that were unpublished (INV-WRITE)."""
        return z3.Not(st.pub[n])

    def covers(self, st: CState, s: int, comp: Term) -> Term:
        """A commit covers a reservation whose boundary it reaches."""
        return st.bnd[s] <= comp

    def make_ready(self, st: CState, conds: Sequence[Term], t: Term) -> CState:
        """A covered reservation becomes Ready on node ``t``, ordered by the clock (oldest
        first, for slot pressure), and counts as saved."""
        out = st.copy()
        any_ready = z3.Or(list(conds))
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
            out.node[s] = z3.If(c, t, st.node[s])
            out.order[s] = z3.If(c, st.clock, st.order[s])
        out.clock = z3.If(any_ready, st.clock + 1, st.clock)
        out.ctr["saved"] = st.ctr["saved"] + count_true(conds)
        return out

    def unpin(self, st: CState, conds: Sequence[Term]) -> CState:
        """A restore issued (or abandoned) turns the pinned checkpoint back to Ready, with no
        owner."""
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
            out.owner[s] = z3.If(c, -1, st.owner[s])
        return out

    def release_seq(self, st: CState, q: int) -> CState:
        """``on_free``: runtime slot back, reservation discarded, restore abandoned."""
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
