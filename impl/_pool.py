"""The block pool: per-block metadata, refcounts, the free queue and the eviction order.

The pool owns everything that is about blocks as such: who holds them (refcounts), which
are free, cached (published, refcount 0) or in use (INV-PARTITION), which cached blocks are
leaves and in what order they go (choice 3), and the *anchoring* that makes ``can_admit``
exact (see :mod:`prefixkv.impl.cache`). It knows nothing about requests, hashes or the
index: the manager tells it which block to publish under which identity and which leaves
it evicted from the index.

NOTE: metadata lives in parallel Python lists indexed by block id rather than in one object
per block, and the hot loops bind the lists they need to locals. The lists grow only as far
as blocks are first handed out: a million-block pool that a workload touches a thousand
blocks of costs a thousand entries. That matters beyond memory: the cyclic garbage collector
traverses every list element, and pre-sized lists made its first passes cost a few
milliseconds per million blocks, billed to whichever operation triggered them.

The free queue is FIFO (allocate from the front, release to the back), exactly as the spec's
plain list. It is stored as a lazily materialized range of never-used ids followed by a deque
of released ids, so construction and full reset cost nothing per block:

::

    free queue:  [ fresh_next ... num_blocks-1 ][ released[0] ... released[-1] ]
                   never used since (re)start      freed or evicted, oldest first
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Sequence

from ._leaves import LeafHeap

__all__ = ["NO_PARENT", "BlockPool"]

#: Parent id of a root block.
NO_PARENT = -1


class BlockPool:
    __slots__ = (
        "anchored_children",
        "block_hash",
        "depth",
        "extra",
        "fresh_next",
        "gen",
        "last_use",
        "leaf_version",
        "leaves",
        "namespace",
        "num_blocks",
        "num_cached",
        "num_children",
        "num_published",
        "num_reclaimable",
        "num_used",
        "parent",
        "ref",
        "released",
        "serial",
        "tokens",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref: list[int] = []
        #: Stored identity of a published block; ``tokens[b] is None`` iff b is unpublished.
        self.tokens: list[tuple[int, ...] | None] = []
        self.namespace: list[bytes | None] = []
        #: Extra keys (multimodal) of a published block's identity; () for text.
        self.extra: list[tuple[tuple[int, bytes], ...]] = []
        self.parent: list[int] = []
        self.block_hash: list[int] = []
        self.depth: list[int] = []
        self.last_use: list[int] = []
        #: Published children of a published block (a leaf has none).
        self.num_children: list[int] = []
        #: Published children that are *anchored*: held by a sequence, or with an anchored
        #: child. See ``PrefixCacheManager`` for why this makes ``can_admit`` exact.
        self.anchored_children: list[int] = []
        #: Bumped whenever b enters the leaf set; stale heap entries carry an older version.
        self.leaf_version: list[int] = []
        #: Bumped whenever b is evicted, so a remembered (block, gen) pair detects reuse.
        self.gen: list[int] = []
        #: The exact name of a published block's identity (see the manager's eviction record).
        #: NOTE: a machine-int array: serials grow past the small-int cache, and a list
        #: would hold one 28-byte int object per block.
        self.serial: array[int] = array("q")
        self.fresh_next = 0
        self.released: deque[int] = deque()
        #: The cached leaves in eviction order.
        self.leaves = LeafHeap()
        # Occupancy (INV-PARTITION: free + cached + used == num_blocks).
        self.num_used = 0  # refcount > 0
        self.num_cached = 0  # published, refcount 0
        self.num_published = 0
        self.num_reclaimable = 0  # published and unanchored

    def _grow(self, upto: int) -> None:
        """Materialize metadata for block ids below ``upto`` (amortized O(1) per block)."""
        size = len(self.ref)
        target = min(self.num_blocks, max(upto, 2 * size, 1024))
        extra = target - size
        for zeros in (
            self.ref,
            self.block_hash,
            self.depth,
            self.last_use,
            self.num_children,
            self.anchored_children,
            self.leaf_version,
            self.gen,
        ):
            zeros.extend([0] * extra)
        self.serial.frombytes(bytes(8 * extra))  # zeros, without a temporary list
        self.parent.extend([NO_PARENT] * extra)
        self.tokens.extend([None] * extra)
        self.namespace.extend([None] * extra)
        self.extra.extend([()] * extra)

    def is_published(self, b: int) -> bool:
        return self.tokens[b] is not None

    # -- free queue ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh_next + len(self.released)

    @property
    def supply(self) -> int:
        """Blocks an allocation can get: free ones, and every unanchored published one."""
        return self.num_blocks - self.fresh_next + len(self.released) + self.num_reclaimable

    def _take(self, count: int) -> list[int]:
        """Pop ``count`` ids from the front of the free queue. The caller checked supply."""
        fresh = min(count, self.num_blocks - self.fresh_next)
        start = self.fresh_next
        if start + fresh > len(self.ref):
            self._grow(start + fresh)
        taken = list(range(start, start + fresh))
        self.fresh_next = start + fresh
        popleft = self.released.popleft
        for _ in range(count - fresh):
            taken.append(popleft())
        return taken

    def allocate(self, count: int) -> list[int]:
        """Hand out ``count`` free blocks, each held once. The caller made them free."""
        if count == 1 and self.fresh_next == self.num_blocks:
            new = [self.released.popleft()]  # the fresh range is used up: FIFO is the deque
        else:
            new = self._take(count)
        ref = self.ref
        for b in new:
            ref[b] = 1
        self.num_used += count
        return new

    def free_queue(self) -> tuple[int, ...]:
        return (*range(self.fresh_next, self.num_blocks), *self.released)

    # -- anchoring -------------------------------------------------------------------------

    def anchor_up(self, p: int) -> None:
        """A child of ``p`` became anchored; flip ancestors that become anchored."""
        anchored, ref, parent = self.anchored_children, self.ref, self.parent
        while p >= 0:
            a = anchored[p]
            anchored[p] = a + 1
            if a or ref[p]:
                return
            self.num_reclaimable -= 1
            p = parent[p]

    def unanchor_up(self, p: int) -> None:
        """A child of ``p`` stopped being anchored; flip ancestors that lose their anchor."""
        anchored, ref, parent = self.anchored_children, self.ref, self.parent
        while p >= 0:
            a = anchored[p] - 1
            anchored[p] = a
            if a or ref[p]:
                return
            self.num_reclaimable += 1
            p = parent[p]

    # -- holds -----------------------------------------------------------------------------

    def pin(self, blocks: Sequence[int]) -> None:
        """Hold each of ``blocks`` (a matched chain, root first) once more."""
        ref, anchored = self.ref, self.anchored_children
        for b in blocks:
            r = ref[b]
            ref[b] = r + 1
            if r == 0:
                self.num_used += 1
                self.num_cached -= 1
                if not anchored[b]:
                    self.num_reclaimable -= 1
                    self.anchor_up(self.parent[b])

    def release(self, blocks: Sequence[int], clock: int) -> None:
        """Drop one hold on each of ``blocks``, tail first, so deeper blocks age first."""
        ref, ptoks, parent = self.ref, self.tokens, self.parent
        anchored, children, last_use = self.anchored_children, self.num_children, self.last_use
        released = self.released
        freed = cached = unanchored = 0
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if r:
                continue
            freed += 1
            if ptoks[b] is None:
                released.append(b)
                continue
            last_use[b] = clock
            cached += 1
            if not anchored[b]:
                unanchored += 1
                p = parent[b]
                if p >= 0:
                    # Inline first step of unanchor_up: usually the parent is still held.
                    a = anchored[p] - 1
                    anchored[p] = a
                    if not a and not ref[p]:
                        self.num_reclaimable += 1
                        self.unanchor_up(parent[p])
            if not children[b]:
                self.leaves.push(self, b)
        self.num_used -= freed
        self.num_cached += cached
        self.num_reclaimable += unanchored

    # -- publication and eviction ----------------------------------------------------------

    def publish(
        self,
        b: int,
        tokens: tuple[int, ...],
        namespace: bytes,
        extra: tuple[tuple[int, bytes], ...],
        parent: int,
        block_hash: int,
        depth: int,
        serial: int,
    ) -> None:
        """Store the identity of the held block ``b`` (its parent is published)."""
        self.tokens[b] = tokens
        self.namespace[b] = namespace
        self.extra[b] = extra
        self.parent[b] = parent
        self.block_hash[b] = block_hash
        self.depth[b] = depth
        self.serial[b] = serial
        self.num_published += 1
        if parent >= 0:
            self.num_children[parent] += 1
            # b is held, hence anchored: tell the parent (inlined first step of anchor_up).
            anchored = self.anchored_children
            a = anchored[parent]
            anchored[parent] = a + 1
            if not a and not self.ref[parent]:
                self.num_reclaimable -= 1
                self.anchor_up(self.parent[parent])

    def pop_leaves(self, count: int) -> list[int]:
        """Take up to ``count`` leaves off the eviction order, each still published.

        A parent left without published children becomes a leaf and may go in the same
        call. The caller unindexes the victims, then hands them to :meth:`forget`.
        """
        heap = self.leaves.heap
        version, ref, children, ptoks = self.leaf_version, self.ref, self.num_children, self.tokens
        parent = self.parent
        pop = heapq.heappop
        victims: list[int] = []
        while len(victims) < count and heap:
            _, _, b, v = pop(heap)
            if version[b] != v or ref[b] or children[b] or ptoks[b] is None:
                continue  # stale entry: b stopped being a leaf since it was queued
            victims.append(b)
            p = parent[b]
            if p >= 0:
                left = children[p] - 1
                children[p] = left
                if not left and not ref[p]:
                    self.leaves.push(self, p)
        return victims

    def forget(self, victims: Sequence[int]) -> None:
        """Unpublish the evicted ``victims`` and return them to the free queue."""
        gen, released = self.gen, self.released
        for b in victims:
            self.clear_block(b)
            gen[b] += 1
            released.append(b)
        n = len(victims)
        self.num_cached -= n
        self.num_published -= n
        self.num_reclaimable -= n

    def clear_block(self, b: int) -> None:
        """Forget a block's identity (it is being evicted or was private)."""
        self.tokens[b] = None
        self.namespace[b] = None
        self.extra[b] = ()
        self.parent[b] = NO_PARENT
        self.block_hash[b] = 0
        self.depth[b] = 0
        self.last_use[b] = 0

    def clear(self, published: Sequence[int]) -> None:
        """A full reset: unpublish ``published`` (every published block; none is held)."""
        for b in published:
            self.clear_block(b)
            self.num_children[b] = 0
            self.anchored_children[b] = 0
            self.gen[b] += 1
        self.leaves.clear()
        self.released.clear()
        self.fresh_next = 0
        self.num_cached = self.num_published = self.num_reclaimable = 0

    def maybe_compact(self) -> None:
        self.leaves.maybe_compact(self, self.num_cached)

    def eviction_order(self) -> list[int]:
        return self.leaves.order(self)
