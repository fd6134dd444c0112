"""Seeded drifts of the joint check: deliberately drifted hybrid specs that the joint check
(:func:`~.drift.run_joint_drift`) or the routed-experts lockstep
(:func:`~.drift.run_experts_lockstep`) must catch; a check that misses one is too weak.
"""

from __future__ import annotations

import attrs
from prefixkv.spec import HybridSpecCache, Match, Request
from prefixkv.spec.checkpoint_store import CheckpointStore, Emit

from ..driver import SeededResult, seeded
from .drift import BS, ExpertsReport, JointDriftReport, run_experts_lockstep, run_joint_drift

__all__ = [
    "SEEDED_EXPERT_DRIFTS",
    "SEEDED_JOINT_DRIFTS",
    "check_seeded_experts",
    "check_seeded_joint",
]


class _ForgetsStaleCheckpoint(CheckpointStore):
    def on_evict(self, block: int, emit: Emit) -> None:
        self.experts.pop(block, None)


class _EvictionKeepsCheckpoint(HybridSpecCache):
    """The store's ``on_evict`` forgets the checkpoint: it stays Ready on a node that is
    gone."""

    store_type = _ForgetsStaleCheckpoint


class _EvictsPinnedUnderPressure(CheckpointStore):
    def _evict_checkpoint(self, emit: Emit) -> bool:
        held = [ck for ck in self.ckpts.values() if ck.status in ("ready", "pinned")]
        if not held:
            return False
        self._drop(min(held, key=lambda ck: ck.order))
        self.evicted += 1
        return True


class _PressureEvictsPinned(HybridSpecCache):
    """Slot pressure takes the oldest checkpoint, Ready or Pinned."""

    store_type = _EvictsPinnedUnderPressure


class _KeepsExperts(CheckpointStore):
    def on_evict(self, block: int, emit: Emit) -> None:
        ck = self._ckpt_at(block)
        if ck is not None:
            self._drop(ck)
            self.released_stale += 1


class _ExpertsOnPrivateBlock(HybridSpecCache):
    """Routed experts stay on a released block."""

    store_type = _KeepsExperts


SEEDED_JOINT_DRIFTS: tuple[tuple[str, str, type[HybridSpecCache]], ...] = (
    (
        "eviction-keeps-checkpoint",
        "an evicted node's checkpoint stays Ready",
        _EvictionKeepsCheckpoint,
    ),
    (
        "pressure-evicts-pinned",
        "slot pressure may release a pinned checkpoint",
        _PressureEvictsPinned,
    ),
    ("experts-outlive-node", "routed experts stay on an evicted block", _ExpertsOnPrivateBlock),
)


def check_seeded_joint(
    name: str, description: str, cache_type: type[HybridSpecCache], limit: int = 5000, seed: int = 0
) -> SeededResult:
    """The drifted spec must reach a state the joint model rules out within ``limit`` steps."""
    return seeded(
        name,
        description,
        JointDriftReport(),
        lambda r: r.checks,
        lambda r: run_joint_drift(limit, seed=seed, cache_type=cache_type, report=r),
    )


# -- EXPERTS: a match that depends on routed experts -----------------------------------------


class _MatchPrefersExperts(HybridSpecCache):
    """The hit is cut back to the blocks that carry routed experts."""

    def match(self, req: Request) -> Match:
        m = super().match(req)
        c = 0
        while c < m.num_blocks and m.block_ids[c] in self._store.experts:
            c += 1
        if c == m.num_blocks:
            return m
        return attrs.evolve(
            m,
            num_cached_tokens=c * BS,
            block_ids=m.block_ids[:c],
            restore_slot=None,
        )


SEEDED_EXPERT_DRIFTS: tuple[tuple[str, str, type[HybridSpecCache]], ...] = (
    ("match-prefers-experts", "the hit is cut back to blocks with experts", _MatchPrefersExperts),
)


def check_seeded_experts(
    name: str, description: str, cache_type: type[HybridSpecCache], limit: int = 3000, seed: int = 0
) -> SeededResult:
    """The drifted spec's match must depend on routed experts within ``limit`` steps."""
    return seeded(
        name,
        description,
        ExpertsReport(),
        lambda r: r.steps,
        lambda r: run_experts_lockstep(limit, seed=seed, cache_type=cache_type, report=r),
    )
