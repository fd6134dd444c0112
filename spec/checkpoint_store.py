"""The spec's checkpoint store: state slots, the checkpoint lifecycle, routed experts.

:class:`~prefixkv.spec.cache.SpecCache` built with ``checkpoints=CheckpointStore(...)``
becomes the hybrid spec (:class:`~prefixkv.spec.hybrid.HybridSpecCache` is exactly that,
plus the hybrid calls): the cache calls the store's hooks at fixed points of its own
operations, inside the operation's transaction, and never otherwise.

==============  ===========================================================================
hook            called by the cache
==============  ===========================================================================
``on_match``    ``match`` (so ``admit`` too): the hit cut back to a Ready checkpoint
``on_admit``    ``admit``, after the KV admission: pin the restore source, take the runtime
                slot (the state-slot supply: :class:`OutOfStateSlots` when none is left),
                reserve a checkpoint
``on_reserve``  ``continue_prefill``, ``append``, ``rollback``: the reservation follows the
                save point
``on_commit``   ``commit``, after publication: a covered reservation becomes Ready
``on_free``     ``free``, per freed sequence: its runtime slot, reservation and restore
``on_evict``    each evicted block, right after its ``BlockRemoved``: a stale checkpoint
``on_reset``    ``reset(preserve_cache=False)``: every checkpoint goes with every node
``with_stats``  ``stats`` and ``with_snapshot`` ``snapshot``: the checkpoint fields
==============  ===========================================================================

NOTE: the store holds no reference to the cache. What it reads of the KV side (a
sequence's counters, the published node of a block, an event hash) comes in as arguments,
and what it emits goes out through the ``emit`` it is handed. So the cache's transaction
copies the store together with its own state and restores both, and a trial run
(``can_admit``) runs on copies of both.

The lifecycle and the slot layout are the module doc of :mod:`prefixkv.spec.hybrid`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from prefixkv.errors import InvalidConfig

from . import contract
from .checkpoint import CheckpointStatus, SlotRole, StateRef
from .errors import OutOfStateSlots, WrongSlotRole
from .events import CheckpointRemoved, CheckpointStored, KVEvent
from .multimodal import clamp_out_of_spans
from .request import Request, SeqId
from .results import Admission, CacheStats, Match
from .state import CacheState, CheckpointView, SeqRecord, StateSlotsView

__all__ = [
    "CHECKPOINT",
    "PINNED",
    "READY",
    "RESERVED",
    "RUNTIME",
    "CheckpointStore",
    "Emit",
    "StateSlotPool",
]

#: Slot roles and checkpoint statuses, by their short names.
RUNTIME, CHECKPOINT = SlotRole.RUNTIME, SlotRole.CHECKPOINT
RESERVED, READY, PINNED = (
    CheckpointStatus.RESERVED,
    CheckpointStatus.READY,
    CheckpointStatus.PINNED,
)

#: Queues a KV event (when the cache records them).
Emit = Callable[[KVEvent], None]


class StateSlotPool:
    """``num_slots`` recurrent-state slots; each is free or held under one role.

    Takes the lowest free slot (any deterministic choice would do; this one is easy to
    mirror). Freeing under the wrong role is a bug in the caller, reported as such.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.roles: dict[int, SlotRole] = {}

    def free_slots(self) -> list[int]:
        return [s for s in range(self.num_slots) if s not in self.roles]

    def take(self, role: SlotRole) -> int:
        free = self.free_slots()
        if not free:
            raise OutOfStateSlots(f"all {self.num_slots} state slots are in use")
        self.roles[free[0]] = role
        return free[0]

    def release(self, slot: int, role: SlotRole) -> None:
        held = self.roles.get(slot)
        if held != role:
            raise WrongSlotRole(f"slot {slot} is {held or 'free'}, not {role}: cannot free it")
        del self.roles[slot]


@attrs.define
class _Ckpt:
    slot: int
    status: CheckpointStatus
    boundary: int
    owner: SeqId | None
    node: int | None = None
    order: int = 0
    block_hash: int = 0
    """The node's hash once Ready, for its checkpoint events (kept: the node may be evicted
    first)."""


