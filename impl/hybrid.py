"""The optimized prefix cache for hybrid (attention + recurrent) models.

Same contract and step-for-step behaviour as :class:`prefixkv.spec.hybrid.HybridSpecCache`
(the hybrid differential machine holds it to that). The KV side is
:class:`~prefixkv.impl.cache.PrefixCacheManager` unchanged; this subclass adds the state-slot
pool, the checkpoint lifecycle and routed-expert data, each at O(1) amortized per operation:

* free slots: a heap (the spec takes the lowest free slot);
* checkpoints by slot, by node (Ready or Pinned), and per sequence (Reserved, Pinned);
* Ready and Pinned checkpoints in saving order (an ordered dict): slot pressure evicts the
  first unpinned one; at most one per live sequence is pinned, so the scan is short;
* ``_num_ready_unpinned``: with it, ``can_admit`` stays exact without a trial run.

The non-hybrid manager pays for none of this: its only hook is one ``None`` check per
evicted block.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import attrs
from prefixkv.spec.contract import (
    check_free_list,
    check_hybrid_config,
    check_keep_state,
    check_restore_pending,
    check_routed_experts,
    check_runtime_slots,
    no_state_slot,
    save_point,
)
from prefixkv.spec.events import CheckpointRemoved, CheckpointStored
from prefixkv.spec.hybrid import (
    CHECKPOINT,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    CheckpointStatus,
    SlotRole,
    StateRef,
)
from prefixkv.spec.identity import BlockHasher, fast_hash
from prefixkv.spec.multimodal import clamp_out_of_spans
from prefixkv.spec.protocol import HybridPrefixCache
from prefixkv.spec.request import Request, SeqId
from prefixkv.spec.results import Admission, CacheStats, Match
from prefixkv.spec.state import CacheState, CheckpointView, StateSlotsView

from ._sequence import SeqState
from .cache import AdmitPlan, Matched, PrefixCacheManager

__all__ = ["HybridPrefixCacheManager"]


class _Ckpt:
    __slots__ = ("block_hash", "boundary", "node", "order", "owner", "slot", "status")

    def __init__(self, slot: int, boundary: int, owner: SeqId) -> None:
        self.slot = slot
        self.status: CheckpointStatus = RESERVED
        self.boundary = boundary
        self.owner: SeqId | None = owner
        self.node = -1
        self.order = 0
        self.block_hash = 0  # the node's, once Ready: its checkpoint events name it


class HybridPrefixCacheManager(PrefixCacheManager, HybridPrefixCache):
    """A prefix cache manager with recurrent-state checkpoints; see the module doc."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_num_seqs: int,
        state_budget: int,
        decode_state_interval: int = 0,
        hasher: BlockHasher = fast_hash,
        record_events: bool = False,
    ) -> None:
        super().__init__(num_blocks, block_size, hasher=hasher, record_events=record_events)
        # NOTE: commit, rollback and append move checkpoints too: ``advance`` runs them in turn.
        self._fused_inline = False
        self._runtime_slots, self._state_budget, self._interval = check_hybrid_config(
            self.block_size, max_num_seqs, state_budget, decode_state_interval
        )
        self._num_slots = self._runtime_slots + self._state_budget
        self._free_slots = list(range(self._num_slots))  # a heap; sorted is a valid heap
        self._roles: list[SlotRole | None] = [None] * self._num_slots
        self._runtime: dict[SeqId, int] = {}
        # the position of the state each runtime slot holds; None while a restore is pending
        self._positions: dict[SeqId, int | None] = {}
        self._ckpts: dict[int, _Ckpt] = {}
        self._node_ckpt: dict[int, _Ckpt] = {}
        self._reserved: dict[SeqId, _Ckpt] = {}
        self._pinned: dict[SeqId, _Ckpt] = {}
        self._saved_order: OrderedDict[int, None] = OrderedDict()  # Ready or Pinned, by slot
        self._num_ready_unpinned = 0
        self._experts: dict[int, bytes] = {}
        self._order = 0
        self._saved = self._discarded = self._restored = 0
        self._released_stale = self._ckpt_evicted = 0
        self._evict_hook = self._on_evicted

    @property
    def max_num_seqs(self) -> int:
        return self._runtime_slots

    @property
    def state_budget(self) -> int:
        return self._state_budget

    @property
    def decode_state_interval(self) -> int:
        return self._interval

    # -- slots and checkpoints -------------------------------------------------------------

    def _release_slot(self, slot: int, role: SlotRole) -> None:
        # The roles are kept so that a release under the wrong role fails loudly here.
        assert self._roles[slot] == role, f"slot {slot} is {self._roles[slot]}, not {role}"
        self._roles[slot] = None
        heapq.heappush(self._free_slots, slot)

    def _drop_saved(self, ck: _Ckpt) -> None:
        """Release a Ready checkpoint (its node was evicted, or its slot is needed)."""
        del self._ckpts[ck.slot]
        del self._node_ckpt[ck.node]
        del self._saved_order[ck.slot]
        self._num_ready_unpinned -= 1
        self._release_slot(ck.slot, CHECKPOINT)

    def _drop_reserved(self, ck: _Ckpt) -> None:
        del self._ckpts[ck.slot]
        assert ck.owner is not None
        del self._reserved[ck.owner]
        self._discarded += 1
        self._release_slot(ck.slot, CHECKPOINT)

    def _take_slot(self, role: SlotRole) -> int | None:
        """The lowest free slot, after evicting the oldest unpinned Ready checkpoint if no
        slot is free; None when nothing can be evicted either."""
        if not self._free_slots:
            if not self._num_ready_unpinned:
                return None
            for slot in self._saved_order:
                ck = self._ckpts[slot]
                if ck.status == READY:
                    if self._record_events:
                        self._events.append(CheckpointRemoved((ck.block_hash,)))
                    self._drop_saved(ck)
                    self._ckpt_evicted += 1
                    break
        slot = heapq.heappop(self._free_slots)
        self._roles[slot] = role
        return slot

    def _retarget(self, seq: SeqState) -> None:
        """Keep the reservation at the sequence's save point (see the spec)."""
        target = save_point(
            seq.num_computed, seq.num_reserved, seq.prompt_len, self._block_size, self._interval
        )
        current = self._reserved.get(seq.seq_id)
        if current is not None:
            if current.boundary == target:
                return
            self._drop_reserved(current)
        if target:
            slot = self._take_slot(CHECKPOINT)
            if slot is not None:
                ck = self._ckpts[slot] = _Ckpt(slot, target, seq.seq_id)
                self._reserved[seq.seq_id] = ck

    def _on_evicted(self, block: int) -> None:
        """The KV eviction hook: a node's checkpoint goes stale with it, and its experts."""
        if self._experts:
            self._experts.pop(block, None)
        ck = self._node_ckpt.get(block)
        if ck is not None:
            # A pinned checkpoint's node is held by its restore owner: never a leaf.
            assert ck.status == READY, f"evicted the node of a {ck.status} checkpoint"
            if self._record_events:  # after the node's BlockRemoved
                self._events.append(CheckpointRemoved((ck.block_hash,)))
            self._drop_saved(ck)
            self._released_stale += 1

    def _node_of(self, seq: SeqState, j: int) -> int:
        """The published block with the identity of ``seq``'s block ``j``, or < 0."""
        b = seq.blocks[j]
        return b if self._pool.is_published(b) else self._publisher.canonical(seq, j)

    def _experts_of(self, blocks: Sequence[int]) -> tuple[bytes, ...] | None:
        if not blocks or not self._experts:
            return None
        get = self._experts.get
        out = []
        for b in blocks:
            data = get(b)
            if data is None:
                return None
            out.append(data)
        return tuple(out)

    # -- match and admission ---------------------------------------------------------------

    def _match(self, req: Request) -> Matched:
        """The KV match cut back to the deepest boundary with a Ready checkpoint."""
        blocks, hashes, unanchored, window, lost, keys = super()._match(req)
        bs, spans = self._block_size, req.spans
        kv = c = len(blocks)
        node_ckpt = self._node_ckpt
        while c:
            ck = node_ckpt.get(blocks[c - 1])
            if (
                ck is not None
                and ck.status == READY
                and (not spans or clamp_out_of_spans(c, spans, bs) == c)
            ):
                break
            c -= 1
        if lost.window:
            raw = kv + (lost.window + lost.span) // bs
            window = (clamp_out_of_spans(raw, spans, bs) if spans else raw) - c
        else:
            window = 0
        if c < kv:
            del blocks[c:]
            del hashes[c:]
            unanchored = max(0, unanchored - (kv - c))
            lost = attrs.evolve(lost, checkpoint=(kv - c) * bs)
        return Matched(blocks, hashes, unanchored, window, lost, keys)

    def match(self, req: Request) -> Match:
        m = super().match(req)
        if not m.block_ids:
            return m
        return attrs.evolve(
            m,
            restore_slot=self._node_ckpt[m.block_ids[-1]].slot,
            routed_experts=self._experts_of(m.block_ids),
        )

    def _plan(self, req: Request, num_new_tokens: int | None) -> AdmitPlan:
        plan = super()._plan(req, num_new_tokens)
        check_runtime_slots(len(self._runtime), self._runtime_slots)
        # A hit pins one Ready checkpoint; KV eviction only turns Ready ones into free slots.
        supply = len(self._free_slots) + self._num_ready_unpinned - (1 if plan.blocks else 0)
        if supply < 1:
            raise no_state_slot()
        return plan

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        adm = super().admit(req, num_new_tokens)
        seq_id = req.seq_id
        k = adm.num_cached_tokens // self._block_size
        restore = None
        if k:
            ck = self._node_ckpt[adm.block_ids[k - 1]]
            ck.status, ck.owner = PINNED, seq_id
            self._pinned[seq_id] = ck
            self._num_ready_unpinned -= 1
            restore = ck.slot
        slot = self._take_slot(RUNTIME)
        assert slot is not None, "the state-slot supply was checked in _plan"
        self._runtime[seq_id] = slot
        self._positions[seq_id] = None if k else 0
        self._retarget(self._seqs[seq_id])
        return attrs.evolve(
            adm,
            restore_slot=restore,
            state_slot=slot,
            routed_experts=self._experts_of(adm.block_ids[:k]),
        )

    # -- growth, commit, rollback ----------------------------------------------------------

    def continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> int:
        n = super().continue_prefill(seq_id, num_new_tokens)
        self._retarget(self._seq(seq_id))
        return n

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        new = super().append(seq_id, num_tokens)
        self._retarget(self._seq(seq_id))
        return new

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        super().rollback(seq_id, num_tokens)
        self._retarget(self._seq(seq_id))

    def _check_commit(
        self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int], experts: object
    ) -> tuple[bytes, ...] | None:
        """Everything ``commit`` would raise, in the spec's order, before anything changes."""
        seq = self._seq(seq_id)
        _, new = self._check_commit_args(seq, num_computed, accepted_tokens)
        bs = self._block_size
        return check_routed_experts(experts, new // bs - seq.num_computed // bs)

    def commit(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        routed_experts: Sequence[bytes] | None = None,
    ) -> None:
        experts = None
        if routed_experts is not None:
            experts = self._check_commit(seq_id, num_computed, accepted_tokens, routed_experts)
        # NOTE: the computed count before the commit, read from the sequence whatever the
        # id's type (a str or int subclass, an IntEnum member): the experts of the blocks
        # this commit completes go to blocks ``before // bs`` on. _check_commit has found
        # the sequence when there are experts; without them ``before`` is not used.
        before = self._seq(seq_id).num_computed if experts else 0
        super().commit(seq_id, num_computed, accepted_tokens)
        seq = self._seqs[seq_id]
        bs = self._block_size
        if experts:
            first = before // bs
            for j, data in enumerate(experts, first):
                node = self._node_of(seq, j)
                if node >= 0 and node not in self._experts:
                    self._experts[node] = data
        ck = self._reserved.get(seq_id)
        if ck is not None and ck.boundary <= seq.num_computed:
            node = self._node_of(seq, ck.boundary // bs - 1)
            if node < 0 or node in self._node_ckpt:
                self._drop_reserved(ck)  # an equal checkpoint exists, or the chain is orphaned
            else:
                del self._reserved[seq_id]
                ck.status, ck.owner, ck.node, ck.order = READY, None, node, self._order
                if self._record_events:
                    ck.block_hash = self._wire_hash(node)
                    self._events.append(CheckpointStored((ck.block_hash,)))
                self._order += 1
                self._node_ckpt[node] = ck
                self._saved_order[ck.slot] = None
                self._num_ready_unpinned += 1
                self._saved += 1
        self._retarget(seq)

    def restore_issued(self, seq_id: SeqId) -> None:
        self._seq(seq_id)
        ck = self._pinned.pop(seq_id, None)
        check_restore_pending(seq_id, ck is not None)
        assert ck is not None
        ck.status, ck.owner = READY, None
        self._num_ready_unpinned += 1
        self._positions[seq_id] = ck.boundary
        self._restored += 1

    def keep_state(self, seq_id: SeqId, position: int) -> None:
        seq = self._seq(seq_id)
        self._positions[seq_id] = check_keep_state(
            seq_id, position, self._positions[seq_id], seq.num_computed
        )

    # -- release ---------------------------------------------------------------------------

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        ids = check_free_list(seq_ids, self._seqs)
        super().free(ids)
        for seq_id in ids:
            self._release_slot(self._runtime.pop(seq_id), RUNTIME)
            del self._positions[seq_id]
            ck = self._reserved.get(seq_id)
            if ck is not None:
                self._drop_reserved(ck)
            ck = self._pinned.pop(seq_id, None)
            if ck is not None:  # an aborted restore: the checkpoint is Ready again
                ck.status, ck.owner = READY, None
                self._num_ready_unpinned += 1

    def reset(self, *, preserve_cache: bool) -> None:
        super().reset(preserve_cache=preserve_cache)
        if not preserve_cache:
            for ck in list(self._ckpts.values()):
                self._drop_saved(ck)
                self._released_stale += 1
            self._experts.clear()

    # -- queries ---------------------------------------------------------------------------

    def state_slot(self, seq_id: SeqId) -> int:
        self._seq(seq_id)
        return self._runtime[seq_id]

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        ck = self._pinned.get(seq_id)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        ck = self._reserved.get(seq_id)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        position = self._positions[seq_id]
        return None if position is None else StateRef(self._runtime[seq_id], position)

    def stats(self) -> CacheStats:
        return attrs.evolve(
            super().stats(),
            checkpoints_saved=self._saved,
            checkpoints_discarded=self._discarded,
            checkpoints_restored=self._restored,
            checkpoints_released_stale=self._released_stale,
            checkpoints_evicted=self._ckpt_evicted,
            num_state_slots=self._num_slots,
            num_state_slots_used=self._num_slots - len(self._free_slots),
        )

    def snapshot(self) -> CacheState:
        snap = super().snapshot()
        experts = self._experts
        blocks = snap.blocks
        if experts:
            blocks = tuple(
                attrs.evolve(v, routed_experts=experts[v.block_id]) if v.block_id in experts else v
                for v in blocks
            )
        view = StateSlotsView(
            num_runtime_slots=self._runtime_slots,
            state_budget=self._state_budget,
            decode_state_interval=self._interval,
            free_slots=tuple(sorted(self._free_slots)),
            runtime=tuple(self._runtime.items()),
            runtime_positions=tuple(self._positions.items()),
            checkpoints=tuple(
                CheckpointView(
                    ck.slot,
                    ck.status,
                    ck.boundary,
                    ck.owner,
                    None if ck.status == RESERVED else ck.node,
                    ck.order,
                )
                for ck in sorted(self._ckpts.values(), key=lambda ck: ck.slot)
            ),
        )
        return attrs.evolve(snap, blocks=blocks, state_slots=view)
