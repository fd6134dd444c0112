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

from .radix_style import BUGS, RadixKVManager, Req, TreeNode

__all__ = ["CAPABILITIES", "RadixStyleAdapter", "make_manager"]

CAPABILITIES = Capabilities(
    chunked_prefill=False, multimodal=False, recompute_windows=False, lost_reuse=False,
    events=False, exact=False,
)  # fmt: skip


class RadixStyleAdapter:
    def __init__(self, manager: RadixKVManager) -> None:
        self.m, self.block_size, self.num_blocks = (
            manager,
            manager.page_size,
            manager.pool.num_pages,
        )
        self.counters = tk.Counters()

    def match(self, req: PkvRequest) -> Match:
        pages, _ = self.m.match(tk.check_request(req).token_ids, req.namespace.key())
        return Match(req.num_tokens, len(pages) * self.block_size, tuple(pages))

    def _req(self, req: PkvRequest, budget: int | None) -> Req:
        r = Req(tk.check_request(req).seq_id, req.token_ids, req.namespace.key())
        if budget is not None:
            tk.check_count(budget, "num_new_tokens")
        if req.seq_id in self.m.reqs:
            raise DuplicateSequence(f"{req.seq_id!r} is live")
        return r

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        return self.m.can_admit(self._req(req, num_new_tokens), num_new_tokens)

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        r, evicted = self._req(req, num_new_tokens), self.m.tree.num_evicted_pages
        if not self.m.admit(r, num_new_tokens):
            raise OutOfBlocks(f"{req.seq_id!r} does not fit")
        self.counters.admitted(req.num_tokens, r.num_cached_tokens)
        new = len(r.pages) - r.num_cached_tokens // self.block_size
        return Admission(req.seq_id, r.num_cached_tokens, r.kv_allocated_len - r.num_cached_tokens,
                         tuple(r.pages), new, self.m.tree.num_evicted_pages - evicted)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        r = tk.live(self.m.reqs, seq_id)
        return self.m.can_extend(r, tk.check_count(num_tokens, "num_tokens"))

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        r = tk.live(self.m.reqs, seq_id)
        new = self.m.extend(r, tk.check_count(num_tokens, "num_tokens"))
        if new is None:
            raise OutOfBlocks(f"no room for {num_tokens} more tokens of {seq_id!r}")
        return new

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r = tk.live(self.m.reqs, seq_id)
        n, tokens = (
            tk.check_count(num_computed, "num_computed", 0),
            tk.check_tokens(accepted_tokens),
        )
        total = r.kv_committed_len + n
        if total > r.kv_allocated_len or total > len(r.fill_ids) + len(tokens):
            raise InvalidOperation(f"cannot commit {total} tokens of {seq_id!r}")
        self.m.record_forward(r, n, tokens)

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        r = tk.live(self.m.reqs, seq_id)
        if r.kv_allocated_len - tk.check_count(num_tokens, "num_tokens") < r.kv_committed_len:
            raise InvalidOperation(f"cannot roll back written slots of {seq_id!r}")
        self.m.release_tail(r, num_tokens)

    def free(self, seq_ids: Any) -> None:
        for s in tk.check_free_batch(seq_ids, self.m.reqs):
            self.m.cache_finished_req(self.m.reqs[s])

    def evict(self, num_blocks: int) -> int:
        return self.m.evict(tk.check_count(num_blocks, "num_blocks", 0))

    def reset(self, *, preserve_cache: bool) -> None:
        if tk.check_flag(preserve_cache):
            self.free(list(self.m.reqs))
        elif not self.m.reset():
            raise CacheBusy("requests are running")

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(tk.live(self.m.reqs, seq_id).pages)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.m.reqs, seq_id).kv_committed_len

    def seq_ids(self) -> tuple[Any, ...]:
        return tuple(self.m.reqs)

    def take_events(self) -> list[Any]:
        return []

    def stats(self) -> Any:
        return self.snapshot().stats

    def snapshot(self) -> Any:
        ps, tree, c = self.block_size, self.m.tree, self.counters
        c.evictions, c.published = tree.num_evicted_pages, tree.num_inserted_pages
        refs = Counter(p for r in self.m.reqs.values() for p in r.pages)
        views = {p: BlockView(p, refs[p], False) for p in range(self.num_blocks)}
        for ns, root in tree.roots.items():
            stack: list[tuple[TreeNode, int | None, int]] = [
                (child, None, 0) for child in root.children.values()
            ]
            while stack:  # (node, page before it on the path, its depth)
                node, parent, depth = stack.pop()
                for i, page in enumerate(node.value):
                    views[page] = BlockView(page, refs[page], True, cast(bytes, ns), parent,
                                            tuple(node.key[i * ps : (i + 1) * ps]), (), page,
                                            depth + i + 1)  # fmt: skip
                    parent = page
                stack += [(ch, parent, depth + len(node.value)) for ch in node.children.values()]
        blocks = tuple(views[p] for p in range(self.num_blocks))
        seqs = [
            SeqView(r.rid, cast(bytes, r.namespace), tuple(r.fill_ids), tuple(r.pages),
                    r.kv_committed_len, r.kv_allocated_len, len(r.origin_input_ids),
                    r.num_cached_tokens)
            for r in self.m.reqs.values()
        ]  # fmt: skip
        index = [(b.block_id, b.block_id) for b in blocks if b.published]
        stats = tk.stats_from(blocks, len(self.m.pool.free_pages), len(seqs), c, block_size=ps)
        return CacheState(num_blocks=self.num_blocks, block_size=ps, blocks=blocks,
                             free_queue=tuple(self.m.pool.free_pages), index=tuple(index),
                             sequences=tuple(seqs), stats=stats, pending_events=())  # fmt: skip


def factory_for(cls: type[RadixKVManager] = RadixKVManager) -> Any:
    """An adapter factory for ``cls(num_pages, page_size)``."""

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> RadixStyleAdapter:
        return RadixStyleAdapter(cls(num_blocks, block_size))

    make.capabilities = CAPABILITIES  # type: ignore[attr-defined]
    return make


make_manager = factory_for()
#: name -> factory of each bug.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
