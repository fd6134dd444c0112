"""Deliberately broken encodings: each must make an obligation fail with a counterexample.

A proof that cannot fail proves nothing. Every variant below changes the encoding in one
small, realistic way (a bug an engine has shipped, or a plausible slip in the model) and
names the obligation that must then fail. :func:`check_variant` searches for a concrete
counterexample to that obligation in pools of 1..5 blocks (a concrete counterexample is a
counterexample to the symbolic obligation with ``N`` fixed) and returns it, printed as a
state, a step and the resulting state.

Kinds: ``transition`` (an operation does the wrong thing), ``off-by-one`` (a bound or an
index is one off), ``dropped conjunct`` (a guard or an invariant loses a conjunct; for an
invariant, the obligation that fails is the one that needed it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import z3
from prefixkv.spec.invariant_ids import InvariantId

from ..terms import Term
from .model import (
    AdmitArgs,
    AppendArgs,
    Bounds,
    CountArgs,
    Domain,
    NoArgs,
    OpArgs,
    Query,
    SeqState,
    State,
    Step,
    cstore,
)
from .obligations import Counterexample, find_counterexample
from .transitions import Encoding

__all__ = ["VARIANTS", "Variant", "VariantResult", "check_variant"]


@dataclass(frozen=True)
class Variant:
    name: str
    invariant: str
    step: str
    kind: str
    description: str
    encoding: type[Encoding]


@dataclass
class VariantResult:
    variant: Variant
    counterexample: Counterexample | None
    seconds: float

    @property
    def caught(self) -> bool:
        return self.counterexample is not None


# -- INV-REF ---------------------------------------------------------------------------------


class FreeOncePerBlock(Encoding):
    def free_seqs(self, st: State, freed: Sequence[Term]) -> State:
        holds = [
            (sq.tab[j], z3.And(f, j < sq.len))
            for f, sq in zip(freed, st.seqs, strict=True)
            for j in reversed(range(self.bounds.table))
        ]
        # BUG: a block listed by two freed tables is released once
        once = [
            (b, z3.And(c, *[z3.Not(z3.And(c2, b2 == b)) for b2, c2 in holds[:r]]))
            for r, (b, c) in enumerate(holds)
        ]
        post = self.release_all(st.replace(clock=st.clock + 1), once)
        for s, f in enumerate(freed):
            post = post.seq(s, live=z3.And(st.seqs[s].live, z3.Not(f)))
        return post


class RollbackReleasesOneMore(Encoding):
    def op_rollback(self, d: Domain, st: State, a: CountArgs, s: int) -> Step:
        M, sq, n = self.bounds.table, st.seqs[s], a.n
        nr = sq.nr - n
        keep = self.table_length(nr, st.BS)
        enabled = z3.And(sq.live, n >= 1, nr >= sq.nc)
        # BUG: releases from keep - 1, but the table keeps that block
        st = self.release_all(
            st, [(sq.tab[j], z3.And(keep - 1 <= j, j < sq.len)) for j in reversed(range(M))]
        )
        st = st.seq(s, nr=nr, len=keep)
        return Step("rollback", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a)


class AdmitLiveSequence(Encoding):
    def attach_guard(self, sq: SeqState, a: AdmitArgs) -> Term:
        # BUG: the "not already live" conjunct is dropped: re-admission overwrites a table
        return z3.And(a.ntok >= 1, z3.Or(a.whole, a.num_new >= 1))


class AllocateOneMore(Encoding):
    def allocate(self, st: State, need: Term) -> tuple[State, list[Term]]:
        taken = [st.q[st.qh + i] for i in range(self.bounds.table + 1)]
        x = z3.Int("lam!x")
        # BUG: i <= need marks one block more as held than the table receives
        hit = z3.Or([z3.And(i <= need, b == x) for i, b in enumerate(taken)])
        rc = z3.Lambda([x], z3.If(hit, 1, st.rc[x]))
        return st.replace(rc=rc, qh=st.qh + need), taken


# -- INV-PARTITION --------------------------------------------------------------------------


class EvictLeaksVictim(Encoding):
    def evict_one(self, st: State, v: Term, cond: Term) -> State:
        post = super().evict_one(st, v, cond)
        # BUG: the victim is unpublished but never joins the free queue
        return post.replace(q=st.q, qpos=st.qpos, qt=st.qt)


class QueueHeadOneTooFar(Encoding):
    def allocate(self, st: State, need: Term) -> tuple[State, list[Term]]:
        post, taken = super().allocate(st, need)
        # BUG: the head moves one past the allocated blocks (when anything is allocated)
        return post.replace(qh=post.qh + z3.If(need > 0, 1, 0)), taken


class ReleaseFreesPublished(Encoding):
    def frees_at_zero(self, st: State, b: Term) -> Term:
        # BUG: "private" dropped: a published block at refcount 0 is also queued as free
        return z3.BoolVal(True)


class QueueWithoutGhost(Encoding):
    def inv_partition(self, d: Domain, st: State) -> Term:
        # BUG (invariant): the queue's position map is dropped, so the queue may list a
        # block twice and allocation can hand it out twice
        def one(b: Term) -> Term:
            free, evictable, used = st.in_free(b), z3.And(st.pub[b], st.rc[b] == 0), st.rc[b] > 0
            return z3.And(
                st.rc[b] >= 0,
                st.qpos[b] < st.qt,
                z3.Or(free, evictable, used),
                z3.Not(z3.And(free, evictable)),
                z3.Not(z3.And(free, used)),
            )

        queue = d.forall_queue(st.qh, st.qt, lambda i: st.inb(st.q[i]))
        return z3.And(st.qh <= st.qt, queue, d.forall_blocks(st.N, one))


# -- INV-INDEX -------------------------------------------------------------------------------


class EvictKeepsIndexEntry(Encoding):
    def evict_one(self, st: State, v: Term, cond: Term) -> State:
        # BUG: the stale index entry survives the block's reuse
        return super().evict_one(st, v, cond).replace(idx=st.idx)


class PublishDuplicate(Encoding):
    def may_publish(self, committed: Term, parent_known: Term, taken: Term) -> Term:
        # BUG: the "identity already published" conjunct is dropped
        return z3.And(committed, parent_known)


class ResetKeepsIndex(Encoding):
    def op_reset_full(self, d: Domain, st: State, a: NoArgs) -> Step:
        step = super().op_reset_full(d, st, a)
        # BUG: a full reset forgets the blocks but not the index
        return Step(
            step.op, step.enabled, step.bounded, step.choice, step.post.replace(idx=st.idx), a
        )


# -- INV-ANCESTOR ----------------------------------------------------------------------------


class EvictNonLeaf(Encoding):
    def is_leaf(self, d: Domain, st: State, b: Term) -> Term:
        # BUG: "no published children" dropped: an interior block can be evicted
        return z3.And(st.inb(b), st.pub[b], st.rc[b] == 0)


class DepthOffByOne(Encoding):
    def block_depth(self, j: int) -> Term:
        return z3.IntVal(j)  # BUG: depth j, not j + 1


class PublishWithoutParent(Encoding):
    def may_publish(self, committed: Term, parent_known: Term, taken: Term) -> Term:
        # BUG: the "parent identity is published" conjunct is dropped
        return z3.And(committed, z3.Not(taken))


# -- INV-WRITE -------------------------------------------------------------------------------


class PublishAtSchedule(Encoding):
    def newly_committed(self, BS: Term, j: int, sq: SeqState, new_nc: Term, ntok: Term) -> Term:
        # BUG: publish before commit: every full *reserved* block is published
        return z3.And((j + 1) * BS > sq.nc, (j + 1) * BS <= sq.nr)


class PublishOneSlotEarly(Encoding):
    def newly_committed(self, BS: Term, j: int, sq: SeqState, new_nc: Term, ntok: Term) -> Term:
        # BUG: off by one: a block with one unwritten slot counts as committed
        return z3.And((j + 1) * BS > sq.nc, (j + 1) * BS <= new_nc + 1)


class AttachComputesOneBlockLess(Encoding):
    def attach(self, d: Domain, st: State, a: AdmitArgs, s: int) -> tuple[Step, Term]:
        step, scheduled = super().attach(d, st, a, s)
        sq = step.post.seqs[s]
        # BUG: off by one block: the last hit block is still "to be written"
        nc = z3.If(sq.nc > 0, sq.nc - st.BS, sq.nc)
        post = step.post.seq(s, nc=nc)
        return Step(step.op, step.enabled, step.bounded, step.choice, post, a), scheduled


# -- INV-PUBLISH -----------------------------------------------------------------------------


class WithoutChainStrengthening(Encoding):
    def invariants(self, d: Domain, st: State) -> dict[str, Term]:
        # BUG (invariant): the strengthening AUX-CHAIN is dropped
        inv = super().invariants(d, st)
        del inv["AUX-CHAIN"]
        return inv


class PublishAcceptedUnwritten(Encoding):
    def newly_committed(self, BS: Term, j: int, sq: SeqState, new_nc: Term, ntok: Term) -> Term:
        # BUG: blocks of accepted tokens are published before their KV is written
        return z3.And((j + 1) * BS > sq.nc, (j + 1) * BS <= ntok)


class PublishStaleTokens(Encoding):
    def identity_labels(self, before: Sequence[Term], after: Sequence[Term]) -> Sequence[Term]:
        # BUG: blocks are published with the tokens known before this commit accepted more
        return before


# -- INV-WINDOW ------------------------------------------------------------------------------


class WindowAttachedShared(Encoding):
    def attach(self, d: Domain, st: State, a: AdmitArgs, s: int) -> tuple[Step, Term]:
        step, scheduled = super().attach(d, st, a, s)
        chain, matched, m = self.match_blocks(st, a)
        w = self.window_size(a.recompute_blocks, m)
        post, sq, M = step.post, step.post.seqs[s], self.bounds.table
        # BUG: the window's matched blocks are pinned and attached (shared) instead of fresh
        # private blocks; the sequence recomputes their KV in place, into published blocks
        window = [z3.And(matched[j], z3.Not(self.attached(matched[j], j, m, w))) for j in range(M)]
        rc = post.rc
        for j in range(M):
            rc = cstore(rc, chain[j], window[j], rc[chain[j]] + 1)
        tab = tuple(z3.If(window[j], chain[j], sq.tab[j]) for j in range(M))
        nr = z3.Sum([z3.If(h, st.BS, 0) for h in matched])
        post = post.replace(rc=rc).seq(s, tab=tab, len=m, nr=nr)
        return Step(step.op, step.enabled, step.bounded, step.choice, post, a), scheduled


class CachedCountsWindowBlock(Encoding):
    def cached_tokens(self, BS: Term, cached: Term, w: Term) -> Term:
        # BUG: off by one block: num_cached counts the first window block as cached
        return cached + z3.If(w > 0, BS, 0)


class WindowWithoutComputedExemption(Encoding):
    def window_pending(self, BS: Term, sq: SeqState, j: int) -> Term:
        # BUG (invariant): the "not yet fully computed" conjunct is dropped. A recomputed,
        # committed window block whose twin was evicted meanwhile is published by commit.
        return z3.BoolVal(True)


# -- INV-LIMIT -------------------------------------------------------------------------------


class TableFloor(Encoding):
    def table_length(self, nr: Term, BS: Term) -> Term:
        # BUG: off by one block: floor(nr / BS) instead of ceil
        return z3.Sum([z3.If((j + 1) * BS <= nr, 1, 0) for j in range(self.bounds.table)])


class RollbackKeepsTable(Encoding):
    def op_rollback(self, d: Domain, st: State, a: CountArgs, s: int) -> Step:
        step = super().op_rollback(d, st, a, s)
        # BUG: the reservation shrinks but the table keeps its blocks
        post = step.post.seq(s, len=st.seqs[s].len).replace(
            rc=st.rc, q=st.q, qpos=st.qpos, qt=st.qt, lu=st.lu
        )
        return Step(step.op, step.enabled, step.bounded, step.choice, post, a)


class CommitBeyondReserved(Encoding):
    def commit_guard(self, sq: SeqState, n: Term, acc: Term) -> Term:
        # BUG: the "within the reserved slots" conjunct is dropped
        return z3.And(sq.live, n >= 0, acc >= 0, sq.nc + n <= sq.ntok + acc)


class CommitUnknownTokens(Encoding):
    def commit_guard(self, sq: SeqState, n: Term, acc: Term) -> Term:
        # BUG: off by one: KV may be committed for one token that is not known yet
        nc = sq.nc + n
        return z3.And(sq.live, n >= 0, acc >= 0, nc <= sq.nr, nc <= sq.ntok + acc + 1)


class GrowIgnoresLimit(Encoding):
    def grow_room(self, sq: SeqState, nr: Term) -> Term:
        # BUG: the "within kv_token_limit" conjunct of growth is dropped
        return z3.BoolVal(True)


class GrowLimitOffByOne(Encoding):
    def grow_room(self, sq: SeqState, nr: Term) -> Term:
        # BUG: off by one: a chunk may hold limit + 1 uncommitted prompt tokens
        return z3.Implies(
            z3.And(sq.lim > 0, sq.nc < sq.np), z3.If(nr < sq.np, nr, sq.np) - sq.nc <= sq.lim + 1
        )


class WithoutChunkStrengthening(Encoding):
    def invariants(self, d: Domain, st: State) -> dict[str, Term]:
        # BUG (invariant): the strengthening AUX-CHUNK is dropped
        inv = super().invariants(d, st)
        del inv["AUX-CHUNK"]
        return inv


# -- INV-STATS -------------------------------------------------------------------------------


class HitsCountWholePrompt(Encoding):
    def count_admission(self, st: State, ntok: Term, cached: Term, remaining: Term) -> State:
        # BUG: every prompt token of a hit counts as a hit
        return (
            super()
            .count_admission(st, ntok, cached, remaining)
            .count("hits", z3.If(cached > 0, ntok - cached, 0))
        )


class ComputedOffByOne(Encoding):
    def count_admission(self, st: State, ntok: Term, cached: Term, remaining: Term) -> State:
        return super().count_admission(st, ntok, cached, remaining - 1)  # BUG


class ResetClearsSkipped(Encoding):
    def op_reset_full(self, d: Domain, st: State, a: NoArgs) -> Step:
        step = super().op_reset_full(d, st, a)
        # BUG: a full reset zeroes one counter of a sum that must stay balanced
        post = step.post.replace(ctr={**step.post.ctr, "skipped": z3.IntVal(0)})
        return Step(step.op, step.enabled, step.bounded, step.choice, post, a)


# -- INV-MATCH -------------------------------------------------------------------------------


class FullPromptHit(Encoding):
    def within_cap(self, BS: Term, j: int, ntok: Term) -> Term:
        return (j + 1) * BS <= ntok  # BUG: off by one token: a whole cached prompt is a hit


class MatchStopsAfterOneBlock(Encoding):
    def within_cap(self, BS: Term, j: int, ntok: Term) -> Term:
        # BUG: the match stops after its first block even when more are cached
        return z3.And(super().within_cap(BS, j, ntok), j == 0)


class MatchIgnoresPrefix(Encoding):
    def chain(self, st: State, ns: Term, labels: Sequence[Term]) -> list[Term]:
        # BUG: blocks are looked up by their own tokens only, not by the whole prefix
        return [st.idx.get((ns, z3.IntVal(-1), lab)) for lab in labels]


class LookupTrustsHash(Encoding):
    def verify(self, st: State, c: Term, key: tuple[Term, Term, Term]) -> Term:
        # BUG: a hit is trusted when the stored identity's hash equals the key's hash
        h = z3.Function("identity_hash", z3.IntSort(), z3.IntSort(), z3.IntSort(), z3.IntSort())
        return z3.And(st.pub[c], h(*st.key(c)) == h(*key))


class LookupChecksOwnTokens(Encoding):
    def verify(self, st: State, c: Term, key: tuple[Term, Term, Term]) -> Term:
        # BUG: the candidate's own namespace and tokens are checked, its parent is not
        ns, _, label = key
        return z3.And(st.pub[c], st.bns[c] == ns, st.btok[c] == label)


class MatchEndsInsideSpan(Encoding):
    def span_clamp(self, BS: Term, raw: list[Term], q: Query) -> list[Term]:
        return raw  # BUG: no clamp: a match may end in the middle of an image


# -- INV-TXN ---------------------------------------------------------------------------------


class AdmitCountsBeforeCheck(Encoding):
    def refused(self, st: State, op: str, a: OpArgs, s: int) -> State:
        # BUG: the query is counted before the admission's checks, outside the transaction
        return st.count("queries", a.ntok) if isinstance(a, AdmitArgs) else st


class AppendAllocatesBeforeCheck(Encoding):
    def refused(self, st: State, op: str, a: OpArgs, s: int) -> State:
        if not isinstance(a, AppendArgs):
            return st
        # BUG: the new blocks are taken from the free queue before the checks, and kept
        need = self.need(st, s, a.n)
        return self.allocate(st, z3.If(need > 0, need, 0))[0]


class OutOfBlocksNotRefused(Encoding):
    def make_room(
        self, d: Domain, st: State, need: Term, victims: Sequence[Term]
    ) -> tuple[State, Term, Term]:
        post, _, choice = super().make_room(d, st, need, victims)
        # BUG: making room never fails: victims need not be leaves, nor the queue long enough
        return post, z3.BoolVal(True), choice


class CommitWithoutReservedCheck(Encoding):
    def commit_guard(self, sq: SeqState, n: Term, acc: Term) -> Term:
        # BUG: committing past the reserved slots is not refused
        return z3.And(sq.live, n >= 0, acc >= 0, sq.nc + n <= sq.ntok + acc)


class FullResetWhileBusy(Encoding):
    def op_reset_full(self, d: Domain, st: State, a: NoArgs) -> Step:
        step = super().op_reset_full(d, st, a)
        # BUG: a full reset goes ahead while sequences are live
        return Step(step.op, z3.BoolVal(True), step.bounded, step.choice, step.post, a)


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "free-once-per-block",
        InvariantId.REF,
        "free",
        "transition",
        "a batched free that lists a block in two tables decrements it once",
        FreeOncePerBlock,
    ),
    Variant(
        "rollback-releases-one-more",
        InvariantId.REF,
        "rollback",
        "off-by-one",
        "rollback releases from block keep-1 but the table keeps it",
        RollbackReleasesOneMore,
    ),
    Variant(
        "admit-live-sequence",
        InvariantId.REF,
        "attach",
        "dropped conjunct",
        "admit without 'sequence not live': a re-admission overwrites a held table",
        AdmitLiveSequence,
    ),
    Variant(
        "allocate-one-more",
        InvariantId.REF,
        "grow",
        "off-by-one",
        "allocation marks need+1 blocks as held but installs need",
        AllocateOneMore,
    ),
    Variant(
        "evict-leaks-victim",
        InvariantId.PARTITION,
        "evict",
        "transition",
        "an evicted block never joins the free queue",
        EvictLeaksVictim,
    ),
    Variant(
        "queue-head-one-too-far",
        InvariantId.PARTITION,
        "grow",
        "off-by-one",
        "allocation moves the queue head one past the blocks it takes",
        QueueHeadOneTooFar,
    ),
    Variant(
        "release-frees-published",
        InvariantId.PARTITION,
        "free",
        "dropped conjunct",
        "release queues a published block at refcount 0 (drops 'private')",
        ReleaseFreesPublished,
    ),
    Variant(
        "queue-without-ghost",
        InvariantId.PARTITION,
        "grow",
        "dropped conjunct",
        "INV-PARTITION without the queue's position map: a block queued twice",
        QueueWithoutGhost,
    ),
    Variant(
        "evict-keeps-index-entry",
        InvariantId.INDEX,
        "evict",
        "transition",
        "eviction leaves a stale index entry behind",
        EvictKeepsIndexEntry,
    ),
    Variant(
        "publish-duplicate",
        InvariantId.INDEX,
        "commit",
        "dropped conjunct",
        "commit publishes an identity that is already published",
        PublishDuplicate,
    ),
    Variant(
        "reset-keeps-index",
        InvariantId.INDEX,
        "reset_full",
        "transition",
        "a full reset keeps the index",
        ResetKeepsIndex,
    ),
    Variant(
        "evict-non-leaf",
        InvariantId.ANCESTOR,
        "evict",
        "dropped conjunct",
        "eviction of a block with published children",
        EvictNonLeaf,
    ),
    Variant(
        "depth-off-by-one",
        InvariantId.ANCESTOR,
        "commit",
        "off-by-one",
        "published block j gets depth j instead of j+1",
        DepthOffByOne,
    ),
    Variant(
        "publish-without-parent",
        InvariantId.ANCESTOR,
        "commit",
        "dropped conjunct",
        "commit publishes a block whose parent identity is not published",
        PublishWithoutParent,
    ),
    Variant(
        "publish-at-schedule",
        InvariantId.WRITE,
        "commit",
        "transition",
        "publish before commit: every full reserved block is published",
        PublishAtSchedule,
    ),
    Variant(
        "publish-one-slot-early",
        InvariantId.WRITE,
        "commit",
        "off-by-one",
        "a block with one unwritten slot is published",
        PublishOneSlotEarly,
    ),
    Variant(
        "attach-computes-one-block-less",
        InvariantId.WRITE,
        "attach",
        "off-by-one",
        "admission marks one hit block too few as computed (a shared block to write)",
        AttachComputesOneBlockLess,
    ),
    Variant(
        "without-aux-chain",
        InvariantId.PUBLISH,
        "commit",
        "dropped conjunct",
        "the strengthening AUX-CHAIN is dropped: INV-PUBLISH is not inductive alone",
        WithoutChainStrengthening,
    ),
    Variant(
        "publish-accepted-unwritten",
        InvariantId.PUBLISH,
        "commit",
        "transition",
        "blocks of accepted tokens are published before their KV is computed",
        PublishAcceptedUnwritten,
    ),
    Variant(
        "publish-stale-tokens",
        InvariantId.PUBLISH,
        "commit",
        "transition",
        "blocks are published with the tokens known before the accepted ones",
        PublishStaleTokens,
    ),
    Variant(
        "window-attached-shared",
        InvariantId.WINDOW,
        "attach",
        "transition",
        "the window's matched blocks are attached shared, not fresh private blocks",
        WindowAttachedShared,
    ),
    Variant(
        "cached-counts-window-block",
        InvariantId.WINDOW,
        "attach",
        "off-by-one",
        "num_cached counts the first window block as cached (not yet computed)",
        CachedCountsWindowBlock,
    ),
    Variant(
        "window-without-computed-exemption",
        InvariantId.WINDOW,
        "commit",
        "dropped conjunct",
        "INV-WINDOW without 'not yet fully computed': a committed window block whose twin "
        "was evicted is published",
        WindowWithoutComputedExemption,
    ),
    Variant(
        "table-floor",
        InvariantId.LIMIT,
        "grow",
        "off-by-one",
        "a table holds floor(reserved / block size) blocks",
        TableFloor,
    ),
    Variant(
        "rollback-keeps-table",
        InvariantId.LIMIT,
        "rollback",
        "transition",
        "rollback shrinks the reservation but not the table",
        RollbackKeepsTable,
    ),
    Variant(
        "commit-beyond-reserved",
        InvariantId.LIMIT,
        "commit",
        "dropped conjunct",
        "commit without 'computed <= reserved'",
        CommitBeyondReserved,
    ),
    Variant(
        "commit-unknown-tokens",
        InvariantId.LIMIT,
        "commit",
        "off-by-one",
        "commit allows KV for one token beyond the known ones",
        CommitUnknownTokens,
    ),
    Variant(
        "grow-ignores-limit",
        InvariantId.LIMIT,
        "grow",
        "dropped conjunct",
        "growth without 'within kv_token_limit': a chunk larger than the limit",
        GrowIgnoresLimit,
    ),
    Variant(
        "grow-limit-off-by-one",
        InvariantId.LIMIT,
        "grow",
        "off-by-one",
        "a chunk may hold kv_token_limit + 1 uncommitted prompt tokens",
        GrowLimitOffByOne,
    ),
    Variant(
        "without-aux-chunk",
        InvariantId.LIMIT,
        "rollback",
        "dropped conjunct",
        "the strengthening AUX-CHUNK is dropped: INV-LIMIT's chunk form is not inductive "
        "over rollback",
        WithoutChunkStrengthening,
    ),
    Variant(
        "full-prompt-hit",
        InvariantId.MATCH,
        "attach",
        "off-by-one",
        "the match is not capped: nothing is left to compute",
        FullPromptHit,
    ),
    Variant(
        "match-stops-after-one-block",
        InvariantId.MATCH,
        "attach",
        "transition",
        "the match is not the longest cached prefix",
        MatchStopsAfterOneBlock,
    ),
    Variant(
        "match-ignores-prefix",
        InvariantId.MATCH,
        "attach",
        "transition",
        "a block hits on its own tokens, whatever its prefix",
        MatchIgnoresPrefix,
    ),
    Variant(
        "hits-count-whole-prompt",
        InvariantId.STATS,
        "attach",
        "transition",
        "a hit counts every prompt token as a hit",
        HitsCountWholePrompt,
    ),
    Variant(
        "computed-off-by-one",
        InvariantId.STATS,
        "attach",
        "off-by-one",
        "admission counts one computed prompt token too few",
        ComputedOffByOne,
    ),
    Variant(
        "reset-clears-skipped",
        InvariantId.STATS,
        "reset_full",
        "transition",
        "a full reset zeroes the skipped-token counter only",
        ResetClearsSkipped,
    ),
    Variant(
        "lookup-trusts-hash",
        InvariantId.MATCH,
        "reset_keep",
        "transition",
        "a lookup trusts a hash match without comparing the stored identity",
        LookupTrustsHash,
    ),
    Variant(
        "lookup-checks-own-tokens",
        InvariantId.MATCH,
        "evict",
        "dropped conjunct",
        "a lookup verifies the block's own tokens but not its parent",
        LookupChecksOwnTokens,
    ),
    Variant(
        "match-ends-inside-span",
        InvariantId.MATCH,
        "reset_keep",
        "dropped conjunct",
        "the match is not clamped out of a multimodal span",
        MatchEndsInsideSpan,
    ),
    Variant(
        "admit-counts-before-check",
        InvariantId.TXN,
        "admit",
        "transition",
        "a refused admission has already counted its query",
        AdmitCountsBeforeCheck,
    ),
    Variant(
        "append-allocates-before-check",
        InvariantId.TXN,
        "append",
        "transition",
        "a refused append keeps the blocks it took from the free queue",
        AppendAllocatesBeforeCheck,
    ),
    Variant(
        "out-of-blocks-not-refused",
        InvariantId.TXN,
        "append",
        "dropped conjunct",
        "making room never fails, so an append with no leaf left to evict goes ahead",
        OutOfBlocksNotRefused,
    ),
    Variant(
        "commit-without-reserved-check",
        InvariantId.TXN,
        "commit",
        "dropped conjunct",
        "a commit past the reserved slots is not refused",
        CommitWithoutReservedCheck,
    ),
    Variant(
        "full-reset-while-busy",
        InvariantId.TXN,
        "reset_full",
        "dropped conjunct",
        "a full reset is not refused while sequences are live",
        FullResetWhileBusy,
    ),
)


def check_variant(v: Variant, bounds: Bounds | None = None, max_pool: int = 5) -> VariantResult:
    """Search a counterexample to the variant's obligation."""
    t0 = time.perf_counter()
    cex = find_counterexample(
        v.encoding(bounds or Bounds()), v.invariant, v.step, max_pool=max_pool
    )
    return VariantResult(v, cex, time.perf_counter() - t0)
