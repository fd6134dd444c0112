"""KV events, in the shape engines' KV-aware routers already consume.

Events are queued as the cache changes and drained by ``take_events()``. Hashes are the
cache's configured block hash; with :func:`~prefixkv.spec.identity.weak_hash` two blocks may
share one, so routers across processes should run with ``sha256``.

NOTE: events are ``NamedTuple`` classes rather than attrs classes: a busy cache emits one per
published or evicted block, and a tuple is several times cheaper to build. They are still
immutable, typed and comparable.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent"]


class BlockStored(NamedTuple):
    """A full block became matchable (after commit, never at schedule time)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: str | None


class BlockRemoved(NamedTuple):
    """Blocks stopped being matchable (evicted)."""

    block_hashes: tuple[int, ...]


class AllBlocksCleared(NamedTuple):
    """A full reset dropped every published block."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
