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

from collections.abc import Sequence

from . import contract
from .cache import SpecCache
from .checkpoint import CheckpointStatus, SlotRole, StateRef
from .checkpoint_store import (
    CHECKPOINT,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    CheckpointStore,
    StateSlotPool,
)
from .identity import BlockHasher, fast_hash
from .protocol import HybridPrefixCache
from .request import SeqId

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


class HybridSpecCache(SpecCache, HybridPrefixCache):
    """The spec of a prefix cache for hybrid (attention + recurrent) models.

    A :class:`SpecCache` with a :class:`~.checkpoint_store.CheckpointStore`: everything
    :class:`SpecCache` does, plus the state-slot pool and checkpoint lifecycle of the module
    doc, plus routed-expert data on published blocks. ``max_num_seqs`` bounds live sequences
    (one runtime slot each); ``state_budget`` is the number of slots beyond them;
    ``decode_state_interval`` (a multiple of ``block_size``, 0 = off) spaces decode
    checkpoints. The hybrid calls below check the sequence and hand over to the store.
    """

    #: The store each cache builds (a drifted store, in the proofs' seeded drifts).
    store_type: type[CheckpointStore] = CheckpointStore

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
        store = self.store_type(
            max_num_seqs=max_num_seqs,
            state_budget=state_budget,
            decode_state_interval=decode_state_interval,
        )
        super().__init__(
            num_blocks, block_size, hasher=hasher, record_events=record_events, checkpoints=store
        )

    @property
    def _store(self) -> CheckpointStore:
        # NOTE: read through the cache every time: a transaction that fails puts a copy of
        # the store back in place of the one it started with.
        store = self._checkpoints
        assert store is not None
        return store

    @property
    def max_num_seqs(self) -> int:
        return self._store.max_num_seqs

    @property
    def state_budget(self) -> int:
        return self._store.state_budget

    @property
    def decode_state_interval(self) -> int:
        return self._store.interval

    # -- operations ------------------------------------------------------------------------

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
            first = seq.num_computed // self.block_size
            super().commit(seq_id, num_computed, accepted_tokens)
            stop = seq.num_computed // self.block_size
            experts = contract.check_routed_experts(routed_experts, stop - first)
            if experts is not None:
                nodes = self._published_nodes(seq, stop)[first:]
                self._store.attach_experts(nodes, experts)

    def restore_issued(self, seq_id: SeqId) -> None:
        """The engine copied the pinned checkpoint into the runtime slot: unpin it."""
        with self._transaction():
            self._seq(seq_id)
            self._store.restore_issued(seq_id)

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
            self._store.keep_state(seq_id, position, seq.num_computed)

    # -- queries ---------------------------------------------------------------------------

    def state_slot(self, seq_id: SeqId) -> int:
        """The runtime state slot of a live sequence."""
        self._seq(seq_id)
        return self._store.state_slot(seq_id)

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        """The checkpoint to copy into the runtime slot before the first forward: its slot
        and its position (where the sequence's hit ends)."""
        self._seq(seq_id)
        return self._store.pending_restore(seq_id)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        """Save the state after ``position`` tokens into ``slot`` during this step."""
        self._seq(seq_id)
        return self._store.checkpoint_reservation(seq_id)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        """The runtime slot and the position of the state it holds (``None`` while a
        restore is pending). The next forward starts there."""
        self._seq(seq_id)
        return self._store.runtime_state(seq_id)
