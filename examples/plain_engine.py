"""A block manager with its own API, as an engine would have one: the README's adapter
translates it for the conformance kit.

It knows nothing of prefixkv: requests are ids and token lists, errors are its own
(``NoFreeBlocks``, ``KeyError``), blocks carry a chained hash and the hash of their parent
but no parent pointer, and cached blocks wait in the free list until they are reused
(lazy eviction, as vLLM v1's free queue does). Hits are verified on the stored tokens and
the parent hash, so a hash collision costs a hit but never serves wrong KV.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["NoFreeBlocks", "PlainBlock", "PlainEngine"]


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks for an allocation."""


class PlainBlock:
    __slots__ = ("block_hash", "block_id", "namespace", "parent_hash", "ref_cnt", "tokens")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # set while the block is cached (findable)
        self.parent_hash: int | None = None
        self.tokens: tuple[int, ...] = ()
        self.namespace = b""


class PlainRequest:
    def __init__(self, tokens: list[int], namespace: bytes, blocks: list[int], hit: int) -> None:
        self.tokens, self.namespace, self.blocks = tokens, namespace, blocks
        self.num_hit_tokens = self.num_computed = hit
        self.num_prompt_tokens = self.num_slots = len(tokens)


class PlainEngine:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [PlainBlock(i) for i in range(num_blocks)]
        self.free_list: deque[int] = deque(range(num_blocks))  # free and cached blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.requests: dict[object, PlainRequest] = {}
        self.num_evicted = 0

    def lookup(self, tokens: list[int], namespace: bytes) -> list[int]:
        bs = self.block_size
        hits: list[int] = []
        parent: int | None = None
        for j in range((len(tokens) - 1) // bs):  # at least one token is computed
            chunk = tuple(tokens[j * bs : (j + 1) * bs])
            b = self.cached.get(hash((parent, namespace, chunk)))
            if b is None:
                break
            blk = self.blocks[b]
            # The hash is only an index: a hit must equal the stored identity.
            if (blk.tokens, blk.parent_hash, blk.namespace) != (chunk, parent, namespace):
                break
            hits.append(b)
            parent = blk.block_hash
        return hits

    def blocks_needed(self, num_tokens: int, hits: list[int]) -> int:
        return -(-num_tokens // self.block_size) - len(hits)

    def num_free(self, hits: Sequence[int] = ()) -> int:
        return sum(1 for b in self.free_list if b not in hits)

    def _take(self) -> int:
        b = self.free_list.popleft()
        blk = self.blocks[b]
        if blk.block_hash is not None:  # a cached block is evicted as it is reused
            del self.cached[blk.block_hash]
            blk.block_hash = None
            self.num_evicted += 1
        blk.ref_cnt = 1
        return b

    def allocate(self, req_id: object, tokens: list[int], namespace: bytes) -> PlainRequest:
        hits = self.lookup(tokens, namespace)
        if self.blocks_needed(len(tokens), hits) > self.num_free(hits):
            raise NoFreeBlocks(req_id)
        for b in hits:
            if self.blocks[b].ref_cnt == 0:
                self.free_list.remove(b)
            self.blocks[b].ref_cnt += 1
        new = [self._take() for _ in range(self.blocks_needed(len(tokens), hits))]
        req = PlainRequest(list(tokens), namespace, hits + new, len(hits) * self.block_size)
        self.requests[req_id] = req
        return req

    def grow(self, req_id: object, num_slots: int) -> None:
        req = self.requests[req_id]
        need = -(-(req.num_slots + num_slots) // self.block_size) - len(req.blocks)
        if need > len(self.free_list):
            raise NoFreeBlocks(req_id)
        req.blocks += [self._take() for _ in range(need)]
        req.num_slots += num_slots

    def computed(self, req_id: object, num_tokens: int, new_tokens: list[int]) -> None:
        """KV of ``num_tokens`` more slots is written; cache the blocks that became full."""
        req, bs = self.requests[req_id], self.block_size
        first = req.num_computed // bs
        req.tokens += new_tokens
        req.num_computed += num_tokens
        for j in range(first, req.num_computed // bs):
            blk = self.blocks[req.blocks[j]]
            parent = self.blocks[req.blocks[j - 1]].block_hash if j else None
            if j and parent is None:
                break  # the parent is a private duplicate: so is the rest
            chunk = tuple(req.tokens[j * bs : (j + 1) * bs])
            h = hash((parent, req.namespace, chunk))
            if h in self.cached:
                break  # a twin is cached: keep this one private
            blk.block_hash, blk.parent_hash, blk.tokens, blk.namespace = (
                h,
                parent,
                chunk,
                req.namespace,
            )
            self.cached[h] = blk.block_id

    def release(self, req_id: object) -> None:
        for b in reversed(self.requests.pop(req_id).blocks):  # children first
            blk = self.blocks[b]
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                self.free_list.append(b)
