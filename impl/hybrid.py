"""The optimized prefix cache for hybrid (attention + recurrent) models.

Same contract and step-for-step behaviour as :class:`prefixkv.spec.hybrid.HybridSpecCache`
(the hybrid differential machine holds it to that). It is
:class:`~prefixkv.impl.cache.PrefixCacheManager` built with a checkpoint store
(:mod:`._checkpoints`: the state-slot pool, the checkpoint lifecycle and routed-expert data,
plugged in through the manager's hooks), plus the hybrid calls of
:class:`~prefixkv.spec.protocol.HybridPrefixCache`, each of which checks the sequence and
hands over to the store.

The non-hybrid manager pays for none of this: without a store each hook is one ``None``
check, on the calls that change a reservation or complete a block.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.spec.checkpoint import StateRef
from prefixkv.spec.identity import BlockHasher, fast_hash
from prefixkv.spec.protocol import HybridPrefixCache
from prefixkv.spec.request import SeqId

from ._checkpoints import CheckpointStore
from .cache import PrefixCacheManager

__all__ = ["HybridPrefixCacheManager"]


class HybridPrefixCacheManager(PrefixCacheManager, HybridPrefixCache):
    """A prefix cache manager with recurrent-state checkpoints; see the module doc."""

    #: The store each manager builds (a store with a seeded bug, in tests).
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
        self._store = self.store_type(
            max_num_seqs=max_num_seqs,
            state_budget=state_budget,
            decode_state_interval=decode_state_interval,
        )
        super().__init__(
            num_blocks,
            block_size,
            hasher=hasher,
            record_events=record_events,
            checkpoints=self._store,
        )

    @property
    def max_num_seqs(self) -> int:
        return self._store.max_num_seqs

    @property
    def state_budget(self) -> int:
        return self._store.state_budget

    @property
    def decode_state_interval(self) -> int:
        return self._store.interval

    def commit(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        routed_experts: Sequence[bytes] | None = None,
    ) -> None:
        if routed_experts is None:
            super().commit(seq_id, num_computed, accepted_tokens)
            return
        # Everything the commit raises is checked before anything changes, the commit's own
        # arguments first (the spec's order).
        seq = self._seq(seq_id)
        _, new_computed = self._check_commit_args(seq, num_computed, accepted_tokens)
        experts = self._store.check_experts(seq, new_computed, routed_experts)
        # NOTE: the experts of the blocks this commit completes go to blocks ``first`` on.
        first = seq.num_computed // self.block_size
        super().commit(seq_id, num_computed, accepted_tokens)
        if experts:
            self._store.attach_experts(seq, first, experts)

    def restore_issued(self, seq_id: SeqId) -> None:
        self._seq(seq_id)
        self._store.restore_issued(seq_id)

    def keep_state(self, seq_id: SeqId, position: int) -> None:
        seq = self._seq(seq_id)
        self._store.keep_state(seq_id, position, seq.num_computed)

    def state_slot(self, seq_id: SeqId) -> int:
        self._seq(seq_id)
        return self._store.state_slot(seq_id)

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        return self._store.pending_restore(seq_id)

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        return self._store.checkpoint_reservation(seq_id)

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        self._seq(seq_id)
        return self._store.runtime_state(seq_id)
