"""The checkpoint model's transitions, one per spec operation (``spec/checkpoint_store.py``).

Each mirrors its spec method statement by statement: ``_take_slot`` (lowest free slot, else
evict the oldest Ready checkpoint), ``on_reserve``, ``admit`` (evict, pin, runtime slot,
reserve), ``commit`` (publish, Ready or discard, reserve), ``restore_issued``, ``free``,
``evict``, ``reset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from ..terms import Term
from .formulas import CkptFormulas
from .model import (
    COUNTERS,
    FREE,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    SEQ_OPS,
    AdmitArgs,
    CkptArgs,
    CommitArgs,
    CState,
    EvictArgs,
    GrowArgs,
    NoArgs,
    RollbackArgs,
    Step,
    count_true,
    merge,
)

__all__ = ["CkptModel"]


class CkptModel(CkptFormulas):
    """The transition system. Broken variants and seeded drifts override one method each
    (most of them a decision point of :class:`~.model.SpecDecisions`)."""

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

    def evict_nodes(self, st: CState, victim: Sequence[Term]) -> tuple[Term, CState]:
        guard = z3.And([z3.Implies(v, self.evictable(st, n)) for n, v in enumerate(victim)])
        for n, v in enumerate(victim):
            st = self.evict_node(st, n, v)
        return guard, st

    def take_slot(self, st: CState, kind: int, owner: Term, bnd: Term) -> tuple[Term, Term, CState]:
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

    def retarget(self, st: CState, q: int, target: Term) -> CState:
        """``on_reserve``: keep the reservation at the save point; a new one is best-effort."""
        cur = [z3.And(st.kind[s] == RESERVED, st.owner[s] == q) for s in range(self.K)]
        keep = z3.Or([z3.And(c, st.bnd[s] == target) for s, c in enumerate(cur)])
        dropped = self.drop(st, cur, "discarded")
        _, _, taken = self.take_slot(dropped, RESERVED, z3.IntVal(q), target)
        return merge(keep, st, merge(target != 0, taken, dropped))

    def admit(self, st: CState, q: int, a: AdmitArgs) -> Step:
        c, h, r, sp = a.c, a.h, a.r, a.sp
        hit_ok = z3.Or(
            z3.And(c == 0, h == -1, r == -1),
            z3.And(
                c >= 1,
                self.at_node(h, lambda n: z3.And(st.pub[n], self.hit_depth(st, n, c))),
                self.pin_guard(st, r, h),
            ),
        )
        vguard, st1 = self.evict_nodes(st, [z3.And(v, h != n) for n, v in enumerate(a.victim)])
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

    def pin_then_take(self, st: CState, q: int, r: Term) -> tuple[Term, Term, CState, Any]:
        """NOTE: the spec pins before it takes the runtime slot, so slot pressure cannot
        evict the very checkpoint this admission restores (variant 'runtime-before-pin')."""
        return self.runtime_slot(self.pin(st, q, r), q)

    def pin(self, st: CState, q: int, r: Term) -> CState:
        out = st.copy()
        for s in range(self.K):
            out.kind[s] = z3.If(r == s, PINNED, st.kind[s])
            out.owner[s] = z3.If(r == s, q, st.owner[s])
        return out

    def runtime_slot(self, st: CState, q: int) -> tuple[Term, Term, CState, Any]:
        """(taken?, slot, state, room): room is ``len(runtime) < max_num_seqs``."""
        room = count_true(st.live) < self.b.runtime
        can, slot, out = self.take_slot(st, RUNTIME, z3.IntVal(q), z3.IntVal(0))
        return can, slot, out, room

    def grow(self, st: CState, q: int, a: GrowArgs) -> Step:
        """``append`` / ``continue_prefill``: the KV growth may evict nodes; then retarget."""
        vguard, st1 = self.evict_nodes(st, a.victim)
        st1.sp[q] = a.sp
        guard = z3.And(st.live[q], vguard, self.save_guard(a.sp, st.comp[q]))
        return Step(guard, self.retarget(st1, q, a.sp))

    def rollback(self, st: CState, q: int, a: RollbackArgs) -> Step:
        out = st.copy()
        out.sp[q] = a.sp
        guard = z3.And(st.live[q], self.save_guard(a.sp, st.comp[q]))
        return Step(guard, self.retarget(out, q, a.sp))

    def commit(self, st: CState, q: int, a: CommitArgs) -> Step:
        comp, t, sp = a.comp, a.t, a.sp
        newpub, ndepth = a.newpub, a.ndepth
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

    def restore_issued(self, st: CState, q: int, a: NoArgs) -> Step:
        pinned = [z3.And(st.kind[s] == PINNED, st.owner[s] == q) for s in range(self.K)]
        out = self.unpin(st, pinned)
        out.ctr["restored"] = st.ctr["restored"] + count_true(pinned)
        return Step(z3.And(st.live[q], z3.Or(pinned)), out)

    def free(self, st: CState, q: int, a: NoArgs) -> Step:
        return Step(st.live[q], self.release_seq(st, q))

    def evict(self, st: CState, a: EvictArgs) -> Step:
        guard, out = self.evict_nodes(st, a.victim)
        return Step(guard, out)

    def reset_keep(self, st: CState, a: NoArgs) -> Step:
        out = st
        for q in range(self.S):
            out = merge(st.live[q], self.release_seq(out, q), out)
        return Step(z3.BoolVal(True), out)

    def reset_full(self, st: CState, a: NoArgs) -> Step:
        """Every node goes, so does every (Ready) checkpoint, counted stale."""
        out = self.drop(st, [st.kind[s] != FREE for s in range(self.K)], "stale")
        for n in range(self.M):
            out.pub[n] = z3.BoolVal(False)
        return Step(z3.Not(z3.Or(st.live)), out)

    def step(self, op: str, st: CState, q: int, a: CkptArgs) -> Step:
        if op in ("append", "continue_prefill"):
            assert isinstance(a, GrowArgs)
            return self.grow(st, q, a)
        fn = getattr(self, op)
        return fn(st, q, a) if op in SEQ_OPS else fn(st, a)  # type: ignore[no-any-return]
