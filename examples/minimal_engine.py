"""A minimal block manager, in the style of the smallest open-source serving engines.

It knows nothing of prefixkv. A block keeps its chained hash and its tokens, and no parent
pointer. The index maps a hash to the newest block computed with it (last wins: an older
copy stays cached, read-only, until it is reused). Freed blocks go to the back of a free
list and keep their hash, so a later prompt can still hit them; a block is evicted as the
front of the free list is reused. A prompt is admitted whole, and decode reserves one slot
a step. A block is published (hashed and indexed) once its KV is written.

:data:`BUGS` holds the same engine with one realistic bug each.
"""

from __future__ import annotations

from collections import deque

__all__ = ["BUGS", "Block", "MinimalEngine", "NoFreeBlocks", "Sequence"]


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks for an allocation."""


class Block:
    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1  # set while the block is cached
        self.token_ids: list[int] = []


class Sequence:
    def __init__(self, seq_id: int | str, token_ids: list[int], namespace: bytes) -> None:
        self.seq_id, self.token_ids, self.namespace = seq_id, list(token_ids), namespace
        self.num_prompt_tokens = len(token_ids)
        self.block_table: list[int] = []
        self.num_cached_tokens = self.num_computed_tokens = self.num_slots = 0


class MinimalEngine:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.seqs: dict[int | str, Sequence] = {}

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int, namespace: bytes) -> int:
        return hash((prefix, namespace, tuple(token_ids)))

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks a prompt starts with (its last token is always computed)."""
        bs, hits, h = self.block_size, [], -1
        for j in range((len(seq.token_ids) - 1) // bs):
            token_ids = seq.token_ids[j * bs : (j + 1) * bs]
            h = self.compute_hash(token_ids, h, seq.namespace)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                break
            hits.append(block_id)
        return hits

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self.cached_prefix(seq)
        free = sum(1 for b in self.free_block_ids if b not in hits)
        return self.num_blocks_for(len(seq.token_ids)) - len(hits) <= free

    def _take(self) -> int:
        """The front of the free list; a cached block is evicted as it is reused."""
        block = self.blocks[self.free_block_ids.popleft()]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]  # (the index may name a newer copy)
        block.hash, block.token_ids, block.ref_count = -1, [], 1
        return block.block_id

    def allocate(self, seq: Sequence) -> None:
        if not self.can_allocate(seq):
            raise NoFreeBlocks(seq.seq_id)
        hits = self.cached_prefix(seq)
        for block_id in hits:
            if self.blocks[block_id].ref_count == 0:
                self.free_block_ids.remove(block_id)
            self.blocks[block_id].ref_count += 1
        new = [self._take() for _ in range(self.num_blocks_for(len(seq.token_ids)) - len(hits))]
        seq.block_table = hits + new
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_slots = len(seq.token_ids)
        self.seqs[seq.seq_id] = seq

    def can_append(self, seq: Sequence, num_tokens: int = 1) -> bool:
        need = self.num_blocks_for(seq.num_slots + num_tokens) - len(seq.block_table)
        return need <= len(self.free_block_ids)

    def may_append(self, seq: Sequence) -> None:
        """Reserve the slot of one more token (one decode step)."""
        if seq.num_slots % self.block_size == 0:
            if not self.free_block_ids:
                raise NoFreeBlocks(seq.seq_id)
            seq.block_table.append(self._take())
        seq.num_slots += 1

    def postprocess(self, seq: Sequence, num_computed: int, new_token_ids: list[int]) -> None:
        """KV of ``num_computed`` more slots is written and the sampled tokens are known:
        publish every block that became full."""
        bs, first = self.block_size, seq.num_computed_tokens // self.block_size
        seq.num_computed_tokens += num_computed
        seq.token_ids += new_token_ids
        for j in range(first, seq.num_computed_tokens // bs):
            self.publish(seq, j)

    def publish(self, seq: Sequence, j: int) -> None:
        block = self.blocks[seq.block_table[j]]
        if block.hash != -1:
            return  # a hit: cached already
        prefix = self.blocks[seq.block_table[j - 1]].hash if j else -1
        token_ids = seq.token_ids[j * self.block_size : (j + 1) * self.block_size]
        block.hash = self.compute_hash(token_ids, prefix, seq.namespace)
        block.token_ids = token_ids
        self.hash_to_block_id[block.hash] = block.block_id  # last wins

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):  # the tail is reused first
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
        del self.seqs[seq.seq_id]


# -- seeded bugs -----------------------------------------------------------------------------


class PublishAtAllocate(MinimalEngine):
    """Bug: the prompt's full blocks are hashed and indexed when they are allocated, before
    their KV is written (another prompt can hit them first)."""

    def allocate(self, seq: Sequence) -> None:
        super().allocate(seq)
        for j in range(len(seq.token_ids) // self.block_size):
            self.publish(seq, j)


class StaleIndexOnReuse(MinimalEngine):
    """Bug: a reused block keeps its index entry (a hit is checked on the tokens only), so a
    block rewritten with the same tokens after another prefix is served for the old one."""

    def _take(self) -> int:
        block = self.blocks[self.free_block_ids.popleft()]
        block.hash, block.ref_count = -1, 1
        return block.block_id


class HitsCountedFree(MinimalEngine):
    """Bug: the room check counts the free-list blocks the prompt hits as free, though they
    are taken as hits and cannot also be fresh blocks."""

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self.cached_prefix(seq)
        return self.num_blocks_for(len(seq.token_ids)) - len(hits) <= len(self.free_block_ids)


class DecodeOffByOne(MinimalEngine):
    """Bug: decode takes a new block when the slot count is one past a block boundary, the
    test of an engine that counts the new token first."""

    def may_append(self, seq: Sequence) -> None:
        if seq.num_slots % self.block_size == 1 and self.free_block_ids:
            seq.block_table.append(self._take())
        seq.num_slots += 1


#: name -> the engine with that bug.
BUGS: dict[str, type[MinimalEngine]] = {
    "publish_at_allocate": PublishAtAllocate,
    "stale_index_on_reuse": StaleIndexOnReuse,
    "hits_counted_free": HitsCountedFree,
    "decode_off_by_one": DecodeOffByOne,
}
