"""The eviction order over cached leaves: a heap with lazy deletion.

Only leaves may be evicted (choice 3): published, refcount 0, no published children. The
order is least recently released first, then deeper first, then lower block id.

NOTE: a leaf can be created out of order: when a child is evicted, its parent may become a
leaf with an *older* release time than leaves already queued. An intrusive LRU list would
need a sorted insert there, so a binary heap it is. Entries are never removed in place;
each carries the block's ``leaf_version`` at push time, and a popped entry counts only if
the block is still a leaf with that version. The heap is rebuilt when stale entries
outnumber live ones, which keeps it O(live leaves) in size and O(log leaves) per operation.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pool owns a LeafHeap
    from ._pool import BlockPool

__all__ = ["COMPACT_SLACK", "LeafHeap"]

# (last_use, -depth, block id, leaf_version)
_Entry = tuple[int, int, int, int]


#: Stale entries tolerated beyond twice the cached blocks before the heap is rebuilt.
COMPACT_SLACK = 64


class LeafHeap:
    __slots__ = ("heap", "slack")

    def __init__(self, slack: int = COMPACT_SLACK) -> None:
        #: The raw heap; the manager's eviction loop pops it directly (hot path).
        self.heap: list[_Entry] = []
        #: NOTE: a knob for tests only: a negative slack (down to ``-num_blocks``) rebuilds
        #: the heap on small pools often, which brings the rebuild within the machines' reach.
        self.slack = slack

    def push(self, pool: BlockPool, b: int) -> None:
        """Record that ``b`` just became a leaf."""
        version = (pool.leaf_version[b] + 1) & 0x7FFFFFFF  # a 32-bit array; equality only
        pool.leaf_version[b] = version
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
        A parent taken at once needs no new ``leaf_version``: it is evicted here, so any
        older entry of it fails the liveness test (depth 0), and every way back into the
        leaf set (``push`` from a release, the climb's own push) bumps the version.
        The order is exactly the heap's.
        """
        heap = self.heap
        version, ref, children, depth = pool.leaf_version, pool.ref, pool.num_children, pool.depth
        parent, last_use = pool.parent, pool.last_use
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
                left = children[p] - 1
                children[p] = left
                if left or ref[p]:
                    break
                # p just became a leaf: take it now if it goes next, else queue it.
                entry = (last_use[p], -depth[p], p)
                if count and (not heap or entry < heap[0]):
                    take(p)
                    count -= 1
                    p = parent[p]
                    continue
                pv = (version[p] + 1) & 0x7FFFFFFF
                version[p] = pv
                push(heap, (*entry, pv))
                break
        return victims

    @staticmethod
    def _live(pool: BlockPool, entry: _Entry) -> bool:
        b = entry[2]
        return (
            pool.leaf_version[b] == entry[3]
            and pool.ref[b] == 0
            and pool.num_children[b] == 0
            and pool.depth[b] != 0
        )

    def maybe_compact(self, pool: BlockPool, num_cached: int) -> None:
        """Drop stale entries once they dominate; amortized O(1) per push."""
        if len(self.heap) > (num_cached << 1) + self.slack:
            self.heap = [e for e in self.heap if self._live(pool, e)]
            heapq.heapify(self.heap)

    def order(self, pool: BlockPool) -> list[int]:
        """Live leaves in eviction order (for inspection; O(n log n))."""
        return [e[2] for e in sorted(self.heap) if self._live(pool, e)]

    def clear(self) -> None:
        self.heap.clear()
