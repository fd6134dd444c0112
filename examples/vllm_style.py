"""A block manager written the way vLLM v1 writes its own (``vllm/v1/core``), as an example.

It shares no code with prefixkv and imports nothing from it: the adapter in
``vllm_style_adapter`` is the only translation. The shapes it keeps from vLLM v1:

* **A chained block hash.** Block ``j`` of a request hashes (hash of block ``j - 1``, its
  tokens, and for the first block the cache salt), so a hit on block ``j`` stands for the
  whole prefix up to it. The hash is trusted by default: a hit is served on equal hashes.
  ``verify_hits=True`` also compares the block's stored identity (salt and the full token
  prefix, kept as a chain of shared tuples, so a block costs O(1) memory), which makes a
  weak or colliding hash cost hits but never serve wrong KV.
* **Publish at schedule time.** ``allocate_slots`` hashes and indexes every block that the
  scheduled tokens fill, before its KV is computed. This is safe in vLLM's model because a
  step's whole batch writes its KV, layer by layer, before any of it is read. A writer freed
  (finished, aborted or preempted) before its KV was computed must not leave those blocks
  findable: ``free`` takes their hashes back out of the index.
* **Several blocks per hash.** The index maps a hash to ``{block_id: block}``: blocks are
  never swapped under a request, so two requests that fill the same block independently
  both keep theirs, and either serves a later hit.
* **One doubly linked free queue that also holds cached blocks.** A block whose refcount
  drops to 0 goes to the tail, its hash kept; allocation takes the head and, if that block
  is cached, drops its hash first. A hit on a block in the queue takes it out (O(1)).
  Requests free their blocks tail first, so a request's deeper blocks are evicted before
  its shallower ones; but eviction looks at nothing else, and a cancelled writer's blocks
  leave the index while the blocks that other requests chained to them stay. Such a block
  is unreachable (lookup stops at the first miss) and still in the free queue once
  released, so nothing leaks: the cache is not ancestor-closed.

Bug variants (classic prefix-cache bugs, each a subclass) are listed in :data:`BUGS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "BUGS",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
    "Request",
    "sha256_block_hash",
    "weak_block_hash",
]

#: ``hash_fn(parent_hash, token_ids, extra_keys) -> int``.
BlockHashFn = Callable[[int | None, tuple[int, ...], tuple[Any, ...]], int]


def sha256_block_hash(parent: int | None, tokens: tuple[int, ...], extra: tuple[Any, ...]) -> int:
    """The default: 64 bits of SHA-256 over a canonical encoding of the three parts."""
    data = repr((parent, tokens, extra)).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def weak_block_hash(parent: int | None, tokens: tuple[int, ...], extra: tuple[Any, ...]) -> int:
    """A deliberately weak 3-bit hash: collisions everywhere. Safe only with verification."""
    return sha256_block_hash(parent, tokens, extra) & 0x7


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheBlock:
    """One KV block: its refcount, its hash while cached, and its free-queue links."""

    __slots__ = (
        "block_hash", "block_id", "identity", "next_free", "parent_block_hash", "prev_free",
        "ref_cnt",
    )  # fmt: skip

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Set while the block is in the index (cached), ``None`` otherwise.
        self.block_hash: int | None = None
        # The hash of the block before it in the request that cached it (for KV events).
        self.parent_block_hash: int | None = None
        # ``(parent identity, token ids)``, rooted at ``(salt,)``: what the hash stands for.
        self.identity: tuple[Any, ...] | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """A doubly linked list of the blocks with refcount 0, eviction order first.

    Two sentinels bound the list, so ``remove`` (a hit on a cached block) is O(1) with no
    special case at either end.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self.head.next_free
        if block is None or block is self.tail:
            raise ValueError("no free block")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free
        assert last is not None and block.prev_free is None and block.next_free is None
        last.next_free, block.prev_free = block, last
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self.head.next_free
        while block is not None and block is not self.tail:
            yield block
            block = block.next_free


