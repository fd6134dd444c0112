"""A block manager written the way SGLang writes its RadixCache, as an example.

It shares no code with prefixkv and imports nothing from it: the adapter in
``radix_style_adapter`` is the only translation. The shapes it keeps from SGLang's
``mem_cache/radix_cache.py``:

* **A token-level radix tree with pages.** Each edge holds a run of token ids and, for each
  page of ``page_size`` tokens, the KV page that holds them. A child is keyed by its first
  page of tokens; ``match_prefix`` walks down comparing tokens (exact: no hash is trusted)
  and splits an edge where a match ends inside it. One tree per namespace (model, adapter,
  tenant): requests of different namespaces never share a node.
* **Lock refs instead of block refcounts.** A request locks the deepest node of its cached
  prefix; ``inc_lock_ref`` walks to the root, so a locked node's whole path is protected.
  A page is evictable iff its node's lock ref is 0, which also means that no request in the
  subtree below holds anything.
* **Insert after compute.** A request's full pages whose KV is written are inserted when a
  forward pass completes (``cache_unfinished_req``) and when it finishes
  (``cache_finished_req``). If the tree already holds a page for the same tokens (another
  request inserted them first), the request's own page is a duplicate: it stays private to
  the request and is freed when the request finishes, and the tree's page is kept.
  (SGLang swaps the request's page for the tree's; this manager does not swap pages under a
  running request.)
* **Release on finish and LRU eviction of leaves.** ``evict`` pops the least recently used
  unlocked leaf and frees its pages from the tail, so only leaves of the tree ever go.

Bug variants (classic radix-cache bugs, each a subclass) are listed in :data:`BUGS`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = ["BUGS", "PagePool", "RadixCache", "RadixKVManager", "Req", "TreeNode"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TreeNode:
    """An edge of the radix tree: ``key`` (token ids, whole pages) and ``value`` (one page
    id per page of ``key``)."""

    _ids = itertools.count()

    def __init__(self, parent: TreeNode | None = None) -> None:
        self.id = next(TreeNode._ids)
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.key: list[int] = []
        self.value: list[int] = []
        self.lock_ref = 0
        self.last_access_time = 0

    def __lt__(self, other: TreeNode) -> bool:
        return (self.last_access_time, self.id) < (other.last_access_time, other.id)

    def __repr__(self) -> str:
        return f"TreeNode({self.id}, pages={self.value}, lock_ref={self.lock_ref})"


class PagePool:
    """The KV pages that no tree node and no request holds."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.free_pages = list(range(num_pages))

    def available_size(self) -> int:
        return len(self.free_pages)

    def alloc(self, num_pages: int) -> list[int] | None:
        if num_pages > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        return out

    def free(self, pages: Sequence[int]) -> None:
        self.free_pages.extend(pages)