class CheckpointStore:
    """The state slots, checkpoints and routed experts of one hybrid cache (module doc).

    Built with the hybrid knobs; the cache it is given to validates them against its block
    size (:meth:`attach`). ``max_num_seqs`` bounds live sequences (one runtime slot each);
    ``state_budget`` is the number of slots beyond them; ``decode_state_interval`` (a
    multiple of the block size, 0 = off) spaces decode checkpoints.
    """

    def __init__(
        self, *, max_num_seqs: int, state_budget: int, decode_state_interval: int = 0
    ) -> None:
        self._knobs = (max_num_seqs, state_budget, decode_state_interval)
        self.block_size = 0  # set by attach
        self.max_num_seqs = self.state_budget = self.interval = 0
        self.slots = StateSlotPool(0)
        self.runtime: dict[SeqId, int] = {}
        #: The position of the state each runtime slot holds; None while a restore is pending.
        self.positions: dict[SeqId, int | None] = {}
        self.ckpts: dict[int, _Ckpt] = {}  # by slot
        self.experts: dict[int, bytes] = {}  # published block -> routed experts
        self.order = 0
        self.saved = self.discarded = self.restored = self.released_stale = self.evicted = 0

    def attach(self, block_size: int) -> None:
        """Validate the knobs against the cache's ``block_size`` and size the slot pool.

        Raises:
            InvalidConfig: a knob is malformed, or the store serves a cache already.
        """
        if self.block_size:
            raise InvalidConfig("this checkpoint store serves a cache already: give each its own")
        self.max_num_seqs, self.state_budget, self.interval = contract.check_hybrid_config(
            block_size, *self._knobs
        )
        self.block_size = block_size
        self.slots = StateSlotPool(self.max_num_seqs + self.state_budget)

    # -- slots and checkpoints -------------------------------------------------------------

    def _ckpt_at(self, node: int) -> _Ckpt | None:
        for ck in self.ckpts.values():
            if ck.node == node:
                return ck
        return None

    def _ckpt_of(self, seq_id: SeqId, status: CheckpointStatus) -> _Ckpt | None:
        for ck in self.ckpts.values():
            if ck.owner == seq_id and ck.status == status:
                return ck
        return None

    def _drop(self, ck: _Ckpt) -> None:
        del self.ckpts[ck.slot]
        self.slots.release(ck.slot, CHECKPOINT)

    def _evict_checkpoint(self, emit: Emit) -> bool:
        """Slot pressure: release the oldest unpinned Ready checkpoint, if there is one."""
        ready = [ck for ck in self.ckpts.values() if ck.status == READY]
        if not ready:
            return False
        victim = min(ready, key=lambda ck: ck.order)
        emit(CheckpointRemoved((victim.block_hash,)))
        self._drop(victim)
        self.evicted += 1
        return True

    def _take_slot(self, role: SlotRole, emit: Emit) -> int | None:
        """The lowest free slot, evicting a checkpoint if none is free; None if none can be."""
        if len(self.slots.roles) == self.slots.num_slots and not self._evict_checkpoint(emit):
            return None
        return self.slots.take(role)

    # -- hooks -----------------------------------------------------------------------------

    def on_match(self, req: Request, m: Match) -> Match:
        """The KV match, cut back to the deepest boundary with a Ready checkpoint.

        ::

            KV match      [ b0 ][ b1 ][ b2 ][ b3 ][ b4 ]           (after cap and span clamp)
            checkpoints          ^R          ^P                    R ready, P pinned elsewhere
            hit           [ b0 ][ b1 ]                             -> restore R, 2 blocks hit
            window (k=1)  [ b0 ][ b1 ]{ b2 }{ b3 }{ b4 }           private span from R to the
                                                                   KV hit, longer than k
        """
        bs = self.block_size
        kv = m.num_blocks
        raw = kv + (m.lost.window + m.lost.span) // bs
        c = kv
        restore: _Ckpt | None = None
        while c:
            ck = self._ckpt_at(m.block_ids[c - 1])
            if ck is not None and ck.status == READY and clamp_out_of_spans(c, req.spans, bs) == c:
                restore = ck
                break
            c -= 1
        window = clamp_out_of_spans(raw, req.spans, bs) - c if m.lost.window else 0
        experts = [self.experts.get(b) for b in m.block_ids[:c]]
        return attrs.evolve(
            m,
            num_cached_tokens=c * bs,
            block_ids=m.block_ids[:c],
            lost=attrs.evolve(m.lost, checkpoint=(kv - c) * bs),
            num_window_blocks=window,
            restore_slot=None if restore is None else restore.slot,
            routed_experts=(
                tuple(e for e in experts if e is not None)
                if experts and None not in experts
                else None
            ),
        )

    def on_admit(self, seq: SeqRecord, m: Match, adm: Admission, emit: Emit) -> Admission:
        """Pin the restore source, take a runtime slot, reserve a checkpoint.

        Raises :class:`OutOfStateSlots` (an ``OutOfBlocks``) when ``max_num_seqs`` sequences
        are live, or every slot is held by runtimes, reservations and pinned checkpoints.
        """
        seq_id = seq.seq_id
        if m.restore_slot is not None:
            ck = self.ckpts[m.restore_slot]
            ck.status, ck.owner = PINNED, seq_id
        contract.check_runtime_slots(len(self.runtime), self.max_num_seqs)
        slot = self._take_slot(RUNTIME, emit)
        if slot is None:
            raise contract.no_state_slot()
        self.runtime[seq_id] = slot
        # the initial state, or nothing until the restore is issued
        self.positions[seq_id] = None if m.restore_slot is not None else 0
        self.on_reserve(seq, emit)
        return attrs.evolve(
            adm, restore_slot=m.restore_slot, state_slot=slot, routed_experts=m.routed_experts
        )

    def on_reserve(self, seq: SeqRecord, emit: Emit) -> None:
        """Keep the sequence's reservation at its current save point (module doc).

        A reservation elsewhere is discarded first (its tokens were rolled back, or the
        sequence now reaches a deeper save point); a new one is best-effort.
        """
        target = contract.save_point(
            seq.num_computed, seq.num_reserved, seq.prompt_len, self.block_size, self.interval
        )
        current = self._ckpt_of(seq.seq_id, RESERVED)
        if current is not None:
            if current.boundary == target:
                return
            self._drop(current)
            self.discarded += 1
        if target:
            slot = self._take_slot(CHECKPOINT, emit)
            if slot is not None:
                self.ckpts[slot] = _Ckpt(slot, RESERVED, target, seq.seq_id)

    def on_commit(
        self,
        seq: SeqRecord,
        nodes: Sequence[int | None],
        event_hash: Callable[[int], int | None],
        emit: Emit,
    ) -> None:
        """A reservation the commit covers becomes Ready on the published block that ends
        at its boundary (``nodes``: the published block with the identity of each of the
        sequence's full computed blocks); then the reservation follows the save point."""
        ck = self._ckpt_of(seq.seq_id, RESERVED)
        if ck is not None and ck.boundary <= seq.num_computed:
            node = nodes[ck.boundary // self.block_size - 1]
            if node is None or self._ckpt_at(node) is not None:
                self._drop(ck)  # an equal checkpoint exists, or the chain is orphaned
                self.discarded += 1
            else:
                ck.status, ck.owner, ck.node, ck.order = READY, None, node, self.order
                h = event_hash(node)
                if h is not None:  # the cache records events
                    ck.block_hash = h
                    emit(CheckpointStored((h,)))
                self.order += 1
                self.saved += 1
        self.on_reserve(seq, emit)

    def on_free(self, seq_id: SeqId) -> None:
        """A freed sequence gives back its runtime slot, drops its reservation and unpins
        the checkpoint of a restore it never issued (an aborted restore)."""
        self.slots.release(self.runtime.pop(seq_id), RUNTIME)
        del self.positions[seq_id]
        ck = self._ckpt_of(seq_id, RESERVED)
        if ck is not None:
            self._drop(ck)
            self.discarded += 1
        ck = self._ckpt_of(seq_id, PINNED)
        if ck is not None:
            ck.status, ck.owner = READY, None

    def on_evict(self, block: int, emit: Emit) -> None:
        """An evicted node takes its routed experts and its checkpoint (stale) with it."""
        self.experts.pop(block, None)
        ck = self._ckpt_at(block)
        if ck is None:
            return
        # A pinned checkpoint's node is held by its restore owner, so it is never a leaf.
        assert ck.status == READY, f"evicted the node of a {ck.status} checkpoint"
        emit(CheckpointRemoved((ck.block_hash,)))  # after the node's BlockRemoved
        self._drop(ck)
        self.released_stale += 1

    def on_reset(self) -> None:
        """Every node is gone, so is every (Ready) checkpoint."""
        for ck in list(self.ckpts.values()):
            self._drop(ck)
            self.released_stale += 1
        self.experts.clear()

    def with_stats(self, stats: CacheStats) -> CacheStats:
        """``stats`` with the checkpoint counters and the slots in use."""
        return attrs.evolve(
            stats,
            checkpoints_saved=self.saved,
            checkpoints_discarded=self.discarded,
            checkpoints_restored=self.restored,
            checkpoints_released_stale=self.released_stale,
            checkpoints_evicted=self.evicted,
            num_state_slots=self.slots.num_slots,
            num_state_slots_used=len(self.slots.roles),
        )

    def with_snapshot(self, snap: CacheState) -> CacheState:
        """``snap`` with the routed experts on its blocks and the state slots' view."""
        blocks = tuple(
            attrs.evolve(v, routed_experts=self.experts.get(v.block_id)) for v in snap.blocks
        )
        view = StateSlotsView(
            num_runtime_slots=self.max_num_seqs,
            state_budget=self.state_budget,
            decode_state_interval=self.interval,
            free_slots=tuple(self.slots.free_slots()),
            runtime=tuple(self.runtime.items()),
            runtime_positions=tuple(self.positions.items()),
            checkpoints=tuple(
                CheckpointView(ck.slot, ck.status, ck.boundary, ck.owner, ck.node, ck.order)
                for ck in sorted(self.ckpts.values(), key=lambda ck: ck.slot)
            ),
        )
        return attrs.evolve(snap, blocks=blocks, state_slots=view)

    # -- the hybrid calls (the cache has checked the sequence is live) -----------------------

    def attach_experts(self, nodes: Sequence[int | None], experts: Sequence[bytes]) -> None:
        """Routed experts, one per node, go to each published node that has none yet: an
        equal computation enriches, never overwrites."""
        for node, data in zip(nodes, experts, strict=True):
            if node is not None and node not in self.experts:
                self.experts[node] = data

    def restore_issued(self, seq_id: SeqId) -> None:
        """The engine copied the pinned checkpoint into the runtime slot: unpin it."""
        ck = self._ckpt_of(seq_id, PINNED)
        contract.check_restore_pending(seq_id, ck is not None)
        assert ck is not None
        ck.status, ck.owner = READY, None
        self.positions[seq_id] = ck.boundary
        self.restored += 1

    def keep_state(self, seq_id: SeqId, position: int, num_computed: int) -> None:
        """The runtime slot holds the state after ``position`` (checked) tokens."""
        self.positions[seq_id] = contract.check_keep_state(
            seq_id, position, self.positions[seq_id], num_computed
        )

    def state_slot(self, seq_id: SeqId) -> int:
        return self.runtime[seq_id]

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        ck = self._ckpt_of(seq_id, PINNED)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        ck = self._ckpt_of(seq_id, RESERVED)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        position = self.positions[seq_id]
        return None if position is None else StateRef(self.runtime[seq_id], position)