class Request:
    """What the manager sees of a request: its tokens, salt and computed length.

    ``num_computed_tokens`` counts the tokens whose KV the model has written; the engine
    advances it after each forward pass (``KVCacheManager.record_forward``).
    """

    def __init__(
        self, request_id: Any, prompt_token_ids: Sequence[int], cache_salt: bytes | None = None
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.cache_salt = cache_salt
        self.num_computed_tokens = 0
        # Hashes and identities of the full blocks of ``all_token_ids``, grown lazily.
        self.block_hashes: list[int] = []
        self.block_identities: list[tuple[Any, ...]] = []

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class PrefixCacheStats:
    """Counters in vLLM's shape: requests looked up, tokens queried, tokens hit."""

    def __init__(self) -> None:
        self.requests = 0
        self.queries = 0
        self.hits = 0


class BlockPool:
    """The blocks, the free queue, and the hash index ``hash -> {block_id: block}``."""

    def __init__(self, num_blocks: int, *, verify_hits: bool = False) -> None:
        self.num_blocks = num_blocks
        self.verify_hits = verify_hits
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}
        self.num_evictions = self.num_blocks_cached = 0  # metrics

    def get_cached_block(self, block_hash: int, identity: tuple[Any, ...]) -> KVCacheBlock | None:
        """A block cached under ``block_hash`` (the oldest), or ``None``.

        With ``verify_hits``, only a block whose stored identity equals ``identity``.
        """
        blocks = self.cached_block_hash_to_block.get(block_hash)
        if not blocks:
            return None
        for block in blocks.values():
            if not self.verify_hits or self.matches(block, identity):
                return block
        return None

    def matches(self, block: KVCacheBlock, identity: tuple[Any, ...]) -> bool:
        return block.identity == identity

    def cache_block(
        self,
        block: KVCacheBlock,
        block_hash: int,
        identity: tuple[Any, ...],
        parent_block_hash: int | None,
    ) -> None:
        """Index ``block`` under ``block_hash``: it becomes findable by every request."""
        assert block.block_hash is None, "a cached block is never cached twice"
        block.block_hash, block.identity = block_hash, identity
        block.parent_block_hash = parent_block_hash
        self.num_blocks_cached += 1
        self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def uncache_block(self, block: KVCacheBlock) -> bool:
        """Take ``block`` out of the index (its KV is about to be overwritten or was never
        written). Returns whether it was cached."""
        if block.block_hash is None:
            return False
        blocks = self.cached_block_hash_to_block[block.block_hash]
        del blocks[block.block_id]
        if not blocks:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = block.identity = block.parent_block_hash = None
        return True

    def get_num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free ones and cached ones with refcount 0."""
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head of the free queue, evicting cached ones."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks")
        new = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._maybe_evict_cached_block(block)
            block.ref_cnt += 1
            new.append(block)
        return new

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        # INV-INDEX: a reused block must leave the index before it is written again.
        if self.uncache_block(block):
            self.num_evictions += 1

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a hit on ``blocks``: each one leaves the free queue if it was in it."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Sequence[KVCacheBlock]) -> None:
        """Drop one reference to each block; those that reach 0 join the queue's tail, in
        the given order (so the first ones are evicted first)."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Drop every hash; refused (``False``) while any block is in use."""
        if self.get_num_free_blocks() != self.num_blocks:
            return False
        for block in self.blocks:
            self.uncache_block(block)
        return True