class RadixCache:
    """The tree: ``match_prefix``, ``insert``, ``evict`` and the lock refs."""

    def __init__(self, pool: PagePool, page_size: int) -> None:
        self.pool = pool
        self.page_size = page_size
        self.roots: dict[Hashable, TreeNode] = {}
        self.clock = 0
        self.evictable_size = 0  # pages in nodes with lock_ref 0
        self.protected_size = 0  # pages in nodes with lock_ref > 0
        self.num_inserted_pages = self.num_evicted_pages = 0  # metrics

    def root(self, namespace: Hashable) -> TreeNode:
        node = self.roots.get(namespace)
        if node is None:
            node = self.roots[namespace] = TreeNode()
            node.lock_ref = 1  # a root is never evicted
        return node

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _page_aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _common(self, key: Sequence[int], tokens: Sequence[int]) -> int:
        """Length of the common prefix of ``key`` and ``tokens``, floored to a page."""
        n = 0
        for a, b in zip(key, tokens, strict=False):
            if a != b:
                break
            n += 1
        return self._page_aligned(n)

    def match_prefix(self, key: Sequence[int], namespace: Hashable) -> tuple[list[int], TreeNode]:
        """The pages of the longest cached page-aligned prefix of ``key``, and the node where
        it ends (an edge the match ends inside is split there)."""
        ps, now = self.page_size, self._tick()
        key = list(key[: self._page_aligned(len(key))])
        node = self.root(namespace)
        node.last_access_time = now
        pages: list[int] = []
        while key:
            child = node.children.get(tuple(key[:ps]))
            if child is None:
                break
            n = self._common(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            pages += child.value
            node, key = child, key[n:]
        return pages, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        ps, parent = self.page_size, child.parent
        assert parent is not None and 0 < n < len(child.key) and n % ps == 0
        upper = TreeNode(parent)
        upper.key, upper.value = child.key[:n], child.value[: n // ps]
        upper.lock_ref = child.lock_ref  # the same requests hold the upper part
        upper.last_access_time = child.last_access_time
        parent.children[tuple(upper.key[:ps])] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n // ps :], upper
        upper.children[tuple(child.key[:ps])] = child
        return upper

    def insert(self, key: Sequence[int], value: Sequence[int], namespace: Hashable) -> list[int]:
        """Make ``key`` (whole pages, written) cached with ``value`` where the tree has no
        page yet. Returns the tree's pages for all of ``key``: where one differs from
        ``value``, the tree already had a page for those tokens."""
        ps, now = self.page_size, self._tick()
        assert len(key) == len(value) * ps
        key, value = list(key), list(value)
        node = self.root(namespace)
        node.last_access_time = now
        pages: list[int] = []
        while key:
            child = node.children.get(tuple(key[:ps]))
            if child is None:
                new = TreeNode(node)
                new.key, new.value, new.last_access_time = key, value, now
                node.children[tuple(key[:ps])] = new
                self.evictable_size += len(value)
                self.num_inserted_pages += len(value)
                pages += value
                break
            n = self._common(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            pages += child.value
            node, key, value = child, key[n:], value[n // ps :]
        return pages

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.value)
                self.protected_size += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 1:
                self.evictable_size += len(node.value)
                self.protected_size -= len(node.value)
            node.lock_ref -= 1
            node = node.parent

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], list(self.roots.values())
        while stack:
            node = stack.pop()
            if not node.children and node.parent is not None:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def _evictable(self, node: TreeNode) -> bool:
        return node.lock_ref == 0

    def evict(self, num_pages: int) -> int:
        """Free up to ``num_pages`` pages from unlocked leaves, least recently used first,
        each leaf from its tail. Returns the pages freed."""
        heap = [leaf for leaf in self._leaves() if self._evictable(leaf)]
        heapq.heapify(heap)
        done = 0
        while done < num_pages and heap:
            leaf = heapq.heappop(heap)
            take = min(num_pages - done, len(leaf.value))
            cut = len(leaf.value) - take
            self.pool.free(leaf.value[cut:])
            if leaf.lock_ref == 0:
                self.evictable_size -= take
            leaf.value, leaf.key = leaf.value[:cut], leaf.key[: cut * self.page_size]
            done += take
            self.num_evicted_pages += take
            if leaf.value:
                continue  # the leaf's head stays, still a leaf
            parent = leaf.parent
            assert parent is not None
            for k, child in list(parent.children.items()):
                if child is leaf:
                    del parent.children[k]
            if not parent.children and parent.parent is not None and self._evictable(parent):
                heapq.heappush(heap, parent)
        return done

    def all_pages(self) -> list[tuple[int, TreeNode, int, Hashable]]:
        """``(page, node, index in node, namespace)`` for every page in the tree, each node
        before its children."""
        out: list[tuple[int, TreeNode, int, Hashable]] = []
        for ns, root in self.roots.items():
            stack = [root]
            while stack:
                node = stack.pop()
                out += [(page, node, i, ns) for i, page in enumerate(node.value)]
                stack.extend(node.children.values())
        return out


class Req:
    """A request as the scheduler tracks it (SGLang's ``Req``, cache fields only)."""

    def __init__(self, rid: Any, origin_input_ids: Sequence[int], namespace: Hashable) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.namespace = namespace
        self.pages: list[int] = []  # the request's page table, one page per page_size slots
        self.private: set[int] = set()  # pages of the table that the tree does not hold
        self.last_node: TreeNode | None = None  # the locked node
        self.num_cached_tokens = 0
        self.kv_allocated_len = 0  # slots allocated
        self.kv_committed_len = 0  # slots whose KV is written

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids


class RadixKVManager:
    """The scheduler's cache plumbing around the tree: admit a request (match, lock,
    evict, allocate), grow it, cache what it computed, and release it on finish."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("num_pages and page_size must be positive")
        self.page_size = page_size
        self.pool = PagePool(num_pages)
        self.tree = RadixCache(self.pool, page_size)
        self.reqs: dict[Any, Req] = {}
        self.num_queries = self.num_hits = self.num_admitted = 0

    # -- admission ---------------------------------------------------------------------------

    def match(self, tokens: Sequence[int], namespace: Hashable) -> tuple[list[int], TreeNode]:
        """The cached prefix of a new prompt: at least one token is left to compute."""
        return self.tree.match_prefix(tokens[: len(tokens) - 1], namespace)

    def available_pages(self, locked: TreeNode | None = None) -> int:
        """Pages an allocation can get now: free ones plus unlocked cached ones, where
        ``locked`` (the node a new request is about to lock) counts as locked already."""
        protect = 0
        node = locked
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                protect += len(node.value)
            node = node.parent
        return self.pool.available_size() + self.tree.evictable_size - protect

    def _alloc(self, num_pages: int) -> list[int]:
        short = num_pages - self.pool.available_size()
        if short > 0:
            self.tree.evict(short)
        pages = self.pool.alloc(num_pages)
        assert pages is not None, "callers check available_pages first"
        return pages

    def _plan(self, req: Req, budget: int | None) -> tuple[list[int], TreeNode, int, int]:
        prefix, node = self.match(req.origin_input_ids, req.namespace)
        cached = len(prefix) * self.page_size
        total = len(req.origin_input_ids)
        end = total if budget is None else min(total, cached + budget)
        return prefix, node, end, cdiv(end, self.page_size) - len(prefix)

    def can_admit(self, req: Req, budget: int | None = None) -> bool:
        _, node, _, need = self._plan(req, budget)
        return need <= self.available_pages(node)

    def admit(self, req: Req, budget: int | None = None) -> bool:
        """Schedule ``req``'s prompt (at most ``budget`` uncached tokens); ``False``, with
        nothing changed, if the pages cannot be had."""
        prefix, node, end, need = self._plan(req, budget)
        if need > self.available_pages(node):
            return False
        self.tree.inc_lock_ref(node)  # before evicting: the hit must survive it
        req.pages = prefix + self._alloc(need)
        req.private = set(req.pages[len(prefix) :])
        req.last_node = node
        req.num_cached_tokens = req.kv_committed_len = len(prefix) * self.page_size
        req.kv_allocated_len = end
        self.reqs[req.rid] = req
        self.num_queries += len(req.origin_input_ids)
        self.num_hits += req.num_cached_tokens
        self.num_admitted += 1
        return True

    # -- growth --------------------------------------------------------------------------------

    def pages_needed(self, req: Req, num_tokens: int) -> int:
        return cdiv(req.kv_allocated_len + num_tokens, self.page_size) - len(req.pages)

    def can_extend(self, req: Req, num_tokens: int) -> bool:
        return self.pages_needed(req, num_tokens) <= self.available_pages()

    def extend(self, req: Req, num_tokens: int) -> list[int] | None:
        """Slots for ``num_tokens`` more tokens (a prefill chunk or decode tokens)."""
        if not self.can_extend(req, num_tokens):
            return None
        new = self._alloc(max(self.pages_needed(req, num_tokens), 0))
        req.pages += new
        req.private.update(new)
        req.kv_allocated_len += num_tokens
        return new

    def release_tail(self, req: Req, num_tokens: int) -> list[int]:
        """Give back the last ``num_tokens`` allocated, unwritten slots."""
        if req.kv_allocated_len - num_tokens < req.kv_committed_len:
            raise ValueError("cannot give back slots whose KV is written")
        req.kv_allocated_len -= num_tokens
        keep = cdiv(req.kv_allocated_len, self.page_size)
        dropped, req.pages = req.pages[keep:], req.pages[:keep]
        # Unwritten pages were never inserted: they are the request's own.
        assert req.private.issuperset(dropped)
        req.private.difference_update(dropped)
        self.pool.free(dropped)
        return dropped

    # -- caching -------------------------------------------------------------------------------

    def cache_unfinished_req(self, req: Req) -> None:
        """Insert the request's written full pages and move its lock down to them."""
        ps = self.page_size
        n = self._cacheable_len(req) // ps
        if n == 0:
            return
        tree_pages = self.tree.insert(req.fill_ids[: n * ps], req.pages[:n], req.namespace)
        shared = 0
        for i in range(n):
            if tree_pages[i] == req.pages[i]:
                req.private.discard(req.pages[i])
                shared = i + 1
        # Lock the deepest tree node whose page the request holds: every page it holds in
        # the tree lies on that node's path.
        node = self.tree.match_prefix(req.fill_ids[: shared * ps], req.namespace)[1]
        self.tree.inc_lock_ref(node)
        assert req.last_node is not None
        self.tree.dec_lock_ref(req.last_node)
        req.last_node = node

    def _cacheable_len(self, req: Req) -> int:
        """Tokens whose KV is written and whose ids are known."""
        return min(req.kv_committed_len, len(req.fill_ids))

    def record_forward(self, req: Req, num_computed: int, output_ids: Sequence[int] = ()) -> None:
        """After a forward pass: new tokens sampled, ``num_computed`` more slots written."""
        req.output_ids += output_ids
        req.kv_committed_len += num_computed
        self.cache_unfinished_req(req)

    def cache_finished_req(self, req: Req) -> None:
        """Release a finished (or aborted) request: its private pages go back to the pool,
        its lock is dropped; what it cached stays in the tree."""
        self.cache_unfinished_req(req)
        self.pool.free([p for p in req.pages if p in req.private])
        assert req.last_node is not None
        self.tree.dec_lock_ref(req.last_node)
        req.last_node = None
        del self.reqs[req.rid]

    def evict(self, num_pages: int) -> int:
        return self.tree.evict(num_pages)

    def reset(self) -> bool:
        """Drop the whole tree; refused while a request is running."""
        if self.reqs:
            return False
        self.pool.free([page for page, *_ in self.tree.all_pages()])
        self.tree.roots.clear()
        self.tree.evictable_size = self.tree.protected_size = 0
        return True


# -- classic bugs ---------------------------------------------------------------------------


class EvictLockedLeaf(RadixKVManager):
    """Eviction takes the least recently used leaf, locked or not."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        self.tree._evictable = lambda node: node.parent is not None  # type: ignore[method-assign]


class MatchedPrefixCountedEvictable(RadixKVManager):
    """The admission budget counts the matched prefix as evictable, though the request
    locks it before evicting anything."""

    def available_pages(self, locked: TreeNode | None = None) -> int:
        return self.pool.available_size() + self.tree.evictable_size


class WholePromptMatched(RadixKVManager):
    """A prompt that is cached whole is matched whole: no token is left to compute."""

    def match(self, tokens: Sequence[int], namespace: Hashable) -> tuple[list[int], TreeNode]:
        return self.tree.match_prefix(tokens, namespace)


class InsertUnwrittenPages(RadixKVManager):
    """``cache_unfinished_req`` inserts every allocated page with known tokens, written or
    not (it reads the allocated length where it needs the committed one)."""

    def _cacheable_len(self, req: Req) -> int:
        return min(req.kv_allocated_len, len(req.fill_ids))


class SplitDropsLock(RadixKVManager):
    """Splitting an edge leaves the new upper node unlocked, so a locked request's prefix
    becomes evictable."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        tree, split = self.tree, self.tree._split

        def split_dropping_lock(child: TreeNode, n: int) -> TreeNode:
            upper = split(child, n)
            if upper.lock_ref:
                tree.evictable_size += len(upper.value)
                tree.protected_size -= len(upper.value)
            upper.lock_ref = 0
            return upper

        tree._split = split_dropping_lock  # type: ignore[method-assign]


class ExtendChecksOnePage(RadixKVManager):
    """The decode capacity check sizes one token, whatever the count."""

    def can_extend(self, req: Req, num_tokens: int) -> bool:
        return super().can_extend(req, 1)


class FinishKeepsLock(RadixKVManager):
    """``cache_finished_req`` caches what the request computed and frees its private pages,
    but never drops its lock: its path stays protected, held by no request, forever."""

    def cache_finished_req(self, req: Req) -> None:
        self.cache_unfinished_req(req)
        self.pool.free([p for p in req.pages if p in req.private])
        req.last_node = None
        del self.reqs[req.rid]


#: name -> buggy manager class (each differs from :class:`RadixKVManager` in one place).
BUGS: dict[str, type[RadixKVManager]] = {
    "evict_locked_leaf": EvictLockedLeaf,
    "matched_prefix_counted_evictable": MatchedPrefixCountedEvictable,
    "whole_prompt_matched": WholePromptMatched,
    "insert_unwritten_pages": InsertUnwrittenPages,
    "split_drops_lock": SplitDropsLock,
    "extend_checks_one_page": ExtendChecksOnePage,
    "finish_keeps_lock": FinishKeepsLock,
}
