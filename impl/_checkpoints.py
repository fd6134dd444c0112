"""The manager's checkpoint store: state slots, the checkpoint lifecycle, routed experts.

Same behaviour as the spec's :class:`prefixkv.spec.checkpoint_store.CheckpointStore`, at
O(1) amortized per operation. :class:`~prefixkv.impl.cache.PrefixCacheManager` built with
``checkpoints=CheckpointStore(...)`` calls these hooks, and only these, at fixed points of
its operations (the hybrid manager is exactly that, plus the hybrid calls):

==================  ======================================================================
hook                called by the manager
==================  ======================================================================
``on_lookup``       the match walk (``match``, ``can_admit``, ``admit``): the hit cut back
                    to the deepest boundary with a Ready checkpoint
``on_match``        ``match``: the restore slot and the routed experts of the hit
``check_supply``    admission planning, before anything changes: the state slots held by
                    runtimes, reservations and pinned checkpoints count against the supply
                    (``OutOfStateSlots`` when none is left for the new sequence)
``on_admit``        ``admit``, after the KV admission: pin, runtime slot, reservation
``on_reserve``      ``continue_prefill``, ``append``, ``rollback``: the reservation follows
                    the save point
``on_commit``       ``commit``, after publication: a covered reservation becomes Ready
``on_free``         ``free``: runtime slots back, reservations dropped, restores unpinned
``on_evict``        each evicted block, right after its ``BlockRemoved``: a stale
                    checkpoint and the block's routed experts go
``on_reset``        ``reset(preserve_cache=False)``: every checkpoint goes
``with_stats``      ``stats`` and ``with_snapshot`` ``snapshot``: the checkpoint fields
==================  ======================================================================

The manager takes its fused paths (``advance``, ``advance_batch``, the commit within a
block) only without a store: with one, every step goes through the hooked calls.

What it keeps, each at O(1) amortized per operation:

* free slots: a heap (the spec takes the lowest free slot);
* checkpoints by slot, by node (Ready or Pinned), and per sequence (Reserved, Pinned);
* Ready and Pinned checkpoints in saving order (an ordered dict): slot pressure evicts the
  first unpinned one; at most one per live sequence is pinned, so the scan is short;
* ``_num_ready_unpinned``: with it, ``check_supply`` stays exact without a trial run.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import attrs
from prefixkv.spec.checkpoint import CheckpointStatus, SlotRole, StateRef
from prefixkv.spec.checkpoint_store import CHECKPOINT, PINNED, READY, RESERVED, RUNTIME
from prefixkv.spec.contract import (
    check_hybrid_config,
    check_keep_state,
    check_restore_pending,
    check_routed_experts,
    check_runtime_slots,
    no_state_slot,
    save_point,
)
from prefixkv.spec.events import CheckpointRemoved, CheckpointStored, KVEvent
from prefixkv.spec.multimodal import clamp_out_of_spans
from prefixkv.spec.request import Request, SeqId
from prefixkv.spec.results import Admission, CacheStats, Match
from prefixkv.spec.state import CacheState, CheckpointView, StateSlotsView

from prefixkv.errors import InvalidConfig

from ._pool import BlockPool
from ._publication import Publisher
from ._sequence import SeqState
from .cache import Matched

__all__ = ["CheckpointStore"]

#: The manager's event queue while it records events, else None.
Events = list[KVEvent] | None


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


class CheckpointStore:
    """The state slots, checkpoints and routed experts of one hybrid manager (module doc).

    Built with the hybrid knobs; the manager it is given to validates them against its
    block size and hands it its pool and publisher (:meth:`attach`).
    """

    def __init__(
        self, *, max_num_seqs: int, state_budget: int, decode_state_interval: int = 0
    ) -> None:
        self._knobs = (max_num_seqs, state_budget, decode_state_interval)
        self.block_size = 0  # set by attach
        self.max_num_seqs = self.state_budget = self.interval = self.num_slots = 0
        self._free_slots: list[int] = []  # a heap; sorted is a valid heap
        self._roles: list[SlotRole | None] = []
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

    def attach(self, block_size: int, pool: BlockPool, publisher: Publisher) -> None:
        """Validate the knobs against the manager's ``block_size``; size the slot pool.

        Raises:
            InvalidConfig: a knob is malformed, or the store serves a manager already.
        """
        if self.block_size:
            raise InvalidConfig("this checkpoint store serves a cache already: give each its own")
        self.max_num_seqs, self.state_budget, self.interval = check_hybrid_config(
            block_size, *self._knobs
        )
        self.block_size = block_size
        self._pool, self._publisher = pool, publisher
        self.num_slots = self.max_num_seqs + self.state_budget
        self._free_slots = list(range(self.num_slots))
        self._roles = [None] * self.num_slots

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

    def _take_slot(self, role: SlotRole, events: Events) -> int | None:
        """The lowest free slot, after evicting the oldest unpinned Ready checkpoint if no
        slot is free; None when nothing can be evicted either."""
        if not self._free_slots:
            if not self._num_ready_unpinned:
                return None
            for slot in self._saved_order:
                ck = self._ckpts[slot]
                if ck.status == READY:
                    if events is not None:
                        events.append(CheckpointRemoved((ck.block_hash,)))
                    self._drop_saved(ck)
                    self._ckpt_evicted += 1
                    break
        slot = heapq.heappop(self._free_slots)
        self._roles[slot] = role
        return slot

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

    # -- hooks: match and admission --------------------------------------------------------

    def on_lookup(self, req: Request, m: Matched) -> Matched:
        """The KV match cut back to the deepest boundary with a Ready checkpoint."""
        blocks, lost = m.blocks, m.lost
        bs, spans = self.block_size, req.spans
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
        unanchored = m.num_unanchored
        if c < kv:
            del blocks[c:]
            del m.hashes[c:]
            unanchored = max(0, unanchored - (kv - c))
            lost = attrs.evolve(lost, checkpoint=(kv - c) * bs)
        return Matched(
            blocks=blocks,
            hashes=m.hashes,
            num_unanchored=unanchored,
            window=window,
            lost=lost,
            keys=m.keys,
        )

    def on_match(self, m: Match) -> Match:
        """The hit's restore slot and its routed experts (when every hit block has some)."""
        if not m.block_ids:
            return m
        return attrs.evolve(
            m,
            restore_slot=self._node_ckpt[m.block_ids[-1]].slot,
            routed_experts=self._experts_of(m.block_ids),
        )

    def check_supply(self, num_live: int, pins_a_hit: bool) -> None:
        """Raises ``OutOfStateSlots`` unless an admission can get its runtime slot.

        The slots held by runtimes, reservations and pinned checkpoints count against the
        supply; Ready ones do not (slot pressure evicts them), except the one a hit is about
        to pin. KV eviction only turns Ready checkpoints into free slots.
        """
        check_runtime_slots(num_live, self.max_num_seqs)
        supply = len(self._free_slots) + self._num_ready_unpinned - (1 if pins_a_hit else 0)
        if supply < 1:
            raise no_state_slot()

    def on_admit(self, seq: SeqState, adm: Admission, events: Events) -> Admission:
        """Pin the restore source, take the runtime slot, reserve a checkpoint (the supply
        was checked)."""
        seq_id = seq.seq_id
        k = adm.num_cached_tokens // self.block_size
        restore = None
        if k:
            ck = self._node_ckpt[adm.block_ids[k - 1]]
            ck.status, ck.owner = PINNED, seq_id
            self._pinned[seq_id] = ck
            self._num_ready_unpinned -= 1
            restore = ck.slot
        slot = self._take_slot(RUNTIME, events)
        assert slot is not None, "the state-slot supply was checked in check_supply"
        self._runtime[seq_id] = slot
        self._positions[seq_id] = None if k else 0
        self.on_reserve(seq, events)
        return attrs.evolve(
            adm,
            restore_slot=restore,
            state_slot=slot,
            routed_experts=self._experts_of(adm.block_ids[:k]),
        )

    # -- hooks: growth, commit, release, eviction -------------------------------------------

    def on_reserve(self, seq: SeqState, events: Events) -> None:
        """Keep the reservation at the sequence's save point (see the spec)."""
        target = save_point(
            seq.num_computed, seq.num_reserved, seq.prompt_len, self.block_size, self.interval
        )
        current = self._reserved.get(seq.seq_id)
        if current is not None:
            if current.boundary == target:
                return
            self._drop_reserved(current)
        if target:
            slot = self._take_slot(CHECKPOINT, events)
            if slot is not None:
                ck = self._ckpts[slot] = _Ckpt(slot, target, seq.seq_id)
                self._reserved[seq.seq_id] = ck

    def on_commit(self, seq: SeqState, events: Events) -> None:
        """A reservation the commit covers becomes Ready on the published block that ends
        at its boundary; then the reservation follows the save point."""
        ck = self._reserved.get(seq.seq_id)
        if ck is not None and ck.boundary <= seq.num_computed:
            node = self._node_of(seq, ck.boundary // self.block_size - 1)
            if node < 0 or node in self._node_ckpt:
                self._drop_reserved(ck)  # an equal checkpoint exists, or the chain is orphaned
            else:
                del self._reserved[seq.seq_id]
                ck.status, ck.owner, ck.node, ck.order = READY, None, node, self._order
                if events is not None:
                    ck.block_hash = self._pool.event_hash[node]
                    events.append(CheckpointStored((ck.block_hash,)))
                self._order += 1
                self._node_ckpt[node] = ck
                self._saved_order[ck.slot] = None
                self._num_ready_unpinned += 1
                self._saved += 1
        self.on_reserve(seq, events)

    def on_free(self, seq_ids: Iterable[SeqId]) -> None:
        """Freed sequences give back their runtime slots, drop their reservations and
        unpin the checkpoints of restores they never issued (aborted restores)."""
        for seq_id in seq_ids:
            self._release_slot(self._runtime.pop(seq_id), RUNTIME)
            del self._positions[seq_id]
            ck = self._reserved.get(seq_id)
            if ck is not None:
                self._drop_reserved(ck)
            ck = self._pinned.pop(seq_id, None)
            if ck is not None:  # an aborted restore: the checkpoint is Ready again
                ck.status, ck.owner = READY, None
                self._num_ready_unpinned += 1

    def on_evict(self, block: int, events: Events) -> None:
        """A node's checkpoint goes stale with it, and its experts."""
        if self._experts:
            self._experts.pop(block, None)
        ck = self._node_ckpt.get(block)
        if ck is not None:
            # A pinned checkpoint's node is held by its restore owner: never a leaf.
            assert ck.status == READY, f"evicted the node of a {ck.status} checkpoint"
            if events is not None:  # after the node's BlockRemoved
                events.append(CheckpointRemoved((ck.block_hash,)))
            self._drop_saved(ck)
            self._released_stale += 1

    def on_reset(self) -> None:
        """Every node is gone, so is every (Ready) checkpoint, and every expert."""
        for ck in list(self._ckpts.values()):
            self._drop_saved(ck)
            self._released_stale += 1
        self._experts.clear()

    # -- hooks: inspection -----------------------------------------------------------------

    def with_stats(self, stats: CacheStats) -> CacheStats:
        """``stats`` with the checkpoint counters and the slots in use."""
        return attrs.evolve(
            stats,
            checkpoints_saved=self._saved,
            checkpoints_discarded=self._discarded,
            checkpoints_restored=self._restored,
            checkpoints_released_stale=self._released_stale,
            checkpoints_evicted=self._ckpt_evicted,
            num_state_slots=self.num_slots,
            num_state_slots_used=self.num_slots - len(self._free_slots),
        )

    def with_snapshot(self, snap: CacheState) -> CacheState:
        """``snap`` with the routed experts on its blocks and the state slots' view."""
        experts = self._experts
        blocks = snap.blocks
        if experts:
            blocks = tuple(
                attrs.evolve(v, routed_experts=experts[v.block_id]) if v.block_id in experts else v
                for v in blocks
            )
        view = StateSlotsView(
            num_runtime_slots=self.max_num_seqs,
            state_budget=self.state_budget,
            decode_state_interval=self.interval,
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

    # -- the hybrid calls (the manager has checked the sequence is live) ----------------------

    def check_experts(
        self, seq: SeqState, new_computed: int, experts: object
    ) -> tuple[bytes, ...] | None:
        """What a commit of ``seq`` to ``new_computed`` tokens (its own arguments checked
        already) raises for ``experts``: one per block it completes."""
        bs = self.block_size
        return check_routed_experts(experts, new_computed // bs - seq.num_computed // bs)

    def attach_experts(self, seq: SeqState, first: int, experts: Sequence[bytes]) -> None:
        """The experts of ``seq``'s blocks ``first...`` go to the published blocks with
        their identities that carry none yet: an equal computation enriches, never
        overwrites."""
        for j, data in enumerate(experts, first):
            node = self._node_of(seq, j)
            if node >= 0 and node not in self._experts:
                self._experts[node] = data

    def restore_issued(self, seq_id: SeqId) -> None:
        """Unpin the sequence's pending restore (``InvalidOperation`` without one)."""
        ck = self._pinned.pop(seq_id, None)
        check_restore_pending(seq_id, ck is not None)
        assert ck is not None
        ck.status, ck.owner = READY, None
        self._num_ready_unpinned += 1
        self._positions[seq_id] = ck.boundary
        self._restored += 1

    def keep_state(self, seq_id: SeqId, position: object, num_computed: int) -> None:
        """The runtime slot holds the state after ``position`` (checked) tokens."""
        self._positions[seq_id] = check_keep_state(
            seq_id, position, self._positions[seq_id], num_computed
        )

    def state_slot(self, seq_id: SeqId) -> int:
        return self._runtime[seq_id]

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        ck = self._pinned.get(seq_id)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        ck = self._reserved.get(seq_id)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        position = self._positions[seq_id]
        return None if position is None else StateRef(self._runtime[seq_id], position)
