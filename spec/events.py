"""KV events, in the shape engines' KV-aware routers already consume.

Events are queued as the cache changes and drained by ``take_events()``. A consumer that
applies them in order mirrors exactly the published blocks (INV-EVENTS, checked by
:mod:`prefixkv.spec.event_mirror`). The hashes events carry are event hashes
(:func:`~prefixkv.spec.identity.event_hash`, a 64-bit BLAKE2b of the block's identity
chain), whatever hash indexes the cache: blocks crafted to collide under the index hash
still carry distinct hashes on the wire.

``BlockStored`` carries the whole identity of its blocks: the namespace parts (model, adapter,
salt) and each block's extra keys (multimodal content hashes with their offsets), next to the
hashes, the parent hash and the tokens. A consumer that keyed blocks by tokens and adapter
alone would merge two tenants' blocks that differ only in their salt, or an image prompt
with another image under the same placeholder tokens. ``BlockRemoved`` and
``AllBlocksCleared`` stay minimal: a hash names a block the consumer already knows.

A hybrid (attention + recurrent) cache also says which published blocks carry a restorable
recurrent-state checkpoint, since it hits only at such a block: ``CheckpointStored`` when a
checkpoint becomes Ready on a block, ``CheckpointRemoved`` when it is released while the
cache keeps it (slot pressure) or with its block (a ``BlockRemoved`` of the same hash
precedes it). A full reset's ``AllBlocksCleared`` drops every checkpoint too. These are
events of their own rather than a flag on ``BlockStored``: a checkpoint can become Ready on
a block published long before, and is released apart from its block.

NOTE: the block events are ``NamedTuple`` classes rather than attrs classes: a busy cache
emits one per published or evicted block, and a tuple is several times cheaper to build.
They are still immutable, typed and comparable. The checkpoint events are rare (one per
saved checkpoint) and are attrs classes, so that one never compares equal to a block event
with the same hashes, as two one-field tuples would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import attrs

from .identity import ExtraKey
from .namespace import Namespace

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CheckpointRemoved",
    "CheckpointStored",
    "KVEvent",
    "stored_event",
]


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


def _hash_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class CheckpointStored:
    """Hybrid models: a Ready recurrent-state checkpoint now hangs off each of these
    published blocks, so a request whose prefix ends there can hit it."""

    block_hashes: tuple[int, ...] = attrs.field(converter=_hash_tuple)


@attrs.frozen
class CheckpointRemoved:
    """Hybrid models: these blocks' checkpoints were released (slot pressure, or their
    block was evicted: then the ``BlockRemoved`` comes first)."""

    block_hashes: tuple[int, ...] = attrs.field(converter=_hash_tuple)


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | CheckpointStored | CheckpointRemoved


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
