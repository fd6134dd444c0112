"""The eviction order on its own: a heap of cached leaves with lazy deletion.

The leaf heap reads a pool's columns and keeps one of its own (each block's leaf version).
These tests build pools by hand through the pool's methods, then check the heap against the
order the spec defines (least recently released first, then deeper, then lower id, leaves
only), stale entries, the climb that takes a parent left childless in the same batch, and
the rebuild.
"""

from __future__ import annotations

import itertools
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st
from prefixkv.impl._leaves import COMPACT_SLACK, LeafHeap
from prefixkv.impl._pool import NO_PARENT, BlockPool

from tests.impl.test_pool import leaf_order

BS = 1
NS = b"ns"


def _pool(num_blocks: int, slack: int = COMPACT_SLACK) -> BlockPool:
    return BlockPool(num_blocks, BS, wire_hashes=False, heap_slack=slack)


def _chain(pool: BlockPool, length: int, parent: int = NO_PARENT) -> list[int]:
    """Publish a chain of ``length`` new blocks under ``parent``; they stay held."""
    blocks = pool.allocate(length)
    depth = pool.depth[parent] + 1 if parent >= 0 else 1
    for b in blocks:
        key = 1000 * depth + b
        pool.publish_plain(b, array("I", [key]).tobytes(), NS, parent, key, depth, key)
        parent, depth = b, depth + 1
    return blocks


def _evict(pool: BlockPool, count: int) -> list[int]:
    victims = pool.pop_leaves(count)
    pool.forget(victims)
    return victims


def test_least_recently_released_first_then_deeper_then_lower_id() -> None:
    pool = _pool(6)
    a = _chain(pool, 2)  # 0 <- 1
    b = _chain(pool, 1)  # 2
    c = _chain(pool, 1)  # 3
    pool.release(c, clock=1)
    pool.release(a, clock=2)
    pool.release(b, clock=2)
    # 3 is oldest; at clock 2 the leaves are 1 (depth 2) and 2 (depth 1): deeper first.
    assert pool.eviction_order() == [3, 1, 2]
    # Evicting 3 and 1 leaves 0 childless: a leaf at clock 2, depth 1, id 0 < 2.
    assert _evict(pool, 3) == [3, 1, 0]
    assert pool.eviction_order() == [2]


def test_equal_release_and_depth_go_by_lower_id() -> None:
    pool = _pool(3)
    blocks = [_chain(pool, 1)[0] for _ in range(3)]
    pool.release(blocks[::-1], clock=5)
    assert pool.eviction_order() == [0, 1, 2]


def test_a_stale_entry_is_skipped() -> None:
    """A leaf pinned again, or one that gained a child, keeps its old entry; that entry
    must not make it a victim."""
    pool = _pool(5)
    a = _chain(pool, 1)
    b = _chain(pool, 1)
    pool.release(a, clock=1)
    pool.release(b, clock=2)
    pool.pin(a)  # a is held again: its entry is stale
    child = _chain(pool, 1, parent=b[0])  # b has a child now: its entry is stale too
    assert pool.eviction_order() == []
    assert _evict(pool, 2) == []
    pool.release(child, clock=3)
    pool.release(a, clock=4)
    assert _evict(pool, 3) == [child[0], b[0], a[0]]


def test_a_re_pushed_leaf_is_ordered_by_its_new_release() -> None:
    """A leaf released, pinned and released again has two entries; only the newer counts
    (the older one carries an older leaf version)."""
    pool = _pool(3)
    a = _chain(pool, 1)
    b = _chain(pool, 1)
    pool.release(a, clock=1)
    pool.release(b, clock=2)
    pool.pin(a)
    pool.release(a, clock=3)
    assert pool.eviction_order() == [b[0], a[0]]
    assert _evict(pool, 1) == [b[0]]


def test_a_parent_that_does_not_go_next_is_queued() -> None:
    """The climb takes a parent left childless only if it goes before the heap's next
    entry; otherwise it is pushed and taken in its turn."""
    pool = _pool(4)
    parent, child = _chain(pool, 2)
    (other,) = _chain(pool, 1)
    pool.release([child], clock=1)
    pool.release([other], clock=2)
    pool.release([parent], clock=3)  # its sequence let go of the parent last
    assert pool.eviction_order() == [child, other]  # the parent is no leaf yet
    assert _evict(pool, 3) == [child, other, parent]


