"""The manager's counters: one mutable record, rendered as a ``CacheStats`` on demand.

NOTE: the counters are plain attributes of one slotted object rather than attributes of the
manager, so that they are declared once (here), updated in place on the hot paths, and
copied field by field into the public :class:`~prefixkv.spec.results.CacheStats`.
"""

from __future__ import annotations

__all__ = ["Counters"]


class Counters:
    """Statistics since construction (a reset keeps them); see ``CacheStats``."""

    __slots__ = (
        "admissions",
        "blocks_published",
        "evictions",
        "hits",
        "lost_cap",
        "lost_checkpoint",
        "lost_evicted",
        "lost_never_cached",
        "lost_span",
        "lost_window",
        "prefill_tokens",
        "prefill_tokens_computed",
        "prefill_tokens_skipped",
        "queries",
    )

    admissions: int
    blocks_published: int
    evictions: int
    hits: int
    lost_cap: int
    lost_checkpoint: int
    lost_evicted: int
    lost_never_cached: int
    lost_span: int
    lost_window: int
    prefill_tokens: int
    prefill_tokens_computed: int
    prefill_tokens_skipped: int
    queries: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        """The counters by their ``CacheStats`` field names."""
        return {name: getattr(self, name) for name in self.__slots__}
