"""Per-sequence state of the optimized cache manager."""

from __future__ import annotations

from prefixkv.spec.request import SeqId

__all__ = ["SeqState"]


class SeqState:
    """A live sequence.

    ``hashes[j]`` is the chain hash of block j's identity for every *settled* block
    (``j < num_computed // block_size``): each was either attached from the cache or
    considered for publication when it filled up.

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
        "namespace",
        "ns_digest",
        "num_computed",
        "num_reserved",
        "seq_id",
        "tokens",
    )

    def __init__(
        self,
        seq_id: SeqId,
        namespace: bytes,
        ns_digest: int,
        adapter: str | None,
        tokens: list[int],
        blocks: list[int],
        hashes: list[int],
        num_computed: int,
        num_reserved: int,
    ) -> None:
        self.seq_id = seq_id
        self.namespace = namespace
        self.ns_digest = ns_digest
        self.adapter = adapter
        self.tokens = tokens
        self.blocks = blocks
        self.hashes = hashes
        self.num_computed = num_computed
        self.num_reserved = num_reserved
        self.canon_j = -1
        self.canon_block = -1
        self.canon_gen = -1
