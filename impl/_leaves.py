"""The eviction order over cached leaves: a heap with lazy deletion.

Only leaves may be evicted (choice 3): published, refcount 0, no published children. The
order is least recently released first, then deeper first, then lower block id.

NOTE: a leaf can be created out of order: when a child is evicted, its parent may become a
leaf with an *older* release time than leaves already queued. An intrusive LRU list would
need a sorted insert there, so a binary heap it is. Entries are never removed in place;
each carries the block's *leaf version* at push time (the heap's own per-block column,
bumped whenever the block enters the leaf set), and a popped entry counts only if the block
is still a leaf with that version. The heap is rebuilt when stale entries outnumber live
ones, which keeps it O(live leaves) in size and O(log leaves) per operation.

The heap reads the pool's columns (refcount, depth, parent, last use, published children)
and writes none of them: a victim's parent loses its child through
:meth:`~._pool.BlockPool.drop_child`.
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pool owns a LeafHeap
    from ._pool import BlockPool

__all__ = ["COMPACT_SLACK", "LeafHeap"]

# (last_use, -depth, block id, leaf version)
_Entry = tuple[int, int, int, int]

#: Leaf versions are compared for equality only, and wrap within a 32-bit array.
_WRAP = 0x7FFFFFFF

#: Stale entries tolerated beyond twice the cached blocks before the heap is rebuilt.
COMPACT_SLACK = 64


class LeafHeap:
    """The cached leaves of a :class:`~._pool.BlockPool` in eviction order."""

    __slots__ = ("heap", "slack", "versions")

    def __init__(self, num_blocks: int, slack: int = COMPACT_SLACK) -> None:
        """An empty order.

        Args:
            num_blocks: the pool's blocks (one leaf version each).
            slack: stale entries tolerated beyond twice the cached blocks before a rebuild
                (see :data:`COMPACT_SLACK`; a test knob, see ``PrefixCacheManager``).
        """
        #: The entries, a binary heap; stale ones are dropped when popped or compacted.
        self.heap: list[_Entry] = []
        #: Each block's leaf version: bumped whenever the block enters the leaf set, so an
        #: entry with an older version is stale.
        self.versions: array[int] = array("i", bytes(4 * num_blocks))
        #: NOTE: a knob for tests only: a negative slack (down to ``-num_blocks``) rebuilds
        #: the heap on small pools often, which brings the rebuild within the machines' reach.
        self.slack = slack

    def push(self, pool: BlockPool, b: int) -> None:
        """Record that ``b`` just became a leaf (published, refcount 0, no children).

        Args:
            pool: the pool ``b`` is in.
            b: the block.
        """
        versions = self.versions
        version = (versions[b] + 1) & _WRAP
        versions[b] = version
        heapq.heappush(self.heap, (pool.last_use[b], -pool.depth[b], b, version))

    def pop(self, pool: BlockPool, count: int) -> list[int]:
        """Take up to ``count`` live leaves off the heap, in order (see
        :meth:`~._pool.BlockPool.pop_leaves`); a parent left without children is queued in turn.

        NOTE: a batch of victims is mostly whole chains: a sequence's blocks are released
        together (same last use), and the parent that a victim leaves childless is one
        shallower, so it usually comes next. After each victim taken off the heap, the
        chain above it is climbed without touching the heap: a parent that just became a
        leaf is taken at once while its entry is smaller than the heap's smallest (one
        tuple comparison), and pushed only when it is not (or when the batch is complete).
        A parent taken at once needs no new leaf version: it is evicted here, so any
        older entry of it fails the liveness test (depth 0), and every way back into the
        leaf set (``push`` from a release, the climb's own push) bumps the version.
        The order is exactly the heap's.

        Args:
            pool: the pool the leaves are in.
            count: the most victims to take.

        Returns:
            The victims, in eviction order; each is still published.
        """
        heap, version = self.heap, self.versions
        ref, children, depth = pool.ref, pool.num_children, pool.depth
        parent, last_use, drop_child = pool.parent, pool.last_use, pool.drop_child
        pop, push = heapq.heappop, heapq.heappush
        victims: list[int] = []
        take = victims.append
        while count > 0 and heap:
            _, _, b, v = pop(heap)
            if version[b] != v or ref[b] or children[b] or not depth[b]:
                continue  # stale entry: b stopped being a leaf since it was queued
            take(b)
            count -= 1
            p = parent[b]
            while p >= 0:
                if drop_child(p) or ref[p]:
                    break
                # p just became a leaf: take it now if it goes next, else queue it.
                entry = (last_use[p], -depth[p], p)
                if count and (not heap or entry < heap[0]):
                    take(p)
                    count -= 1
                    p = parent[p]
                    continue
                pv = (version[p] + 1) & _WRAP
                version[p] = pv
                push(heap, (*entry, pv))
                break
        return victims

    def _live(self, pool: BlockPool, entry: _Entry) -> bool:
        b = entry[2]
        return (
            self.versions[b] == entry[3]
            and pool.ref[b] == 0
            and pool.num_children[b] == 0
            and pool.depth[b] != 0
        )

    def maybe_compact(self, pool: BlockPool, num_cached: int) -> None:
        """Drop stale entries once they dominate; amortized O(1) per push.

        Args:
            pool: the pool the leaves are in.
            num_cached: its cached blocks (at most that many entries are live).
        """
        if len(self.heap) > (num_cached << 1) + self.slack:
            self.heap = [e for e in self.heap if self._live(pool, e)]
            heapq.heapify(self.heap)

    def order(self, pool: BlockPool) -> list[int]:
        """Live leaves in eviction order (for inspection; O(n log n)).

        Args:
            pool: the pool the leaves are in.

        Returns:
            The block ids, the next victim first.
        """
        return [e[2] for e in sorted(self.heap) if self._live(pool, e)]

    def clear(self) -> None:
        """Drop every entry (a full reset: no block is published any more). The versions
        stay: they only ever need to differ from a stale entry's."""
        self.heap.clear()
