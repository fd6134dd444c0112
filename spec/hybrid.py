"""Recurrent-state (SSM / hybrid model) checkpoints and routed-expert replay (choices 7, 11).

A hybrid model carries, besides its paged KV, a recurrent state per sequence that cannot be
rebuilt from KV blocks. Reusing a cached prefix therefore needs a saved copy of that state
(a *checkpoint*) at exactly the boundary where the reused prefix ends.

The state slots::

    slots   [ 0 ..................................................... R + B - 1 ]
              R = max_num_seqs runtime slots, B = state_budget checkpoint slots.
              A live sequence holds one runtime slot. Checkpoints take any other slot,
              so idle runtime slots are lent to checkpoints (with B = 0 they are the
              only ones). Slot pressure evicts the oldest unpinned Ready checkpoint.

The checkpoint lifecycle (see docs/checkpoints.md)::

    Free --reserve(seq)--> Reserved --commit reaches it--> Ready <--restore_issued--+
      ^                      |  abort / re-reserve / rollback |                     |
      |                      v                               +--admit hits it--> Pinned
      +---------------- released (discarded, stale, evicted)                 (restore pending)

* A sequence reserves at most one checkpoint at a time, at its *save point*: the last
  complete block of its current prefill chunk, or in decode the deepest multiple of
  ``decode_state_interval`` among its reserved tokens (0: no decode checkpoints):
  :func:`prefixkv.spec.contract.save_point`, shared with the manager like every other
  precondition of this module's calls.
* It becomes Ready only when a commit covers its boundary: then every token before the
  boundary is computed and accepted, so no rejected draft token ever reaches a checkpoint.
  It hangs off the published block (the *node*) that ends at the boundary.
* A hybrid hit ends at the deepest matched boundary with a Ready checkpoint; the admission
  pins that checkpoint until the engine says the restore was issued.
* The cache also tracks which state each runtime slot holds (``runtime_state``): the
  initial state (position 0), the restored checkpoint's once the restore is issued, then
  whatever the engine reports with ``keep_state``. Only the state after the committed
  tokens may be kept: with drafts, the forward yields a state after every draft token, and
  the engine keeps the one after the last accepted one (``num_computed``), never a state
  past it that a rollback would orphan.
* Evicting a node releases its checkpoint at once (stale). A pinned checkpoint's node is
  held by its restore owner's block table, so it is never a leaf and can never become
  stale: INV-CKPT checks exactly that after every step (see docs/checkpoints.md).

Routed-expert data (choice 11) rides on published blocks, is never part of identity, and is
replayed on a hit only when every hit block carries it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import attrs

from . import contract
from .cache import SpecCache, identity_chain
from .checkpoint import CheckpointStatus, SlotRole, StateRef
from .errors import OutOfBlocks, OutOfStateSlots, PrefixCacheError, WrongSlotRole
from .events import CheckpointRemoved, CheckpointStored
from .identity import BlockHasher, fast_hash
from .multimodal import clamp_out_of_spans
from .protocol import HybridPrefixCache
from .request import Request, SeqId
from .results import Admission, CacheStats, Match
from .state import CacheState, CheckpointView, StateSlotsView

__all__ = [
    "CHECKPOINT",
    "PINNED",
    "READY",
    "RESERVED",
    "RUNTIME",
    "CheckpointStatus",
    "HybridSpecCache",
    "SlotRole",
    "StateRef",
    "StateSlotPool",
]

#: Slot roles and checkpoint statuses, by their short names.
RUNTIME, CHECKPOINT = SlotRole.RUNTIME, SlotRole.CHECKPOINT
RESERVED, READY, PINNED = (
    CheckpointStatus.RESERVED,
    CheckpointStatus.READY,
    CheckpointStatus.PINNED,
)


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


@attrs.define
class _Hybrid:
    slots: StateSlotPool
    runtime: dict[SeqId, int] = attrs.Factory(dict)
    # the position of the state each runtime slot holds; None while a restore is pending
    positions: dict[SeqId, int | None] = attrs.Factory(dict)
    ckpts: dict[int, _Ckpt] = attrs.Factory(dict)  # by slot
    experts: dict[int, bytes] = attrs.Factory(dict)  # published block -> routed experts
    order: int = 0
    saved: int = 0
    discarded: int = 0
    restored: int = 0
    released_stale: int = 0
    evicted: int = 0


class HybridSpecCache(SpecCache, HybridPrefixCache):
    """The spec of a prefix cache for hybrid (attention + recurrent) models.

    Everything :class:`SpecCache` does, plus the state-slot pool and checkpoint lifecycle
    of the module doc, plus routed-expert data on published blocks. ``max_num_seqs`` bounds
    live sequences (one runtime slot each); ``state_budget`` is the number of slots beyond
    them; ``decode_state_interval`` (a multiple of ``block_size``, 0 = off) spaces decode
    checkpoints.
    """

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
        self._runtime_slots, self._state_budget, self._interval = contract.check_hybrid_config(
            self.block_size, max_num_seqs, state_budget, decode_state_interval
        )
        self._h = _Hybrid(StateSlotPool(self._runtime_slots + self._state_budget))

    @property
    def max_num_seqs(self) -> int:
        return self._runtime_slots

    @property
    def state_budget(self) -> int:
        return self._state_budget

    @property
    def decode_state_interval(self) -> int:
        return self._interval

    # -- transactions: the hybrid state rolls back with the rest ----------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._trial:  # see SpecCache._transaction
            yield
            return
        saved = copy.deepcopy((self._s, self._h))
        try:
            yield
        except PrefixCacheError:
            self._s, self._h = saved
            raise

    def _would_succeed(self, op: Callable[[SpecCache], object]) -> bool:
        trial = copy.copy(self)
        trial._s, trial._h = copy.deepcopy((self._s, self._h))
        trial._trial = True
        try:
            op(trial)
        except OutOfBlocks:
            return False
        return True

    # -- checkpoints -----------------------------------------------------------------------

    def _ckpt_at(self, node: int) -> _Ckpt | None:
        for ck in self._h.ckpts.values():
            if ck.node == node:
                return ck
        return None

    def _ckpt_of(self, seq_id: SeqId, status: CheckpointStatus) -> _Ckpt | None:
        for ck in self._h.ckpts.values():
            if ck.owner == seq_id and ck.status == status:
                return ck
        return None

    def _drop(self, ck: _Ckpt) -> None:
        del self._h.ckpts[ck.slot]
        self._h.slots.release(ck.slot, CHECKPOINT)

    def _evict_checkpoint(self) -> bool:
        """Slot pressure: release the oldest unpinned Ready checkpoint, if there is one."""
        ready = [ck for ck in self._h.ckpts.values() if ck.status == READY]
        if not ready:
            return False
        victim = min(ready, key=lambda ck: ck.order)
        self._emit(CheckpointRemoved((victim.block_hash,)))
        self._drop(victim)
        self._h.evicted += 1
        return True

    def _take_slot(self, role: SlotRole) -> int | None:
        """The lowest free slot, evicting a checkpoint if none is free; None if none can be."""
        if len(self._h.slots.roles) == self._h.slots.num_slots and not self._evict_checkpoint():
            return None
        return self._h.slots.take(role)

    def _retarget(self, seq_id: SeqId) -> None:
        """Keep the sequence's reservation at its current save point (module doc).

        A reservation elsewhere is discarded first (its tokens were rolled back, or the
        sequence now reaches a deeper save point); a new one is best-effort.
        """
        seq = self._s.seqs[seq_id]
        target = contract.save_point(
            seq.num_computed, seq.num_reserved, seq.prompt_len, self.block_size, self._interval
        )
        current = self._ckpt_of(seq_id, RESERVED)
        if current is not None:
            if current.boundary == target:
                return
            self._drop(current)
            self._h.discarded += 1
        if target:
            slot = self._take_slot(CHECKPOINT)
            if slot is not None:
                self._h.ckpts[slot] = _Ckpt(slot, RESERVED, target, seq_id)

    def _on_evicted(self, block: int) -> None:
        self._h.experts.pop(block, None)
        ck = self._ckpt_at(block)
        if ck is None:
            return
        # A pinned checkpoint's node is held by its restore owner, so it is never a leaf.
        assert ck.status == READY, f"evicted the node of a {ck.status} checkpoint"
        self._emit(CheckpointRemoved((ck.block_hash,)))  # after the node's BlockRemoved
        self._drop(ck)
        self._h.released_stale += 1

    # -- match -----------------------------------------------------------------------------

    def match(self, req: Request) -> Match:
        """The KV match, cut back to the deepest boundary with a Ready checkpoint.

        ::

            KV match      [ b0 ][ b1 ][ b2 ][ b3 ][ b4 ]           (after cap and span clamp)
            checkpoints          ^R          ^P                    R ready, P pinned elsewhere
            hit           [ b0 ][ b1 ]                             -> restore R, 2 blocks hit
            window (k=1)  [ b0 ][ b1 ]{ b2 }{ b3 }{ b4 }           private span from R to the
                                                                   KV hit, longer than k
        """
        m = super().match(req)
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
        experts = [self._h.experts.get(b) for b in m.block_ids[:c]]
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

    # -- operations ------------------------------------------------------------------------

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        """Admission, then: pin the restore source, take a runtime slot, reserve a checkpoint.

        Raises :class:`OutOfStateSlots` (an ``OutOfBlocks``) when ``max_num_seqs`` sequences
        are live, or every slot is held by runtimes, reservations and pinned checkpoints.
        """
        with self._transaction():
            m = self.match(req)
            adm = super().admit(req, num_new_tokens)
            if m.restore_slot is not None:
                ck = self._h.ckpts[m.restore_slot]
                ck.status, ck.owner = PINNED, req.seq_id
            contract.check_runtime_slots(len(self._h.runtime), self._runtime_slots)
            slot = self._take_slot(RUNTIME)
            if slot is None:
                raise contract.no_state_slot()
            self._h.runtime[req.seq_id] = slot
            # the initial state, or nothing until the restore is issued
            self._h.positions[req.seq_id] = None if m.restore_slot is not None else 0
            self._retarget(req.seq_id)
            return attrs.evolve(
                adm, restore_slot=m.restore_slot, state_slot=slot, routed_experts=m.routed_experts
            )

    def continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> int:
        with self._transaction():
            n = super().continue_prefill(seq_id, num_new_tokens)
            self._retarget(seq_id)
            return n

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        with self._transaction():
            new = super().append(seq_id, num_tokens)
            self._retarget(seq_id)
            return new

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        with self._transaction():
            super().rollback(seq_id, num_tokens)
            self._retarget(seq_id)

    def commit(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        routed_experts: Sequence[bytes] | None = None,
    ) -> None:
        """Commit; attach routed experts; a covered reservation becomes Ready.

        ``routed_experts`` holds one entry per block this commit completes. It goes to the
        published block with that block's identity (the sequence's own, or the twin that was
        published first) unless that block already carries some: an equal computation
        enriches, never overwrites.
        """
        with self._transaction():
            seq = self._seq(seq_id)
            before = seq.num_computed
            super().commit(seq_id, num_computed, accepted_tokens)
            bs = self.block_size
            first, stop = before // bs, seq.num_computed // bs
            experts = contract.check_routed_experts(routed_experts, stop - first)
            chain = identity_chain(seq.namespace.key(), seq.tokens, bs, stop, seq.spans)
            if experts is not None:
                for j, data in zip(range(first, stop), experts, strict=True):
                    node = self._s.index.get(chain[j])
                    if node is not None and node not in self._h.experts:
                        self._h.experts[node] = data
            ck = self._ckpt_of(seq_id, RESERVED)
            if ck is not None and ck.boundary <= seq.num_computed:
                node = self._s.index.get(chain[ck.boundary // bs - 1])
                if node is None or self._ckpt_at(node) is not None:
                    self._drop(ck)  # an equal checkpoint exists, or the chain is orphaned
                    self._h.discarded += 1
                else:
                    ck.status, ck.owner, ck.node, ck.order = READY, None, node, self._h.order
                    if self._record_events:
                        h = self._s.blocks[node].event_hash
                        assert h is not None, "a checkpoint's node is published"
                        ck.block_hash = h
                        self._emit(CheckpointStored((h,)))
                    self._h.order += 1
                    self._h.saved += 1
            self._retarget(seq_id)

    def restore_issued(self, seq_id: SeqId) -> None:
        """The engine copied the pinned checkpoint into the runtime slot: unpin it."""
        with self._transaction():
            self._seq(seq_id)
            ck = self._ckpt_of(seq_id, PINNED)
            contract.check_restore_pending(seq_id, ck is not None)
            assert ck is not None
            ck.status, ck.owner = READY, None
            self._h.positions[seq_id] = ck.boundary
            self._h.restored += 1

    def keep_state(self, seq_id: SeqId, position: int) -> None:
        """The engine wrote the state after ``position`` tokens into the runtime slot.

        ``position`` must be the sequence's committed tokens (``num_computed``): with
        drafts, the state after the last accepted draft token. A state past them belongs
        to tokens that were rolled back or are not committed yet, and one before them is
        stale; both raise :class:`~.errors.InvalidOperation`, as does a pending restore (the slot
        must receive the checkpoint first).
        """
        with self._transaction():
            seq = self._seq(seq_id)
            self._h.positions[seq_id] = contract.check_keep_state(
                seq_id, position, self._h.positions[seq_id], seq.num_computed
            )

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        """Release sequences; each gives back its runtime slot, drops its reservation and
        unpins the checkpoint of a restore it never issued (an aborted restore)."""
        with self._transaction():
            ids = contract.check_free_list(seq_ids, self._s.seqs)
            super().free(ids)
            for seq_id in ids:
                self._release_seq(seq_id)

    def _release_seq(self, seq_id: SeqId) -> None:
        self._h.slots.release(self._h.runtime.pop(seq_id), RUNTIME)
        del self._h.positions[seq_id]
        ck = self._ckpt_of(seq_id, RESERVED)
        if ck is not None:
            self._drop(ck)
            self._h.discarded += 1
        ck = self._ckpt_of(seq_id, PINNED)
        if ck is not None:
            ck.status, ck.owner = READY, None

    def reset(self, *, preserve_cache: bool) -> None:
        with self._transaction():
            super().reset(preserve_cache=preserve_cache)
            if not preserve_cache:  # every node is gone, so is every (Ready) checkpoint
                for ck in list(self._h.ckpts.values()):
                    self._drop(ck)
                    self._h.released_stale += 1
                self._h.experts.clear()

    # -- queries ---------------------------------------------------------------------------

    def state_slot(self, seq_id: SeqId) -> int:
        """The runtime state slot of a live sequence."""
        self._seq(seq_id)
        return self._h.runtime[seq_id]

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        """The checkpoint to copy into the runtime slot before the first forward: its slot
        and its position (where the sequence's hit ends)."""
        self._seq(seq_id)
        ck = self._ckpt_of(seq_id, PINNED)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        """Save the state after ``position`` tokens into ``slot`` during this step."""
        self._seq(seq_id)
        ck = self._ckpt_of(seq_id, RESERVED)
        return None if ck is None else StateRef(ck.slot, ck.boundary)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        """The runtime slot and the position of the state it holds (``None`` while a
        restore is pending). The next forward starts there."""
        self._seq(seq_id)
        position = self._h.positions[seq_id]
        return None if position is None else StateRef(self._h.runtime[seq_id], position)

    def stats(self) -> CacheStats:
        h = self._h
        return attrs.evolve(
            super().stats(),
            checkpoints_saved=h.saved,
            checkpoints_discarded=h.discarded,
            checkpoints_restored=h.restored,
            checkpoints_released_stale=h.released_stale,
            checkpoints_evicted=h.evicted,
            num_state_slots=h.slots.num_slots,
            num_state_slots_used=len(h.slots.roles),
        )

    def snapshot(self) -> CacheState:
        snap = super().snapshot()
        h = self._h
        blocks = tuple(
            attrs.evolve(v, routed_experts=h.experts.get(v.block_id)) for v in snap.blocks
        )
        view = StateSlotsView(
            num_runtime_slots=self._runtime_slots,
            state_budget=self._state_budget,
            decode_state_interval=self._interval,
            free_slots=tuple(h.slots.free_slots()),
            runtime=tuple(h.runtime.items()),
            runtime_positions=tuple(h.positions.items()),
            checkpoints=tuple(
                CheckpointView(ck.slot, ck.status, ck.boundary, ck.owner, ck.node, ck.order)
                for ck in sorted(h.ckpts.values(), key=lambda ck: ck.slot)
            ),
        )
        return attrs.evolve(snap, blocks=blocks, state_slots=view)
