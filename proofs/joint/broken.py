"""Deliberately broken joint models: each overrides one hook, and the obligation it names
must yield a counterexample (:func:`prefixkv.proofs.small.check_variant`)."""

from __future__ import annotations

import z3

from ..small import Variant, all_of
from ..terms import Term
from .model import (
    FREE,
    AdmitArgs,
    JState,
    Query,
    sel,
)
from .obligations import JointModel

__all__ = [
    "JOINT_VARIANTS",
    "AdmitUnverifiedHit",
    "DropPinned",
    "EvictHeldNode",
    "EvictKeepsCheckpoint",
    "EvictKeepsExperts",
    "EvictNonLeaf",
    "EvictSparesExperts",
    "FreeKeepsHolds",
    "GenNotFresh",
    "MatchPrefersExperts",
    "PublishOverPublished",
    "RestoreByBoundary",
    "SaveOnUnpublished",
]


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