class KVCacheManager:
    """The scheduler's view: prefix lookup, slot allocation, caching, and release."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hash_fn: BlockHashFn = sha256_block_hash,
        verify_hits: bool = False,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.block_pool = BlockPool(num_blocks, verify_hits=verify_hits)
        self.req_to_blocks: dict[Any, list[KVCacheBlock]] = {}
        # Leading blocks of the request that are in the index (hits, then its own).
        self.num_cached_block: dict[Any, int] = {}
        # Leading blocks that were hits, so written by some other request.
        self.num_hit_blocks: dict[Any, int] = {}
        # Slots allocated to the request (its cached prefix included).
        self.num_scheduled_tokens: dict[Any, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    # -- hashing ---------------------------------------------------------------------------

    def hash_request_blocks(self, request: Request) -> None:
        """Extend ``request.block_hashes`` to every full block of its known tokens."""
        bs, tokens = self.block_size, request.all_token_ids
        for j in range(len(request.block_hashes), len(tokens) // bs):
            chunk = tuple(tokens[j * bs : (j + 1) * bs])
            extra: tuple[Any, ...]
            if j == 0:
                parent_hash, extra = None, (request.cache_salt,)
                parent_identity: tuple[Any, ...] = (request.cache_salt,)
            else:
                parent_hash, extra = request.block_hashes[j - 1], ()
                parent_identity = request.block_identities[j - 1]
            request.block_hashes.append(self.hash_fn(parent_hash, chunk, extra))
            request.block_identities.append((parent_identity, chunk))

    # -- lookup ----------------------------------------------------------------------------

    def find_longest_cache_hit(self, request: Request, max_blocks: int) -> list[KVCacheBlock]:
        self.hash_request_blocks(request)
        hits: list[KVCacheBlock] = []
        for j in range(min(max_blocks, len(request.block_hashes))):
            block = self.block_pool.get_cached_block(
                request.block_hashes[j], request.block_identities[j]
            )
            if block is None:
                break  # a chained hash: nothing past the first miss can be a hit
            hits.append(block)
        return hits

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The cached prefix of a new request and its length in tokens.

        At least one prompt token is always left to compute, since the model needs the
        logits of the last one.
        """
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = self.find_longest_cache_hit(request, max_blocks)
        return hits, len(hits) * self.block_size

    def record_lookup(self, request: Request, num_hit_tokens: int) -> None:
        """Count a lookup in the prefix cache stats (once per admitted request)."""
        self.prefix_cache_stats.requests += 1
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_hit_tokens

    # -- allocation ------------------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        """Fresh blocks ``allocate_slots`` would take from the free queue, hits included:
        a hit on a block in the queue takes it out of the queue too."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        scheduled = self.num_scheduled_tokens.get(request.request_id, 0)
        total = scheduled + len(new_computed_blocks) * self.block_size + num_new_tokens
        new = cdiv(total, self.block_size) - len(blocks) - len(new_computed_blocks)
        evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return max(new, 0) + evictable_hits

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> bool:
        need = self.get_num_blocks_to_allocate(request, num_new_tokens, new_computed_blocks)
        return need <= self.block_pool.get_num_free_blocks()

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Slots for ``num_new_tokens`` more tokens (after the hit ``new_computed_blocks``
        of a new request); ``None``, changing nothing, if the blocks cannot be had.

        Then caches every block the scheduled tokens fill (publish at schedule time).
        """
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks):
            return None
        rid = request.request_id
        if rid not in self.req_to_blocks:
            self.req_to_blocks[rid] = []
            self.num_cached_block[rid] = self.num_hit_blocks[rid] = len(new_computed_blocks)
            self.num_scheduled_tokens[rid] = 0
            request.num_computed_tokens = len(new_computed_blocks) * self.block_size
        blocks = self.req_to_blocks[rid]
        # Pin the hits before taking fresh blocks, so allocation cannot evict them.
        self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        total = (
            self.num_scheduled_tokens[rid]
            + len(new_computed_blocks) * self.block_size
            + num_new_tokens
        )
        new = self.block_pool.get_new_blocks(max(cdiv(total, self.block_size) - len(blocks), 0))
        blocks.extend(new)
        self.num_scheduled_tokens[rid] = total
        self.cache_blocks(request, min(total, request.num_tokens))
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's blocks that ``num_tokens`` known tokens fill."""
        rid, bs = request.request_id, self.block_size
        self.hash_request_blocks(request)
        blocks = self.req_to_blocks[rid]
        num_full = num_tokens // bs
        for j in range(self.num_cached_block[rid], num_full):
            parent_hash = request.block_hashes[j - 1] if j else None
            self.block_pool.cache_block(
                blocks[j], request.block_hashes[j], request.block_identities[j], parent_hash
            )
        self.num_cached_block[rid] = max(self.num_cached_block[rid], num_full)

    def record_forward(
        self, request: Request, num_computed: int, sampled_token_ids: Sequence[int] = ()
    ) -> None:
        """After a forward pass: the sampled tokens join the request, ``num_computed`` more
        slots hold KV. Blocks the new tokens fill are cached now (they were scheduled)."""
        request.output_token_ids.extend(sampled_token_ids)
        request.num_computed_tokens += num_computed
        rid = request.request_id
        self.cache_blocks(request, min(self.num_scheduled_tokens[rid], request.num_tokens))

    # -- release ---------------------------------------------------------------------------

    def _uncache_unwritten(self, request: Request, first: int) -> None:
        """Blocks ``first..`` that this request cached before their KV was written leave the
        index: once it is gone, nobody will write them (hits were written by others)."""
        rid = request.request_id
        written = request.num_computed_tokens // self.block_size
        blocks = self.req_to_blocks[rid]
        start = max(first, written, self.num_hit_blocks[rid])
        for j in range(start, min(self.num_cached_block[rid], len(blocks))):
            self.block_pool.uncache_block(blocks[j])
        self.num_cached_block[rid] = min(self.num_cached_block[rid], max(start, first))

    def free(self, request: Request) -> None:
        """Release a finished, aborted or preempted request's blocks, tail first."""
        rid = request.request_id
        self._uncache_unwritten(request, 0)
        blocks = self.req_to_blocks.pop(rid)
        del self.num_cached_block[rid], self.num_hit_blocks[rid], self.num_scheduled_tokens[rid]
        self.block_pool.free_blocks(list(reversed(blocks)))

    def free_tail_slots(self, request: Request, num_tokens: int) -> list[KVCacheBlock]:
        """Give back the last ``num_tokens`` scheduled, unwritten slots (rejected draft
        tokens); blocks no slot is left in are freed. Returns them."""
        rid = request.request_id
        scheduled = self.num_scheduled_tokens[rid] - num_tokens
        if scheduled < request.num_computed_tokens:
            raise ValueError("cannot give back slots whose KV is written")
        # A block cached at schedule time may have been hit already: its readers count on
        # this request writing all of it, so its slots can no longer be given back.
        blocks, bs = self.req_to_blocks[rid], self.block_size
        first = max(scheduled // bs, self.num_hit_blocks[rid])
        if any(b.ref_cnt > 1 for b in blocks[first : self.num_cached_block[rid]]):
            raise ValueError("cannot give back slots of a cached block other requests read")
        # A cached block that is no longer wholly scheduled will not be written by us.
        self._uncache_unwritten(request, scheduled // bs)
        keep = cdiv(scheduled, bs)
        dropped = blocks[keep:]
        del blocks[keep:]
        self.num_scheduled_tokens[rid] = scheduled
        self.block_pool.free_blocks(list(reversed(dropped)))
        return dropped

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # -- queries ---------------------------------------------------------------------------

    def get_block_ids(self, request_id: Any) -> list[int]:
        return [b.block_id for b in self.req_to_blocks[request_id]]

    def usage(self) -> float:
        pool = self.block_pool
        return 1.0 - pool.get_num_free_blocks() / pool.num_blocks


# -- classic bugs ---------------------------------------------------------------------------


class StaleHashAfterReuse(KVCacheManager):
    """A cached block taken from the free queue for reuse keeps its index entry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

        def keep_hash(block: KVCacheBlock) -> None:
            block.block_hash = None  # the block forgets, the index does not

        self.block_pool._maybe_evict_cached_block = keep_hash  # type: ignore[method-assign]


class UnchainedHash(KVCacheManager):
    """Each block hashes (and, with verification, is verified on) its own tokens only."""

    def hash_request_blocks(self, request: Request) -> None:
        bs, tokens = self.block_size, request.all_token_ids
        for j in range(len(request.block_hashes), len(tokens) // bs):
            chunk = tuple(tokens[j * bs : (j + 1) * bs])
            request.block_hashes.append(self.hash_fn(None, chunk, (request.cache_salt,)))
            request.block_identities.append(((request.cache_salt,), chunk))


class EvictableHitsNotCounted(KVCacheManager):
    """The free-block check forgets that a hit on a cached free block takes it from the
    free queue, so an admission can run out of blocks halfway."""

    def get_num_blocks_to_allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        need = super().get_num_blocks_to_allocate(request, num_new_tokens, new_computed_blocks)
        return need - sum(1 for b in new_computed_blocks if b.ref_cnt == 0)


class OneTokenCapacityCheck(KVCacheManager):
    """The capacity check of a running request sizes one new token, whatever the count."""

    def can_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> bool:
        if request.request_id in self.req_to_blocks:
            num_new_tokens = 1
        return super().can_allocate(request, num_new_tokens, new_computed_blocks)


class CancelledWriterStillFindable(KVCacheManager):
    """A request freed before its KV was written leaves its scheduled blocks indexed."""

    def free(self, request: Request) -> None:
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid)
        del self.num_cached_block[rid], self.num_hit_blocks[rid], self.num_scheduled_tokens[rid]
        self.block_pool.free_blocks(list(reversed(blocks)))


class HitNotTouched(KVCacheManager):
    """A hit on a block another request holds is attached without taking a reference."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pool = self.block_pool

        def touch(blocks: Sequence[KVCacheBlock]) -> None:
            for block in blocks:
                if block.ref_cnt == 0:
                    pool.free_block_queue.remove(block)
                    block.ref_cnt += 1

        pool.touch = touch  # type: ignore[method-assign]


#: name -> buggy manager class (each differs from :class:`KVCacheManager` in one place).
BUGS: dict[str, type[KVCacheManager]] = {
    "stale_hash_after_reuse": StaleHashAfterReuse,
    "unchained_hash": UnchainedHash,
    "evictable_hits_not_counted": EvictableHitsNotCounted,
    "one_token_capacity_check": OneTokenCapacityCheck,
    "cancelled_writer_still_findable": CancelledWriterStillFindable,
    "hit_not_touched": HitNotTouched,
}
