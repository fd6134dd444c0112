"""Per-sequence state of the optimized cache manager."""

from __future__ import annotations

from array import array

from prefixkv.spec.multimodal import MultimodalSpan
from prefixkv.spec.request import SeqId

__all__ = ["SeqState"]


class SeqState:
    """A live sequence.

    ``hashes[j]`` is the index key of block j's identity for every *settled* block
    (``j < num_computed // block_size``): each was either attached from the cache or
    considered for publication when it filled up. ``wire[j]`` is the event hash of the
    same block (:func:`prefixkv.spec.identity.event_hash`) while the manager records events;
    otherwise it stays empty. ``seed`` is the key a root block
    chains from. ``tokens`` are the sequence's token ids as a native uint32 array.

    ``prompt_keys`` holds the index keys of the prompt's full blocks, computed up front by the
    admission's lookup (empty when it did not).

    ``canon_*`` remember which published block currently carries the identity of the last
    settled block when the sequence's own block there is a private duplicate; the pair
    ``(canon_block, canon_gen)`` detects that the canonical block was evicted since.
    """

    __slots__ = (
        "adapter",
        "blocks",
        "canon_block",
        "canon_gen",
        "canon_j",
        "hashes",
        "kv_token_limit",
        "namespace",
        "ns_digest",
        "num_cached",
        "num_computed",
        "num_reserved",
        "prompt_keys",
        "prompt_len",
        "seed",
        "seq_id",
        "spans",
        "tokens",
        "window_blocks",
        "wire",
    )

    def __init__(
        self,
        seq_id: SeqId,
        namespace: bytes,
        ns_digest: int,
        seed: int,
        adapter: str | None,
        tokens: array[int],
        blocks: list[int],
        hashes: list[int],
        wire: list[int],
        num_computed: int,
        num_reserved: int,
        num_cached: int,
        window_blocks: int,
        kv_token_limit: int | None,
        spans: tuple[MultimodalSpan, ...],
    ) -> None:
        self.seq_id = seq_id
        self.namespace = namespace
        self.ns_digest = ns_digest
        self.seed = seed
        self.adapter = adapter
        self.tokens = tokens
        self.blocks = blocks
        self.hashes = hashes
        self.wire = wire
        self.num_computed = num_computed
        self.num_reserved = num_reserved
        self.prompt_len = len(tokens)
        self.num_cached = num_cached
        self.window_blocks = window_blocks
        self.kv_token_limit = kv_token_limit
        self.spans = spans
        self.canon_j = -1
        self.canon_block = -1
        self.canon_gen = -1
        #: The index keys of the prompt's full blocks when the admission computed them all
        #: up front (a prompt without spans), else empty: publishing block j of the prompt
        #: takes ``prompt_keys[j]`` instead of hashing the block again.
        self.prompt_keys: list[int] = []
