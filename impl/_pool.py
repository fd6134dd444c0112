"""The block pool: per-block metadata, refcounts, the free queue and the eviction order.

The pool owns everything that is about blocks as such: who holds them (refcounts), which
are free, cached (published, refcount 0) or in use (INV-PARTITION), which cached blocks are
leaves and in what order they go (choice 3), and the *anchoring* that makes ``can_admit``
exact (see :mod:`prefixkv.impl.cache`). It knows nothing about requests, hashes or the
index: the manager tells it which block to publish under which identity and which leaves
it evicted from the index.

NOTE: metadata lives in parallel machine-int arrays indexed by block id rather than in one
object per block, and the hot loops bind the arrays they need to locals. A published block's
token ids live in one flat byte buffer (``block_size`` native 32-bit ids per block, at
``b * block_size * 4``), so verifying a hit compares one contiguous slice, and a cached block
costs no Python object of its own, only its share of the arrays (:meth:`BlockPool.nbytes`;
measured against a tuple of int objects per block in docs/benchmarks.md, "Host memory per
cached block"). Only the namespace (a reference to a shared bytes key) and the multimodal
extra keys (a sparse dict: text blocks have none) are Python references.

NOTE: the arrays and the token buffer are allocated once, at their final size
(``num_blocks`` entries), when the pool is built. Growing them as blocks were first handed out
cost more than it saved: every doubling copies the array and frees the old one, and the
allocator keeps much of that freed memory (docs/benchmarks.md, "What is measured").
Allocated at once, a cached block costs exactly its share of the arrays, whatever the pool
size. The cyclic garbage collector does not traverse arrays at all.

The free queue is FIFO (allocate from the front, release to the back), exactly as the spec's
plain list. It is stored as a lazily materialized range of never-used ids followed by a deque
of released ids, so a full reset costs nothing per block that was never published:

::

    free queue:  [ fresh_next ... num_blocks-1 ][ released[0] ... released[-1] ]
                   never used since (re)start      freed or evicted, oldest first
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from struct import Struct

from ._leaves import COMPACT_SLACK, LeafHeap

__all__ = ["NO_PARENT", "BlockPool"]

#: Parent id of a root block.
NO_PARENT = -1

#: Versions and generations are compared for equality only, and wrap within a 32-bit array.
_WRAP = 0x7FFFFFFF

# NOTE: the token buffer holds native 32-bit unsigned ids: array('I') on every platform
# CPython supports (checked here rather than assumed).
assert array("I").itemsize == 4, "array('I') must hold 32-bit token ids"
_NATIVE = sys.byteorder


#: ``Struct(...).pack`` per (typecode, count), for the counts runs usually have.
_PACKERS: dict[tuple[str, int], Callable[..., bytes]] = {}


def _ints(typecode: str, values: Sequence[int]) -> array[int]:
    """An array of ``values``, built from packed bytes (see :meth:`BlockPool._publish_span`).

    NOTE: ``array(typecode, values)`` stores item by item through the argument parser;
    a :class:`struct.Struct` converts each int directly, and an array built from bytes is
    one copy. The format ``=`` is native byte order and standard sizes, which are the
    array's: ``i`` is 4 bytes and ``q`` 8 on every platform CPython supports (checked
    below). Packers are kept per count up to 64 (a run is rarely longer).
    """
    k = len(values)
    packer = _PACKERS.get((typecode, k))
    if packer is None:
        packer = Struct(f"={k}{typecode}").pack
        if k <= 64:
            _PACKERS[typecode, k] = packer
    return array(typecode, packer(*values))


assert array("i").itemsize == 4 and array("q").itemsize == 8, "pool arrays: 32 and 64 bits"

#: An int32 1, to be repeated over a range: one hold of each fresh block, or one
#: published child of each block of a run.
_ONE: array[int] = array("i", (1,))


class BlockPool:
    """The pool's data model: one column per field, indexed by block id (see the module).

    The columns are the pool's own. Every write goes through a method of this class (the
    "written by" column; ``publish*`` is :meth:`publish`, :meth:`publish_plain` and
    :meth:`publish_run`); ``tests/impl/test_encapsulation.py`` rejects a write from any
    other module.

    NOTE: the columns keep public names, and the walk, the index, the leaf heap, the
    publisher, the eviction record and the manager read them directly, binding the arrays
    they need to locals in their loops. A read through a method or a property would add a
    call per block read on the hottest paths (the prompt walk, eviction) and buy no safety
    a read needs. The writes are the pool's methods, each one step of the model's (a
    publication, a release, an eviction), whatever column it touches.

    Per block (``b`` is published iff ``depth[b] != 0``; the identity fields, ``tokens``
    to ``serial``, are read only while it is):

    =================  ===========  =========================  =======================  ============
    column             type         meaning                    invariant                written by
    =================  ===========  =========================  =======================  ============
    ref                array('i')   holds on b: the live       INV-REF; ref > 0 iff b   allocate,
                                    block tables that list it  is used                  pin, release
    depth              array('i')   b's place in its chain, 1  0 iff b is unpublished;  publish*,
                                    for a root                 a child's is its         forget,
                                                               parent's plus 1          clear
    tokens             bytearray    token ids, native uint32,  part of the identity     publish*
                                    block_nbytes at b *        has_identity compares
                                    block_nbytes
    namespace          list         the namespace key (bytes;  one shared object per    publish*
                                    None if never published)   namespace
    extra              dict         multimodal extra keys, of  no entry for an          publish,
                                    the blocks that have any   unpublished block        forget,
                                                                                        clear
    parent             array('i')   the parent's id, or        a published block's      publish*
                                    NO_PARENT                  parent is published
                                                               (INV-ANCESTOR)
    key                array('q')   the index key b is filed   the index files b under  publish*
                                    under                      it (INV-INDEX)
    event_hash         array('q')   the events' block hash     empty unless             publish
                                                               wire_hashes
    serial             array('q')   the name of b's identity   unique per identity      publish*
                                    (see ._record)
    last_use           array('q')   the clock when b's last    set whenever ref falls   release
                                    hold was dropped           to 0
    num_children       array('i')   published children         a leaf has none          publish*,
                                                               (between pop_leaves and  drop_child,
                                                               forget, the victims are  clear
                                                               not counted)
    anchored_children  array('i')   anchored published         b is anchored iff ref    pin,
                                    children (see .cache)      or this is nonzero       release,
                                                                                        publish*,
                                                                                        anchor_up,
                                                                                        unanchor_up,
                                                                                        clear
    gen                array('i')   the generation, moved on   a remembered (b, gen)    forget,
                                    when b is unpublished      pair detects reuse       clear
    =================  ===========  =========================  =======================  ============

    Whole pool (INV-PARTITION: ``num_free + num_cached + num_used == num_blocks``, where
    ``num_free`` is the free queue's length):

    =================  ===========  =========================  =======================  ============
    column             type         meaning                    invariant                written by
    =================  ===========  =========================  =======================  ============
    fresh_next         int          the first never-used id    ids from it on are free  allocate,
                                                               and never published      clear
    released           deque[int]   freed or evicted ids,      the free queue is the    allocate,
                                    oldest first               fresh range, then these  release,
                                                                                        forget,
                                                                                        clear
    num_used           int          blocks with ref > 0        INV-PARTITION            allocate,
                                                                                        pin, release
    num_cached         int          published blocks with ref  INV-PARTITION            pin,
                                    == 0                                                release,
                                                                                        forget,
                                                                                        clear
    num_published      int          published blocks           the blocks with depth    publish*,
                                                               != 0                     forget,
                                                                                        clear
    num_reclaimable    int          published, unanchored      supply counts them as    pin,
                                    blocks                     free                     release,
                                                                                        publish*,
                                                                                        anchor_up,
                                                                                        unanchor_up,
                                                                                        forget,
                                                                                        clear
    num_blocks         int          blocks in the pool         fixed                    ``__init__``
    block_size         int          tokens per block           fixed                    ``__init__``
    block_nbytes       int          token bytes per block      4 * block_size           ``__init__``
    wire_hashes        bool         whether event_hash is      fixed                    ``__init__``
                                    kept
    =================  ===========  =========================  =======================  ============

    The eviction order (:class:`~._leaves.LeafHeap`, private) is reached through
    :meth:`pop_leaves`, :meth:`maybe_compact` and :meth:`eviction_order`; it keeps its
    own column, each block's leaf version.
    """

    __slots__ = (
        "_leaves",
        "anchored_children",
        "block_nbytes",
        "block_size",
        "depth",
        "event_hash",
        "extra",
        "fresh_next",
        "gen",
        "key",
        "last_use",
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
        "wire_hashes",
    )

    @staticmethod
    def nbytes(num_blocks: int, block_size: int, *, wire_hashes: bool = True) -> int:
        """What :meth:`__init__` allocates up front for this shape, in bytes: the per-block
        arrays below, the leaf heap's included (``tests/impl/test_construction.py`` holds the
        two together).

        Args:
            num_blocks: the pool's blocks.
            block_size: tokens per block.
            wire_hashes: whether the pool keeps each block's event hash.

        Returns:
            The bytes of every per-block array and list, the token store included.
        """
        # ref depth parent num_children anchored_children gen, the leaf heap's versions: int32;
        # key last_use serial (event_hash): int64; namespace: one pointer; token ids: uint32.
        per_block = 7 * 4 + (4 if wire_hashes else 3) * 8 + 8 + 4 * block_size
        return num_blocks * per_block

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        wire_hashes: bool = True,
        heap_slack: int = COMPACT_SLACK,
    ) -> None:
        """Allocate every column at its final size: nothing is published, every block free.

        Args:
            num_blocks: the pool's blocks.
            block_size: tokens per block.
            wire_hashes: whether to keep each published block's event hash (the manager
                records KV events).
            heap_slack: the leaf heap's stale-entry slack (:data:`~._leaves.COMPACT_SLACK`;
                a test knob: see ``PrefixCacheManager``).
        """
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_nbytes = 4 * block_size
        n = num_blocks
        four, eight = bytes(4 * n), bytes(8 * n)  # zeros, without a temporary list
        #: Holds on each block (INV-REF).
        self.ref: array[int] = array("i", four)
        #: Token ids of published blocks, ``block_nbytes`` per block (native uint32).
        self.tokens = bytearray(self.block_nbytes * n)
        #: A published block's depth (>= 1); 0 iff the block is unpublished.
        self.depth: array[int] = array("i", four)
        self.namespace: list[bytes | None] = [None] * n
        #: Extra keys (multimodal) of published blocks that have any; text blocks are absent.
        self.extra: dict[int, tuple[tuple[int, bytes], ...]] = {}
        self.parent: array[int] = array("i", [NO_PARENT]) * n
        #: The index key a published block is filed under.
        self.key: array[int] = array("q", eight)
        #: The event hash (the events' ``block_hash``, see prefixkv.spec.identity.event_hash)
        #: of a published block; kept only when ``wire_hashes`` (the manager records events).
        self.event_hash: array[int] = array("q", eight if wire_hashes else b"")
        self.wire_hashes = wire_hashes
        self.last_use: array[int] = array("q", eight)
        #: Published children of a published block (a leaf has none).
        self.num_children: array[int] = array("i", four)
        #: Published children that are *anchored*: held by a sequence, or with an anchored
        #: child. See ``PrefixCacheManager`` for why this makes ``can_admit`` exact.
        self.anchored_children: array[int] = array("i", four)
        #: Bumped whenever b is evicted, so a remembered (block, gen) pair detects reuse.
        self.gen: array[int] = array("i", four)
        #: The exact name of a published block's identity (see the manager's eviction record).
        self.serial: array[int] = array("q", eight)
        del four, eight
        self.fresh_next = 0
        self.released: deque[int] = deque()
        #: The cached leaves in eviction order (with its own column, the leaf versions).
        self._leaves = LeafHeap(n, heap_slack)
        # Occupancy (INV-PARTITION: free + cached + used == num_blocks).
        self.num_used = 0  # refcount > 0
        self.num_cached = 0  # published, refcount 0
        self.num_published = 0
        self.num_reclaimable = 0  # published and unanchored

    def is_published(self, b: int) -> bool:
        return self.depth[b] != 0

    def block_tokens(self, b: int) -> bytes:
        """The token ids of published block ``b``, as native uint32 bytes."""
        start = b * self.block_nbytes
        return bytes(self.tokens[start : start + self.block_nbytes])

    def token_ids(self, b: int) -> tuple[int, ...]:
        return tuple(array("I", self.block_tokens(b)))

    def has_identity(
        self,
        b: int,
        tokens: bytes,
        parent: int,
        namespace: bytes,
        extra: tuple[tuple[int, bytes], ...],
    ) -> bool:
        """Whether published block ``b``'s identity is exactly this one (INV-INDEX).

        NOTE: comparing the *parent block id* instead of the parent's whole identity is
        exact by induction: the parent was itself found by an exact lookup, and a published
        block's parent stays published (INV-ANCESTOR) and is never reused while the child
        exists.
        """
        start = b * self.block_nbytes
        return (
            self.tokens[start : start + self.block_nbytes] == tokens
            and self.parent[b] == parent
            and self.namespace[b] == namespace
            and self.extra.get(b, ()) == extra
        )

    # -- free queue ------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.fresh_next + len(self.released)

    @property
    def supply(self) -> int:
        """Blocks an allocation can get: free ones, and every unanchored published one."""
        return self.num_blocks - self.fresh_next + len(self.released) + self.num_reclaimable

    def _take(self, count: int) -> list[int]:
        """Pop ``count`` ids from the front of the free queue, each held once now. The
        caller checked supply.

        The never-used ids come first, as one range: their refcounts are set with one
        slice assignment, so a prompt's fresh blocks cost no loop step each.
        """
        start = self.fresh_next
        fresh = min(count, self.num_blocks - start)
        taken = list(range(start, start + fresh))
        if fresh:
            self.fresh_next = start + fresh
            self.ref[start : start + fresh] = _ONE * fresh
        if fresh < count:
            popleft, ref = self.released.popleft, self.ref
            for _ in range(count - fresh):
                b = popleft()
                ref[b] = 1
                taken.append(b)
        return taken

    def allocate(self, count: int) -> list[int]:
        """Hand out ``count`` free blocks, each held once. The caller made them free."""
        if count == 1 and self.fresh_next == self.num_blocks:
            b = self.released.popleft()  # the fresh range is used up: FIFO is the deque
            self.ref[b] = 1
            new = [b]
        else:
            new = self._take(count)
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
        """Hold each of ``blocks``, a matched chain (root first: each block's parent is the
        one before it), once more.

        The blocks pinned from refcount 0 change the occupancy counts. The unanchored ones
        (refcount 0, no anchored child) form a suffix of the chain (an anchored block's
        parent is anchored): each becomes anchored and anchors its parent, the block before
        it in the chain, which is held by then, so nothing propagates further up.

        NOTE: one plain loop for the holds. Scattering them through C-level iterators
        (``map(operator.setitem, ...)``) costs more than the loop: an array has no bulk
        scatter, so each element still goes through a call.
        """
        ref = self.ref
        zeros = 0
        for b in blocks:
            r = ref[b]
            ref[b] = r + 1
            if not r:
                zeros += 1
        if not zeros:
            return
        self.num_used += zeros
        self.num_cached -= zeros
        anchored = self.anchored_children
        m = len(blocks)
        # Bisection over the suffix: held now means refcount 1 and pinned from 0 here.
        u = bisect_left(
            range(m), True, key=lambda j: ref[blocks[j]] == 1 and not anchored[blocks[j]]
        )
        if u < m:
            self.num_reclaimable -= m - u
            for p in blocks[max(u, 1) - 1 : m - 1]:
                anchored[p] += 1

    def release(self, blocks: Sequence[int], clock: int) -> None:
        """Drop one hold on each of ``blocks``, tail first, so deeper blocks age first."""
        ref, depth, parent = self.ref, self.depth, self.parent
        anchored, children, last_use = self.anchored_children, self.num_children, self.last_use
        released = self.released
        freed = cached = unanchored = 0
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if r:
                continue
            freed += 1
            if not depth[b]:
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
                self._leaves.push(self, b)
        self.num_used -= freed
        self.num_cached += cached
        self.num_reclaimable += unanchored

    # -- publication and eviction ----------------------------------------------------------

    def publish(
        self,
        b: int,
        tokens: bytes,
        namespace: bytes,
        extra: tuple[tuple[int, bytes], ...],
        parent: int,
        key: int,
        event_hash: int,
        depth: int,
        serial: int,
    ) -> None:
        """Store the identity of the held block ``b`` (its parent is published)."""
        if extra:
            self.extra[b] = extra
        if self.wire_hashes:
            self.event_hash[b] = event_hash
        self.publish_plain(b, tokens, namespace, parent, key, depth, serial)

    def publish_plain(
        self,
        b: int,
        tokens: bytes,
        namespace: bytes,
        parent: int,
        key: int,
        depth: int,
        serial: int,
    ) -> None:
        """:meth:`publish` without extra keys or a wire hash (the manager's plain case: the
        keyed index, no events; :meth:`publish` stores those first, then calls this)."""
        start = b * self.block_nbytes
        self.tokens[start : start + self.block_nbytes] = tokens
        self.namespace[b] = namespace
        self.parent[b] = parent
        self.key[b] = key
        self.depth[b] = depth
        self.serial[b] = serial
        self.num_published += 1
        if parent >= 0:
            self.num_children[parent] += 1
            self.anchor_up(parent)  # b is held, hence anchored: tell the parent

    def publish_run(
        self,
        run: list[int],
        tokens: bytes,
        namespace: bytes,
        parent: int,
        keys: list[int],
        depth: int,
        serials: list[int],
    ) -> None:
        """:meth:`publish_plain` of each block of ``run``, a chain: the first block's parent
        is ``parent`` (published) at depth ``depth - 1``, every other's is the block before
        it. ``tokens`` holds the run's token ids, ``block_nbytes`` per block, in order.
        """
        assert not self.wire_hashes, "publish_run keeps no wire hashes"
        k = len(run)
        b0 = run[0]
        # Every block of the run but the last gains its one published child, held (so
        # anchored) by the publishing sequence, as it is itself: nothing propagates. Before,
        # each had none: it was unpublished, and a published block's parent is published
        # (INV-ANCESTOR), so 1 is exactly one more.
        if run == list(range(b0, b0 + k)):
            self._publish_span(b0, k, tokens, namespace, parent, keys, depth, serials)
        else:
            nb = self.block_nbytes
            ptoks, names, parents = self.tokens, self.namespace, self.parent
            keys_a, depths, serials_a = self.key, self.depth, self.serial
            p, o = parent, 0
            for b, key, serial in zip(run, keys, serials, strict=True):
                start = b * nb
                ptoks[start : start + nb] = tokens[o : o + nb]
                o += nb
                names[b] = namespace
                parents[b] = p
                keys_a[b] = key
                depths[b] = depth
                depth += 1
                serials_a[b] = serial
                p = b
            children, anchored = self.num_children, self.anchored_children
            for b in run[:-1]:
                children[b] = anchored[b] = 1
        self.num_published += k
        if parent >= 0:
            self.num_children[parent] += 1
            self.anchor_up(parent)  # the run's first block is held, hence anchored

    def _publish_span(
        self,
        b0: int,
        k: int,
        tokens: bytes,
        namespace: bytes,
        parent: int,
        keys: list[int],
        depth: int,
        serials: list[int],
    ) -> None:
        """:meth:`publish_run`'s stores for the consecutive ids ``b0..b0+k-1`` (a fresh
        allocation hands out such runs): one slice assignment per array instead of a store
        per block. The caller counts the run and anchors its parent.

        NOTE: an array's item store parses its argument through the generic argument parser;
        a slice assignment of an array built from packed bytes costs a small fraction of that
        per item (docs/benchmarks.md, "Where publication's time goes"). The ids are
        consecutive, so each field's new values are one slice.
        """
        stop = b0 + k
        nb = self.block_nbytes
        self.tokens[b0 * nb : stop * nb] = tokens
        self.namespace[b0:stop] = [namespace] * k
        self.parent[b0:stop] = _ints("i", (parent, *range(b0, stop - 1)))
        self.key[b0:stop] = _ints("q", keys)
        self.depth[b0:stop] = _ints("i", range(depth, depth + k))
        self.serial[b0:stop] = _ints("q", serials)
        if k > 1:
            ones = _ONE * (k - 1)
            self.num_children[b0 : stop - 1] = ones
            self.anchored_children[b0 : stop - 1] = ones

    def drop_child(self, p: int) -> int:
        """One published child of ``p`` is being evicted: count it out.

        Called by the leaf heap's climb for each victim's parent, before the victims are
        unpublished (:meth:`forget`).

        Args:
            p: the published parent.

        Returns:
            The published children ``p`` has left (0: it may have just become a leaf).
        """
        left = self.num_children[p] - 1
        self.num_children[p] = left
        return left

    def pop_leaves(self, count: int) -> list[int]:
        """Take up to ``count`` leaves off the eviction order, each still published.

        A parent left without published children becomes a leaf and may go in the same
        call. The caller unindexes the victims, then hands them to :meth:`forget`.
        """
        return self._leaves.pop(self, count)

    def forget(self, victims: Sequence[int]) -> None:
        """Unpublish the evicted ``victims`` and return them to the free queue."""
        self._unpublish(victims)
        self.released.extend(victims)
        n = len(victims)
        self.num_cached -= n
        self.num_published -= n
        self.num_reclaimable -= n

    def _unpublish(self, blocks: Sequence[int]) -> None:
        """Forget the identity of each of ``blocks`` and give it a new generation (so that
        a remembered canonical block is known to be gone), in one loop over the batch.

        NOTE: only what a later reader can see is cleared. Every reader of a block's
        identity (its namespace, parent, token bytes, last use) looks at a published block
        only, and ``depth`` says which ones are: publication writes every one of those
        fields again, and a release sets the last use before eviction order reads it. So
        unpublishing sets the depth to 0 and moves the generation on, and leaves the rest
        behind. The extra keys are the exception: publication stores them only when a
        block has any, so a stale entry would be read as the next identity's.
        """
        depth, gen = self.depth, self.gen
        for b in blocks:
            depth[b] = 0
            gen[b] = (gen[b] + 1) & _WRAP
        extra = self.extra
        if extra:
            for b in blocks:
                extra.pop(b, None)

    def clear(self, published: Sequence[int]) -> None:
        """A full reset: unpublish ``published`` (every published block; none is held)."""
        self._unpublish(published)
        children, anchored = self.num_children, self.anchored_children
        for b in published:
            children[b] = anchored[b] = 0
        self._leaves.clear()
        self.released.clear()
        self.fresh_next = 0
        self.num_cached = self.num_published = self.num_reclaimable = 0

    def maybe_compact(self) -> None:
        self._leaves.maybe_compact(self, self.num_cached)

    def eviction_order(self) -> list[int]:
        return self._leaves.order(self)
