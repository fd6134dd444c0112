"""The block pool: per-block metadata in flat arrays, and the FIFO free queue.

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

from array import array
from collections import deque

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
        "namespace",
        "num_blocks",
        "num_children",
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

    # -- free queue ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh_next + len(self.released)

    def take(self, count: int) -> list[int]:
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

    def free_queue(self) -> tuple[int, ...]:
        return (*range(self.fresh_next, self.num_blocks), *self.released)

    def clear_block(self, b: int) -> None:
        """Forget a block's identity (it is being evicted or was private)."""
        self.tokens[b] = None
        self.namespace[b] = None
        self.extra[b] = ()
        self.parent[b] = NO_PARENT
        self.block_hash[b] = 0
        self.depth[b] = 0
        self.last_use[b] = 0