def test_a_parent_left_childless_by_a_full_batch_is_queued() -> None:
    pool = _pool(4)
    parent, child = _chain(pool, 2)
    (other,) = _chain(pool, 1)
    pool.release([parent], clock=1)
    pool.release([other], clock=2)
    pool.release([child], clock=3)
    assert pool.eviction_order() == [other, child]
    assert _evict(pool, 2) == [other, child]  # the batch is full when the parent is a leaf
    assert pool.eviction_order() == [parent]  # queued, not lost
    assert _evict(pool, 5) == [parent]


def test_a_parent_older_than_the_heap_is_taken_at_once() -> None:
    pool = _pool(4)
    parent, child = _chain(pool, 2)
    (other,) = _chain(pool, 1)
    pool.release([parent], clock=1)
    pool.release([child], clock=2)
    pool.release([other], clock=3)
    assert _evict(pool, 2) == [child, parent]
    assert pool.eviction_order() == [other]


def test_the_heap_is_rebuilt_once_stale_entries_dominate() -> None:
    pool = _pool(4, slack=0)
    (b,) = _chain(pool, 1)
    heap = pool._leaves
    for clock in range(10):
        pool.release([b], clock=clock)
        pool.pin([b])
    pool.release([b], clock=10)
    assert len(heap.heap) == 11  # ten stale entries and the live one
    pool.maybe_compact()
    assert len(heap.heap) == 1 and pool.eviction_order() == [b]
    assert heap.heap[0][3] == heap.versions[b]


def test_the_default_slack_tolerates_stale_entries() -> None:
    pool = _pool(4)
    (b,) = _chain(pool, 1)
    for clock in range(10):
        pool.release([b], clock=clock)
        pool.pin([b])
    pool.maybe_compact()
    assert len(pool._leaves.heap) == 10  # within 2 * 0 cached + COMPACT_SLACK


def test_versions_wrap_within_32_bits() -> None:
    pool = _pool(2)
    (b,) = _chain(pool, 1)
    heap = pool._leaves
    heap.versions[b] = 0x7FFFFFFF
    pool.release([b], clock=1)
    assert heap.versions[b] == 0 and pool.eviction_order() == [b]


def test_clear_drops_every_entry() -> None:
    heap = LeafHeap(4)
    pool = _pool(4)
    (b,) = _chain(pool, 1)
    pool.release([b], clock=1)
    heap.push(pool, b)
    assert heap.order(pool) == [b]
    heap.clear()
    assert heap.order(pool) == [] and heap.pop(pool, 4) == []


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3)), min_size=1, max_size=6),
    clocks=st.lists(st.integers(0, 4), min_size=6, max_size=6),
    slack=st.sampled_from([COMPACT_SLACK, 0, -8]),
    counts=st.lists(st.integers(0, 5), min_size=1, max_size=4),
)
def test_pop_takes_the_leaves_in_the_spec_order(
    shape: list[tuple[int, int]], clocks: list[int], slack: int, counts: list[int]
) -> None:
    """A random forest of chains, each released at a random clock: every batch of victims
    is what taking the smallest leaf, one at a time, gives (a parent left childless joins
    the leaves at once)."""
    pool = _pool(sum(length for _, length in shape), slack)
    chains: list[list[int]] = []
    for under, length in shape:
        parent = chains[under % len(chains)][-1] if chains and under else NO_PARENT
        chains.append(_chain(pool, length, parent))
    for chain, clock in zip(chains, itertools.cycle(clocks)):
        pool.release(chain, clock)
    for count in counts:
        expected: list[int] = []
        for _ in range(count):
            order = leaf_order(pool, expected)
            if not order:
                break
            expected.append(order[0])
        assert pool.eviction_order() == leaf_order(pool)
        assert _evict(pool, count) == expected
        pool.maybe_compact()
