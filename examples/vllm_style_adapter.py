"""The conformance adapter for :mod:`examples.vllm_style`: translation only.

prefixkv's calls become the manager's own (``get_computed_blocks``, ``allocate_slots``,
``record_forward``, ``free``), bad arguments are refused by the kit's toolkit before the
manager is touched, and the manager's blocks are rendered as a snapshot. The capabilities
declare where vLLM's policy differs from prefixkv's: blocks published at schedule time,
any-order eviction, several blocks per hash; no explicit ``evict``.
"""

from __future__ import annotations

from typing import Any

from prefixkv.spec import Admission, CacheState, Match, OutOfBlocks, SeqView
from prefixkv.spec import Request as PkvRequest

from prefixkv.conformance import Capabilities, DeclaredAdapter, adapter
from prefixkv.conformance import toolkit as tk

from .vllm_style import BUGS, KVCacheBlock, KVCacheManager, Request, weak_block_hash

__all__ = ["CAPABILITIES", "VllmStyleAdapter", "make_manager", "make_verified_weak_hash"]

CAPABILITIES = Capabilities(
    publish="schedule", eviction="any", duplicates="shared", evict=False, chunked_prefill=False,
    multimodal=False, recompute_windows=False, lost_reuse=False, events=False, exact=False,
)  # fmt: skip


class VllmStyleAdapter(tk.AdapterBase[Request]):  # prefixkv's calls and errors -> the manager's
    def __init__(self, manager: KVCacheManager) -> None:
        super().__init__(manager.block_pool.num_blocks, manager.block_size)
        self.m = manager

    def _plan(self, req: PkvRequest, budget: int | None) -> tuple[Request, int, list[Any]]:
        r = Request(tk.check_new(req, self.reqs, budget).seq_id, req.token_ids, req.namespace.key())
        hits, cached = self.m.get_computed_blocks(r)
        return r, min(budget or r.num_tokens, r.num_tokens - cached), hits

    def match(self, req: PkvRequest) -> Match:
        r = Request(0, tk.check_request(req).token_ids, req.namespace.key())
        hits, cached = self.m.get_computed_blocks(r)
        return Match(req.num_tokens, cached, tuple(b.block_id for b in hits))

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        return self.m.can_allocate(*self._plan(req, num_new_tokens))

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        r, todo, hits = self._plan(req, num_new_tokens)
        evictions = self.m.block_pool.num_evictions
        if (new := self.m.allocate_slots(r, todo, hits)) is None:
            raise OutOfBlocks(f"{todo} tokens of {req.seq_id!r} do not fit")
        self.reqs[req.seq_id] = r
        self.counters.admitted(r.num_tokens, r.num_computed_tokens)
        return Admission(req.seq_id, r.num_computed_tokens, todo, self.block_table(req.seq_id),
                         len(new), self.m.block_pool.num_evictions - evictions)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        return self.m.can_allocate(tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "n"))

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        return [b.block_id for b in self.m.allocate_slots(self.reqs[seq_id], num_tokens) or ()]

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r = tk.live(self.reqs, seq_id)
        self.m.record_forward(r, *tk.check_commit(num_computed, accepted_tokens,
            committed=r.num_computed_tokens, allocated=self.m.num_scheduled_tokens[seq_id],
            known=r.num_tokens))  # fmt: skip

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        with tk.refusal(ValueError, what=repr(seq_id)):  # raised before anything changed
            self.m.free_tail_slots(tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "n"))

    def release(self, seq_id: Any) -> None:
        self.m.free(self.reqs.pop(seq_id))

    def clear_cache(self) -> bool:
        return self.m.reset_prefix_cache()

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(self.m.get_block_ids(tk.live(self.reqs, seq_id).request_id))

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.reqs, seq_id).num_computed_tokens

    def snapshot(self) -> CacheState:  # the index in lookup order: the oldest copy first
        m, pool, c, bs = self.m, self.m.block_pool, self.counters, self.block_size
        c.evictions, c.published = pool.num_evictions, pool.num_blocks_cached
        index = [(h, b) for h, d in pool.cached_block_hash_to_block.items() for b in d]
        seqs = [SeqView(i, r.cache_salt or b"", tuple(r.all_token_ids), self.block_table(i),
                        r.num_computed_tokens, m.num_scheduled_tokens[i], r.num_prompt_tokens,
                        m.num_hit_blocks[i] * bs) for i, r in self.reqs.items()]  # fmt: skip
        free, blocks = [b.block_id for b in pool.free_block_queue], map(_block, pool.blocks)
        return tk.build_snapshot(list(blocks), seqs, free, c, block_size=bs, index=index)


def _block(b: KVCacheBlock) -> tk.Block:  # identity: (parent identity, tokens) ... (salt,)
    up, tokens = b.identity if b.block_hash is not None and b.identity else ((None,), ())
    root, depth = up, 1
    while len(root) == 2:
        root, depth = root[0], depth + 1
    return tk.Block(b.block_id, b.ref_cnt, b.block_hash, None, tokens, root[0] or b"",
                    identity=b.identity, parent_identity=up if len(up) == 2 else None,
                    depth=depth)  # fmt: skip


def factory_for(
    cls: type[KVCacheManager] = KVCacheManager, **options: Any
) -> DeclaredAdapter[VllmStyleAdapter]:
    """An adapter factory for ``cls(num_blocks, block_size, **options)``."""

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> VllmStyleAdapter:
        return VllmStyleAdapter(cls(num_blocks, block_size, **options))

    return make


make_manager = factory_for()
#: A 3-bit hash is safe only because every hit is verified against the stored identity.
make_verified_weak_hash = factory_for(hash_fn=weak_block_hash, verify_hits=True)
#: name -> factory of each bug, plus the weak hash trusted without verification.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
BUG_FACTORIES["weak_hash_trusted"] = factory_for(hash_fn=weak_block_hash)
