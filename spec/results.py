"""Plain results the cache returns: matches, admissions and statistics."""

from __future__ import annotations

import attrs

from .request import SeqId

__all__ = ["Admission", "CacheStats", "LostReuse", "Match"]


@attrs.frozen
class LostReuse:
    """Prompt tokens that were cached but not reused, by cause.

    ``cap``: the last full block matched, but at least one prompt token must be computed
    (choice 4), so the hit was capped at ``floor((len - 1) / block_size)`` blocks.
    """

    cap: int = 0

    @property
    def total(self) -> int:
        return self.cap


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

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


@attrs.frozen
class Admission:
    """The outcome of a successful :meth:`admit`.

    ``block_ids`` is the whole block table: the ``num_cached_tokens // block_size`` attached
    cached blocks, then ``num_new_blocks`` fresh private ones covering the scheduled tokens.
    """

    seq_id: SeqId
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_ids: tuple[int, ...]
    num_new_blocks: int
    num_evicted: int


@attrs.frozen
class CacheStats:
    """Counters since construction (a reset keeps them) and current pool occupancy.

    Token counters count prompt tokens at admission. ``prefill_tokens_computed`` +
    ``prefill_tokens_skipped`` == ``prefill_tokens`` (INV-STATS).
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

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def utilization(self) -> float:
        """Fraction of the pool held by live sequences."""
        return self.num_used_blocks / self.num_blocks
