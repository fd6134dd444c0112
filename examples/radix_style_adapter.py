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

from .radix_style import BUGS, RadixKVManager, Req

__all__ = ["CAPABILITIES", "RadixStyleAdapter", "make_manager"]

CAPABILITIES = Capabilities(
    chunked_prefill=False, multimodal=False, recompute_windows=False, lost_reuse=False,
    events=False, exact=False,
)  # fmt: skip


class RadixStyleAdapter(tk.AdapterBase):  # prefixkv's calls and errors -> the manager's
    def __init__(self, manager: RadixKVManager) -> None:
        super().__init__(manager.pool.num_pages, manager.page_size)
        self.m, self.reqs = manager, manager.reqs

    def match(self, req: PkvRequest) -> Match:
        pages, _ = self.m.match(tk.check_request(req).token_ids, req.namespace.key())
        return Match(req.num_tokens, len(pages) * self.block_size, tuple(pages))

    def _req(self, req: PkvRequest, budget: int | None) -> Req:
        r = Req(tk.check_request(req).seq_id, req.token_ids, req.namespace.key())
        if budget is not None:
            tk.check_count(budget, "num_new_tokens")
        if req.seq_id in self.reqs:
            raise DuplicateSequence(f"{req.seq_id!r} is live")
        return r

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
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "num_tokens")
        return self.m.can_extend(r, n)

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        if not self.can_append(seq_id, num_tokens):
            raise OutOfBlocks(f"no room for {num_tokens} more tokens of {seq_id!r}")
        return self.m.extend(self.reqs[seq_id], num_tokens) or []

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_computed, "num_computed", 0)
        tokens = tk.check_tokens(accepted_tokens)
        total = r.kv_committed_len + n
        if total > min(r.kv_allocated_len, len(r.fill_ids) + len(tokens)):
            raise InvalidOperation(f"cannot commit {total} tokens of {seq_id!r}")
        self.m.record_forward(r, n, tokens)

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "num_tokens")
        try:
            self.m.release_tail(r, n)
        except ValueError as exc:  # raised before anything changed
            raise InvalidOperation(f"{seq_id!r}: {exc}") from None

    def free(self, seq_ids: Any) -> None:
        for s in tk.check_free_batch(seq_ids, self.reqs):
            self.m.cache_finished_req(self.reqs[s])

    def evict(self, num_blocks: int) -> int:
        return self.m.evict(tk.check_count(num_blocks, "num_blocks", 0))

    def reset(self, *, preserve_cache: bool) -> None:
        if tk.check_flag(preserve_cache):
            self.free(list(self.reqs))
        elif not self.m.reset():
            raise CacheBusy("requests are running")

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(tk.live(self.reqs, seq_id).pages)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.reqs, seq_id).kv_committed_len

    def seq_ids(self) -> tuple[Any, ...]:
        return tuple(self.reqs)

    def snapshot(self) -> CacheState:
        ps, tree, c = self.block_size, self.m.tree, self.counters
        c.evictions, c.published = tree.num_evicted_pages, tree.num_inserted_pages
        refs = Counter(p for r in self.reqs.values() for p in r.pages)
        views = [BlockView(p, refs[p], False) for p in range(self.num_blocks)]
        for page, node, i, ns in tree.all_pages():  # parents first; the page before it is its
            up = node.parent  # parent (none for the first page under a root)
            parent = node.value[i - 1] if i else up.value[-1] if up and up.value else None
            tokens = tuple(node.key[i * ps : (i + 1) * ps])
            depth = views[parent].depth + 1 if parent is not None else 1
            views[page] = BlockView(page, refs[page], True, cast(bytes, ns), parent, tokens, (),
                                    page, depth)  # fmt: skip
        seqs = tuple(
            SeqView(r.rid, cast(bytes, r.namespace), tuple(r.fill_ids), tuple(r.pages),
                    r.kv_committed_len, r.kv_allocated_len, len(r.origin_input_ids),
                    r.num_cached_tokens)
            for r in self.reqs.values()
        )  # fmt: skip
        free, index = tuple(self.m.pool.free_pages), tuple((p, p) for p, *_ in tree.all_pages())
        stats = tk.stats_from(views, len(free), len(seqs), c, block_size=ps)
        return CacheState(self.num_blocks, ps, tuple(views), free, tuple(sorted(index)), seqs,
                          stats, ())  # fmt: skip


def factory_for(cls: type[RadixKVManager] = RadixKVManager) -> Any:
    """An adapter factory for ``cls(num_pages, page_size)``."""

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> RadixStyleAdapter:
        return RadixStyleAdapter(cls(num_blocks, block_size))

    make.capabilities = CAPABILITIES  # type: ignore[attr-defined]
    return make


make_manager = factory_for()
#: name -> factory of each bug.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
