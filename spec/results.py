"""Plain results the cache returns: matches, admissions and statistics."""

from __future__ import annotations

import attrs

from .request import SeqId

__all__ = ["Admission", "CacheStats", "LostReuse", "Match"]


@attrs.frozen
class LostReuse:
    """Prompt tokens that were not reused, split by cause.

    ::

        prompt  |<- cached ->|<- window ->|<- span ->|<- cap ->|<- evicted ->|<- never ->|
                 attached     matched but  matched,   matched,  were cached,  every other
                 blocks       recomputed   clamped    capped    evicted since prompt token

    * ``window``: matched blocks recomputed privately (``recompute_blocks``, choice 6).
    * ``span``: matched blocks dropped so the match does not end inside a span (choice 5).
    * ``cap``: the last full block matched, but one prompt token must be computed (choice 4).
    * ``evicted``: the full blocks right after the hit were published once and evicted
      (tracked by identity in a record of the last ``num_blocks`` evictions, so the split
      does not depend on the hasher).
    * ``never_cached``: the rest, including the partial last block.
    * ``checkpoint`` (hybrid models only): blocks the KV chain could serve, past the deepest
      boundary with a Ready recurrent-state checkpoint (choice 7). Always 0 otherwise.

    ``cached + window + span + cap + evicted + never_cached + checkpoint == len(prompt)``.
    """

    window: int = 0
    span: int = 0
    cap: int = 0
    evicted: int = 0
    never_cached: int = 0
    checkpoint: int = 0

    @property
    def total(self) -> int:
        return (
            self.window + self.span + self.cap + self.evicted + self.never_cached + self.checkpoint
        )


@attrs.frozen
class Match:
    """The longest verified cached prefix of a request. Pure: computing it changes nothing.

    ::

        prompt   |<------------------- num_prompt_tokens ------------------->|
        blocks   [ b0 ][ b1 ][ b2 ][ b3 ][ b4 ]...
                 |<-- num_cached_tokens -->|      (block-aligned; <= len - 1)
    """

    num_prompt_tokens: int
    num_cached_tokens: int
    block_ids: tuple[int, ...]
    lost: LostReuse = LostReuse()
    num_window_blocks: int = 0
    """Matched blocks after ``block_ids`` that will be recomputed into private blocks."""
    restore_slot: int | None = None
    """Hybrid models: the state slot of the Ready checkpoint at the hit's boundary."""
    routed_experts: tuple[bytes, ...] | None = None
    """Routed-expert data of every hit block, or None unless every hit block carries it."""

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


@attrs.frozen
class Admission:
    """The outcome of a successful :meth:`~.protocol.PrefixCache.admit`.

    ``block_ids`` is the whole block table: the ``num_cached_tokens // block_size`` attached
    cached blocks, then ``num_new_blocks`` fresh private ones covering the scheduled tokens.
    """

    seq_id: SeqId
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_ids: tuple[int, ...]
    num_new_blocks: int
    num_evicted: int
    lost: LostReuse = LostReuse()
    num_window_blocks: int = 0
    restore_slot: int | None = None
    """Hybrid models: the checkpoint to restore, pinned until ``restore_issued``."""
    state_slot: int | None = None
    """Hybrid models: the sequence's runtime recurrent-state slot."""
    routed_experts: tuple[bytes, ...] | None = None
    """Routed-expert data to replay for the hit blocks (see :class:`Match`)."""


@attrs.frozen
class CacheStats:
    """Counters since construction (a reset keeps them) and current pool occupancy.

    Token counters count prompt tokens at admission. ``prefill_tokens_computed`` +
    ``prefill_tokens_skipped`` == ``prefill_tokens`` (INV-STATS), and the ``lost_*`` split
    of :class:`LostReuse` adds up to ``prefill_tokens_computed``.
    """

    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    num_published_blocks: int
    num_sequences: int
    queries: int
    hits: int
    prefill_tokens: int
    prefill_tokens_computed: int
    prefill_tokens_skipped: int
    admissions: int
    evictions: int
    blocks_published: int
    lost_window: int = 0
    lost_span: int = 0
    lost_cap: int = 0
    lost_evicted: int = 0
    lost_never_cached: int = 0
    lost_checkpoint: int = 0
    # Hybrid models only (choice 7); 0 otherwise. A checkpoint's fate is one of saved (it
    # became Ready), discarded (reserved, never Ready), then restored (any number of times),
    # released stale (its node was evicted) or evicted (its slot was taken back).
    checkpoints_saved: int = 0
    checkpoints_discarded: int = 0
    checkpoints_restored: int = 0
    checkpoints_released_stale: int = 0
    checkpoints_evicted: int = 0
    num_state_slots: int = 0
    num_state_slots_used: int = 0

    @property
    def state_slot_utilization(self) -> float:
        """Fraction of the recurrent-state slots (runtime and checkpoint) in use."""
        return self.num_state_slots_used / self.num_state_slots if self.num_state_slots else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def utilization(self) -> float:
        """Fraction of the pool held by live sequences."""
        return self.num_used_blocks / self.num_blocks
