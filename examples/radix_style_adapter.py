"""The conformance adapter for :mod:`examples.radix_style`: translation only.

prefixkv's calls become the manager's own (``match``, ``admit``, ``extend``,
``record_forward``, ``cache_finished_req``, ``evict``), bad arguments are refused by the
kit's toolkit before the manager is touched, and the tree is rendered as a snapshot: a page
in the tree is published, its parent is the page before it on its path, and its refcount
is the number of page tables that hold it. The tree verifies tokens exactly, so the index
is keyed by page id (there is no hash to trust).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from prefixkv.spec import Admission, CacheState, Match, OutOfBlocks, SeqView
from prefixkv.spec import Request as PkvRequest

from prefixkv.conformance import Capabilities, DeclaredAdapter, adapter
from prefixkv.conformance import toolkit as tk

from .radix_style import BUGS, RadixKVManager, Req

__all__ = ["CAPABILITIES", "RadixStyleAdapter", "make_manager"]

CAPABILITIES = Capabilities(
    chunked_prefill=False, multimodal=False, recompute_windows=False, lost_reuse=False,
    events=False, exact=False,
)  # fmt: skip


class RadixStyleAdapter(tk.AdapterBase[Req]):  # prefixkv's calls and errors -> the manager's
    def __init__(self, manager: RadixKVManager) -> None:
        super().__init__(manager.pool.num_pages, manager.page_size)
        self.m, self.reqs, self.blk = manager, manager.reqs, tk.BlockMemo()

    def match(self, req: PkvRequest) -> Match:
        pages, _ = self.m.match(tk.check_request(req).token_ids, req.namespace.key())
        return Match(req.num_tokens, len(pages) * self.block_size, tuple(pages))

    def _req(self, req: PkvRequest, budget: int | None) -> Req:
        return Req(tk.check_new(req, self.reqs, budget).seq_id, req.token_ids, req.namespace.key())

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        return self.m.can_admit(self._req(req, num_new_tokens), num_new_tokens)

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        r, evicted = self._req(req, num_new_tokens), self.m.tree.num_evicted_pages
        if not self.m.admit(r, num_new_tokens):
            raise OutOfBlocks(f"{req.seq_id!r} does not fit")
        self.counters.admitted(req.num_tokens, cached := r.num_cached_tokens)
        return Admission(req.seq_id, cached, r.kv_allocated_len - cached, tuple(r.pages),
                         len(r.private), self.m.tree.num_evicted_pages - evicted)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        return self.m.can_extend(tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "n"))

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        return self.m.extend(self.reqs[seq_id], num_tokens) or []

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r = tk.live(self.reqs, seq_id)
        self.m.record_forward(r, *tk.check_commit(num_computed, accepted_tokens,
            committed=r.kv_committed_len, allocated=r.kv_allocated_len,
            known=len(r.fill_ids)))  # fmt: skip

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        with tk.refusal(ValueError, what=repr(seq_id)):  # raised before anything changed
            self.m.release_tail(tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "n"))

    def release(self, seq_id: Any) -> None:
        self.m.cache_finished_req(self.reqs[seq_id])

    def evict(self, num_blocks: int) -> int:
        return self.m.evict(tk.check_count(num_blocks, "num_blocks", 0))

    def clear_cache(self) -> bool:
        return self.m.reset()

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(tk.live(self.reqs, seq_id).pages)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.reqs, seq_id).kv_committed_len

    def snapshot(self) -> CacheState:  # a page is published iff the tree holds it
        ps, tree, c = self.block_size, self.m.tree, self.counters
        c.evictions, c.published = tree.num_evicted_pages, tree.num_inserted_pages
        refs = Counter(p for r in self.reqs.values() for p in r.pages)  # page tables holding it
        blocks = [self.blk(p, refs[p]) for p in range(self.num_blocks)]
        for page, node, i, ns in tree.all_pages():  # its parent: the page before it on its path
            up = node.parent  # (none for the first page under a root)
            parent = node.value[i - 1] if i else up.value[-1] if up and up.value else None
            tokens = tuple(node.key[i * ps : (i + 1) * ps])
            blocks[page] = self.blk(page, refs[page], page, parent, tokens, cast(bytes, ns))
        seqs = [SeqView(r.rid, cast(bytes, r.namespace), tuple(r.fill_ids), tuple(r.pages),
                        r.kv_committed_len, r.kv_allocated_len, len(r.origin_input_ids),
                        r.num_cached_tokens) for r in self.reqs.values()]  # fmt: skip
        return tk.build_snapshot(blocks, seqs, self.m.pool.free_pages, c, block_size=ps,
                                 cached_in_free_queue=False)  # fmt: skip


def factory_for(cls: type[RadixKVManager] = RadixKVManager) -> DeclaredAdapter[RadixStyleAdapter]:
    """An adapter factory for ``cls(num_pages, page_size)``."""

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> RadixStyleAdapter:
        return RadixStyleAdapter(cls(num_blocks, block_size))

    return make


make_manager = factory_for()
#: name -> factory of each bug.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
