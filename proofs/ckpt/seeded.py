"""Seeded drifts of the checkpoint model: models that still satisfy INV-CKPT but no longer
describe ``HybridSpecCache``. The drift check (:mod:`.drift`) must catch each one; the
invariant proofs cannot, so a drift check that misses one is too weak.
"""

from __future__ import annotations

from typing import Any

import z3

from .. import ckpt as ck
from ..driver import SeededResult, seeded
from .drift import CkptDriftReport, run_ckpt_drift
from .model import FREE, READY, RESERVED, CState, NoArgs
from .transitions import CkptModel

__all__ = ["SEEDED_CKPT_DRIFTS", "check_seeded_ckpt"]


class _HighestFreeSlot(CkptModel):
    def lowest_free(self, st: CState, s: int) -> Any:
        return z3.And(st.kind[s] == FREE, *[st.kind[t] != FREE for t in range(s + 1, self.K)])


class _NewestReadyEvicted(CkptModel):
    def pressure_victim(self, st: CState, s: int) -> Any:
        return z3.And(
            st.kind[s] == READY,
            *[
                z3.Implies(st.kind[t] == READY, st.order[s] > st.order[t])
                for t in range(self.K)
                if t != s
            ],
        )


class _RestoreNotCounted(CkptModel):
    def restore_issued(self, st: CState, q: int, a: NoArgs) -> ck.Step:
        step = super().restore_issued(st, q, a)
        step.post.ctr["restored"] = st.ctr["restored"]
        return step


class _CommitIgnoresTwin(CkptModel):
    def node_taken(self, st: CState, t: Any) -> Any:
        return z3.BoolVal(False)


class _StaleCountedEvicted(CkptModel):
    def evict_node(self, st: CState, n: int, c: Any) -> CState:
        out = self.drop(
            st,
            [z3.And(c, self.restorable(st, s), st.node[s] == n) for s in range(self.K)],
            "evicted",
        )
        out.pub[n] = z3.If(c, False, st.pub[n])
        return out


class _FreeKeepsReservation(CkptModel):
    def release_seq(self, st: CState, q: int) -> CState:
        out = super().release_seq(st, q)
        for s in range(self.K):
            keep = z3.And(st.kind[s] == RESERVED, st.owner[s] == q)
            out.kind[s] = z3.If(keep, RESERVED, out.kind[s])
            out.owner[s] = z3.If(keep, q, out.owner[s])
        out.ctr["discarded"] = st.ctr["discarded"]
        return out


SEEDED_CKPT_DRIFTS: tuple[tuple[str, str, type[CkptModel]], ...] = (
    ("highest-free-slot", "takes the highest free state slot", _HighestFreeSlot),
    (
        "newest-ready-evicted",
        "slot pressure evicts the newest Ready checkpoint",
        _NewestReadyEvicted,
    ),
    ("restore-not-counted", "restore_issued does not count the restore", _RestoreNotCounted),
    (
        "commit-ignores-twin",
        "a commit readies a reservation on a node that has one",
        _CommitIgnoresTwin,
    ),
    (
        "stale-counted-evicted",
        "a stale release counts as a slot-pressure eviction",
        _StaleCountedEvicted,
    ),
    ("free-keeps-reservation", "free keeps the sequence's reservation", _FreeKeepsReservation),
)


def check_seeded_ckpt(
    name: str, description: str, model: type[CkptModel], budget: int = 3000, seed: int = 0
) -> SeededResult:
    """Run the drift check against a drifted model until it is caught (or ``budget``)."""
    return seeded(
        name,
        description,
        CkptDriftReport(),
        lambda r: r.checks,
        lambda r: run_ckpt_drift(budget, seed=seed, model=model, report=r),
        counts_the_catch=True,
    )
