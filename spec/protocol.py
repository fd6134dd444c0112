"""The public contract every prefixkv cache manager fulfils.

:class:`~prefixkv.spec.cache.SpecCache` is the executable definition of this protocol;
:class:`~prefixkv.impl.cache.PrefixCacheManager` is the fast implementation. Anything that
satisfies :class:`PrefixCache` can be driven by the differential state machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from .checkpoint import StateRef
from .events import KVEvent
from .request import Request, SeqId
from .results import Admission, CacheStats, Match
from .state import CacheState
from .steps import BatchOutcome, DecodeStep

__all__ = ["EngineSteps", "HybridPrefixCache", "Inspectable", "PrefixCache"]


@runtime_checkable
class PrefixCache(Protocol):
    """A paged KV prefix cache.

    Every method either returns or raises a
    :class:`~prefixkv.spec.errors.PrefixCacheError` and changes nothing (INV-TXN).
    """

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    def match(self, req: Request) -> Match:
        """The longest verified cached prefix of ``req``. Pure."""
        ...

    def can_admit(self, req: Request, num_new_tokens: int | None = None) -> bool:
        """Exactly whether :meth:`admit` with the same arguments would succeed now."""
        ...

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        """Match -> pin -> evict -> allocate, as one transaction.

        ``num_new_tokens`` is the token budget for this step: the sequence gets slots for its
        cached prefix plus ``min(num_new_tokens, uncached prompt tokens)`` tokens; ``None``
        schedules the whole uncached prompt.
        """
        ...

    def can_continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> bool:
        """Exactly whether :meth:`continue_prefill` with the same arguments would succeed."""
        ...

    def continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> int:
        """Reserve the next prefill chunk (choice 8); returns the tokens scheduled.

        Allowed only when the previous chunk is committed and prompt tokens remain. The chunk
        holds at most ``num_new_tokens`` and ``kv_token_limit`` tokens and never splits a
        multimodal span. ``OutOfBlocks`` keeps the committed prefix and changes nothing.
        """
        ...

    def can_append(self, seq_id: SeqId, num_tokens: int) -> bool:
        """Exactly whether :meth:`append` with the same arguments would succeed now."""
        ...

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        """Reserve ``num_tokens`` more slots at the tail; returns the new block ids."""
        ...

    def commit(self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int] = ()) -> None:
        """Record sampled tokens, then mark ``num_computed`` more slots as written.

        Full blocks whose KV is written and whose tokens are accepted become matchable.
        """
        ...

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        """Give back the last ``num_tokens`` reserved, unwritten slots (rejected drafts)."""
        ...

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        """Release sequences, in order; a duplicate or unknown id fails the whole batch."""
        ...

    def evict(self, num_blocks: int) -> int:
        """Evict up to ``num_blocks`` cached leaves; returns how many were evicted."""
        ...

    def reset(self, *, preserve_cache: bool) -> None:
        """``preserve_cache=True`` releases every live sequence and keeps published blocks.

        ``preserve_cache=False`` drops everything and raises ``CacheBusy`` while a
        sequence is live.
        """
        ...

    def block_table(self, seq_id: SeqId) -> tuple[int, ...]: ...

    def num_computed_tokens(self, seq_id: SeqId) -> int: ...

    def seq_ids(self) -> tuple[SeqId, ...]:
        """Live sequences in admission order."""
        ...

    def stats(self) -> CacheStats: ...

    def take_events(self) -> list[KVEvent]:
        """Drain the queued KV events, oldest first."""
        ...


@runtime_checkable
class EngineSteps(Protocol):
    """The engine-shaped calls (see :mod:`prefixkv.spec.steps`): one fused call per
    sequence per decode step, and a whole scheduler step in one call (as step records or as
    parallel columns).

    A separate protocol, so that a conformance adapter need not offer them: both are defined
    by the per-call API of :class:`PrefixCache`, and both prefixkv managers and the spec
    have them.
    """

    def advance(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        *,
        num_rejected: int = 0,
        num_reserve: int = 1,
    ) -> list[int]:
        """``commit``, then ``rollback(num_rejected)``, then ``append(num_reserve)``, as
        one transaction; returns the new block ids."""
        ...

    def advance_batch(self, steps: Iterable[DecodeStep]) -> BatchOutcome:
        """``advance`` per step, in order, each atomic, up to the first that raises."""
        ...

    def advance_columns(
        self,
        seq_ids: Sequence[SeqId],
        num_computed: Sequence[int],
        accepted_tokens: Sequence[Sequence[int]],
        num_rejected: int | Sequence[int] = 0,
        num_reserve: int | Sequence[int] = 1,
    ) -> BatchOutcome:
        """``advance_batch`` of the steps given as parallel columns (an int count stands
        for every step); malformed columns raise before anything is applied."""
        ...


@runtime_checkable
class Inspectable(Protocol):
    """A cache that can render an implementation-neutral snapshot of itself."""

    def snapshot(self) -> CacheState: ...


@runtime_checkable
class HybridPrefixCache(PrefixCache, Protocol):
    """A prefix cache for hybrid (attention + recurrent) models: checkpoints and routed
    experts (choices 7 and 11). An optional capability: see docs/checkpoints.md.

    ``match``/``admit`` hit only at a boundary with a Ready checkpoint, and report the slot
    to restore (``restore_slot``) and the runtime slot (``state_slot``).
    """

    def commit(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        routed_experts: Sequence[bytes] | None = None,
    ) -> None:
        """As :meth:`PrefixCache.commit`; ``routed_experts`` has one entry per block this
        commit completes. A reserved checkpoint whose boundary the commit covers becomes
        Ready."""
        ...

    def restore_issued(self, seq_id: SeqId) -> None:
        """The engine copied the pending restore's checkpoint; unpin it."""
        ...

    def pending_restore(self, seq_id: SeqId) -> StateRef | None:
        """The checkpoint to restore before the first forward (its slot and position), if
        one is pending."""
        ...

    def state_slot(self, seq_id: SeqId) -> int:
        """The sequence's runtime recurrent-state slot."""
        ...

    def checkpoint_reservation(self, seq_id: SeqId) -> StateRef | None:
        """Where this step must save the state (slot, position), if anywhere."""
        ...

    def runtime_state(self, seq_id: SeqId) -> StateRef | None:
        """The runtime slot and the position of the state it holds; ``None`` while a
        restore is pending."""
        ...

    def keep_state(self, seq_id: SeqId, position: int) -> None:
        """The engine wrote the state after ``position`` tokens (its committed tokens, the
        last accepted draft included) into the runtime slot."""
        ...
