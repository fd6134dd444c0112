"""KV events, in the shape engines' KV-aware routers already consume.

Events are queued as the cache changes and drained by ``take_events()``. A consumer that
applies them in order mirrors exactly the published blocks (INV-EVENTS, checked by
:mod:`prefixkv.spec.event_mirror`). Hashes are the cache's configured block hash; with
:func:`~prefixkv.spec.hashing.weak_hash` two blocks may share one, so routers across
processes should run with ``sha256``.

``BlockStored`` carries the whole identity of its blocks: the namespace parts (model, adapter,
salt) and each block's extra keys (multimodal content hashes with their offsets), next to the
hashes, the parent hash and the tokens. A consumer that keyed blocks by tokens and adapter
alone would merge two tenants' blocks that differ only in their salt, or an image prompt
with another image under the same placeholder tokens. ``BlockRemoved`` and
``AllBlocksCleared`` stay minimal: a hash names a block the consumer already knows.

NOTE: events are ``NamedTuple`` classes rather than attrs classes: a busy cache emits one per
published or evicted block, and a tuple is several times cheaper to build. They are still
immutable, typed and comparable.
"""

from __future__ import annotations

from typing import NamedTuple

from .identity import ExtraKey
from .namespace import Namespace

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent", "stored_event"]


class BlockStored(NamedTuple):
    """Full blocks became matchable (after commit, never at schedule time).

    ``block_hashes[i]`` is the hash of the i-th block, chained from ``parent_block_hash``
    (``None`` for a first block); ``token_ids`` holds ``block_size`` tokens per block and
    ``extra_keys[i]`` the i-th block's extra keys, ``()`` for a text-only block.
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    model: str
    adapter: str | None
    salt: bytes | None
    extra_keys: tuple[tuple[ExtraKey, ...], ...]


class BlockRemoved(NamedTuple):
    """Blocks stopped being matchable (evicted)."""

    block_hashes: tuple[int, ...]


class AllBlocksCleared(NamedTuple):
    """A full reset dropped every published block."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def stored_event(
    block_hash: int,
    parent_hash: int | None,
    token_ids: tuple[int, ...],
    block_size: int,
    namespace_key: bytes,
    extra_keys: tuple[ExtraKey, ...],
) -> BlockStored:
    """One block's ``BlockStored``, for a cache that keeps namespaces as their keys."""
    ns = Namespace.from_key(namespace_key)
    return BlockStored(
        (block_hash,),
        parent_hash,
        token_ids,
        block_size,
        ns.model,
        ns.adapter,
        ns.salt,
        (extra_keys,),
    )
