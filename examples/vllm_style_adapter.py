"""The conformance adapter for :mod:`examples.vllm_style`: translation only.

prefixkv's calls become the manager's own (``get_computed_blocks``, ``allocate_slots``,
``record_forward``, ``free``), bad arguments are refused by the kit's toolkit before the
manager is touched, and the manager's blocks are rendered as a snapshot. The capabilities
declare where vLLM's policy differs from prefixkv's: blocks published at schedule time,
any-order eviction, several blocks per hash; no explicit ``evict``.
"""

from __future__ import annotations

from typing import Any

from prefixkv.spec import (
    Admission,
    BlockView,
    CacheBusy,
    CacheState,
    DuplicateSequence,
    InvalidOperation,
    Match,
    OutOfBlocks,
    SeqView,
)
from prefixkv.spec import Request as PkvRequest

from prefixkv.conformance import Capabilities
from prefixkv.conformance import toolkit as tk

from .vllm_style import BUGS, KVCacheBlock, KVCacheManager, Request, weak_block_hash

__all__ = ["CAPABILITIES", "VllmStyleAdapter", "make_manager", "make_verified_weak_hash"]

CAPABILITIES = Capabilities(
    publish="schedule", eviction="any", duplicates="shared", evict=False, chunked_prefill=False,
    multimodal=False, recompute_windows=False, lost_reuse=False, events=False, exact=False,
)  # fmt: skip


class VllmStyleAdapter(tk.AdapterBase):  # prefixkv's calls and errors -> the manager's
    def __init__(self, manager: KVCacheManager) -> None:
        super().__init__(manager.block_pool.num_blocks, manager.block_size)
        self.m, self.reqs = manager, dict[Any, Request]()

    def _plan(self, req: PkvRequest, budget: int | None) -> tuple[Request, list[Any], int]:
        r = Request(tk.check_request(req).seq_id, req.token_ids, req.namespace.key())
        hits, cached = self.m.get_computed_blocks(r)
        if budget is not None and tk.check_count(budget, "num_new_tokens"):
            budget = min(budget, r.num_tokens - cached)
        if req.seq_id in self.reqs:
            raise DuplicateSequence(f"{req.seq_id!r} is live")
        return r, hits, r.num_tokens - cached if budget is None else budget

    def match(self, req: PkvRequest) -> Match:
        r = Request(0, tk.check_request(req).token_ids, req.namespace.key())
        hits, cached = self.m.get_computed_blocks(r)
        return Match(req.num_tokens, cached, tuple(b.block_id for b in hits))

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        r, hits, todo = self._plan(req, num_new_tokens)
        return self.m.can_allocate(r, todo, hits)

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        r, hits, todo = self._plan(req, num_new_tokens)
        evictions = self.m.block_pool.num_evictions
        if (new := self.m.allocate_slots(r, todo, hits)) is None:
            raise OutOfBlocks(f"{todo} tokens of {req.seq_id!r} do not fit")
        self.reqs[req.seq_id] = r
        self.counters.admitted(r.num_tokens, r.num_computed_tokens)
        return Admission(req.seq_id, r.num_computed_tokens, todo, self.block_table(req.seq_id),
                         len(new), self.m.block_pool.num_evictions - evictions)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "num_tokens")
        return self.m.can_allocate(r, n)

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        if not self.can_append(seq_id, num_tokens):
            raise OutOfBlocks(f"no room for {num_tokens} more tokens of {seq_id!r}")
        return [b.block_id for b in self.m.allocate_slots(self.reqs[seq_id], num_tokens) or ()]

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_computed, "num_computed", 0)
        tokens = tk.check_tokens(accepted_tokens)
        total = r.num_computed_tokens + n
        if total > min(self.m.num_scheduled_tokens[seq_id], r.num_tokens + len(tokens)):
            raise InvalidOperation(f"cannot commit {total} tokens of {seq_id!r}")
        self.m.record_forward(r, n, tokens)

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "num_tokens")
        try:
            self.m.free_tail_slots(r, n)
        except ValueError as exc:  # raised before anything changed
            raise InvalidOperation(f"{seq_id!r}: {exc}") from None

    def free(self, seq_ids: Any) -> None:
        for s in tk.check_free_batch(seq_ids, self.reqs):
            self.m.free(self.reqs.pop(s))

    def reset(self, *, preserve_cache: bool) -> None:
        if tk.check_flag(preserve_cache):
            self.free(list(self.reqs))
        elif self.reqs or not self.m.reset_prefix_cache():
            raise CacheBusy("requests are running")

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(self.m.get_block_ids(tk.live(self.reqs, seq_id).request_id))

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.reqs, seq_id).num_computed_tokens

    def seq_ids(self) -> tuple[Any, ...]:
        return tuple(self.reqs)

    def snapshot(self) -> CacheState:
        pool, c, bs = self.m.block_pool, self.counters, self.block_size
        c.evictions, c.published = pool.num_evictions, pool.num_blocks_cached
        index = [(h, b) for h, d in pool.cached_block_hash_to_block.items() for b in d]
        owner: dict[Any, int] = {}  # identity -> the copy a lookup returns (the oldest)
        for _, b in index:
            owner.setdefault(pool.blocks[b].identity, b)
        seqs = tuple(
            SeqView(i, r.cache_salt or b"", tuple(r.all_token_ids), self.block_table(i),
                    r.num_computed_tokens, self.m.num_scheduled_tokens[i], r.num_prompt_tokens,
                    self.m.num_hit_blocks[i] * bs)
            for i, r in self.reqs.items()
        )  # fmt: skip
        views = tuple(_view(b, owner) for b in pool.blocks)
        free = tuple(b.block_id for b in pool.free_block_queue if b.block_hash is None)
        stats = tk.stats_from(views, len(free), len(seqs), c, block_size=bs)
        return CacheState(self.num_blocks, bs, views, free, tuple(sorted(index)), seqs, stats, ())


def _view(b: KVCacheBlock, owner: dict[Any, int]) -> BlockView:
    """A cached block's stored identity is ``(parent identity, tokens)`` down to
    ``(salt,)``; its parent is the block a lookup of the parent identity returns (``-1``
    if none is cached: a match through it fails INV-MATCH)."""
    if b.block_hash is None or b.identity is None:
        return BlockView(b.block_id, b.ref_cnt, False)
    (up, tokens), root, depth = b.identity, b.identity[0], 1
    while len(root) == 2:
        root, depth = root[0], depth + 1
    parent = None if len(up) == 1 else owner.get(up, -1)
    return BlockView(b.block_id, b.ref_cnt, True, root[0] or b"", parent, tokens, (),
                     b.block_hash, depth)  # fmt: skip


def factory_for(cls: type[KVCacheManager] = KVCacheManager, **options: Any) -> Any:
    """An adapter factory for ``cls(num_blocks, block_size, **options)``."""

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> VllmStyleAdapter:
        return VllmStyleAdapter(cls(num_blocks, block_size, **options))

    make.capabilities = CAPABILITIES  # type: ignore[attr-defined]
    return make


make_manager = factory_for()
#: A 3-bit hash is safe only because every hit is verified against the stored identity.
make_verified_weak_hash = factory_for(hash_fn=weak_block_hash, verify_hits=True)
#: name -> factory of each bug, plus the weak hash trusted without verification.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
BUG_FACTORIES["weak_hash_trusted"] = factory_for(hash_fn=weak_block_hash)
