"""Deliberately broken checkpoint models: each must make its obligation fail.

Each variant overrides one hook (most of them a decision point of
:class:`~.model.SpecDecisions`); :func:`check_ckpt_variant` proves the named obligation of
the broken model and expects a counterexample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from ..terms import Term
from .model import (
    DEFAULT_RLIMIT,
    PINNED,
    READY,
    RESERVED,
    CkptBounds,
    CState,
)
from .obligations import CkptProver, CkptRow
from .transitions import CkptModel

__all__ = ["CKPT_VARIANTS", "CkptVariant", "CkptVariantResult", "check_ckpt_variant"]


class FreeReleasesPinned(CkptModel):
    def release_seq(self, st: CState, q: int) -> CState:
        out = st.copy()
        pinned = [z3.And(st.kind[s] == PINNED, st.owner[s] == q) for s in range(self.K)]
        return super().release_seq(self.drop(out, pinned, "discarded"), q)


class RestoreReserved(CkptModel):
    def pin_guard(self, st: CState, r: Term, h: Term) -> Term:
        return self.at_slot(
            r, lambda s: z3.And(z3.Or(st.kind[s] == READY, st.kind[s] == RESERVED), st.node[s] == h)
        )


class PressureEvictsPinned(CkptModel):
    def pressure_victim(self, st: CState, s: int) -> Term:
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
    def evictable(self, st: CState, n: int) -> Term:
        return st.pub[n]


class RuntimeBeforePin(CkptModel):
    def pin_then_take(self, st: CState, q: int, r: Term) -> tuple[Term, Term, CState, Any]:
        can, slot, out, room = self.runtime_slot(st, q)
        return can, slot, self.pin(out, q, r), room


class ReadyUncovered(CkptModel):
    def covers(self, st: CState, s: int, comp: Term) -> Term:
        return z3.BoolVal(True)


class OrderNotAdvanced(CkptModel):
    def make_ready(self, st: CState, conds: Sequence[Term], t: Term) -> CState:
        out = super().make_ready(st, conds, t)
        out.clock = st.clock
        return out


class NoLiveLimit(CkptModel):
    def runtime_slot(self, st: CState, q: int) -> tuple[Term, Term, CState, Any]:
        can, slot, out, _ = super().runtime_slot(st, q)
        return can, slot, out, z3.BoolVal(True)


class RetargetKeepsOld(CkptModel):
    def drop(self, st: CState, conds: Sequence[Term], counter: str) -> CState:
        return st if counter == "discarded" else super().drop(st, conds, counter)


class UnpinKeepsOwner(CkptModel):
    def unpin(self, st: CState, conds: Sequence[Term]) -> CState:
        out = st.copy()
        for s, c in enumerate(conds):
            out.kind[s] = z3.If(c, READY, st.kind[s])
        return out


class SavePointAtComputed(CkptModel):
    def save_guard(self, sp: Term, comp: Term) -> Term:
        return z3.Or(sp == 0, sp >= comp)


class HitDepthOffByOne(CkptModel):
    def hit_depth(self, st: CState, n: int, c: Term) -> Term:
        return st.depth[n] == c + 1


class RepublishNode(CkptModel):
    def node_taken(self, st: CState, t: Term) -> Term:
        """``_ckpt_at(node)``: the node already carries a checkpoint (an equal one)."""
        return z3.Or([z3.And(self.restorable(st, s), st.node[s] == t) for s in range(self.K)])

    def fresh_block(self, st: CState, n: int) -> Term:
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
