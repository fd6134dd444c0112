"""The block pool on its own: every invariant of its column table, after every method.

The differential machines compare the whole manager with the spec; these tests drive a bare
:class:`~prefixkv.impl._pool.BlockPool` through its methods the way the manager does
(allocate, pin a cached chain, publish a sequence's blocks one at a time or as a run,
release, evict, reset), and after every step recompute each column's invariant from the
per-block columns by brute force (``assert_consistent``): the occupancy counts
(INV-PARTITION), the published children, the anchoring and the eviction order.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefixkv.impl._pool import NO_PARENT, BlockPool

BS = 2  # tokens per block
NS = b"ns"


def _tokens(*ids: int) -> bytes:
    return array("I", ids).tobytes()


def _anchored(pool: BlockPool) -> set[int]:
    """Published blocks held by a sequence or with an anchored published child."""
    published = [b for b in range(pool.num_blocks) if pool.depth[b]]
    anchored: set[int] = set()
    for b in sorted(published, key=lambda b: -pool.depth[b]):  # children before parents
        if pool.ref[b] or any(pool.parent[c] == b for c in anchored):
            anchored.add(b)
    return anchored


def leaf_order(pool: BlockPool, gone: Sequence[int] = ()) -> list[int]:
    """The cached leaves (published, refcount 0, no published children but ``gone``) in
    eviction order: least recently released, then deeper, then lower id."""
    gone_set = set(gone)
    published = [b for b in range(pool.num_blocks) if pool.depth[b] and b not in gone_set]
    parents = {pool.parent[b] for b in published}
    leaves = [b for b in published if not pool.ref[b] and b not in parents]
    return sorted(leaves, key=lambda b: (pool.last_use[b], -pool.depth[b], b))


def assert_consistent(pool: BlockPool) -> None:
    """Each invariant of ``BlockPool``'s column table, recomputed from the columns."""
    n = pool.num_blocks
    free = pool.free_queue()
    published = [b for b in range(n) if pool.depth[b]]
    used = [b for b in range(n) if pool.ref[b]]
    cached = [b for b in published if not pool.ref[b]]
    assert len(set(free)) == len(free) == pool.num_free, "a block twice in the free queue"
    assert not set(free) & (set(used) | set(published)), "a free block is held or published"
    assert len(free) + len(cached) + len(used) == n, "INV-PARTITION"
    assert min(pool.ref) >= 0, "a negative refcount"
    assert (pool.num_used, pool.num_cached, pool.num_published) == (
        len(used),
        len(cached),
        len(published),
    ), "occupancy counts"
    assert not set(range(pool.fresh_next, n)) & (set(used) | set(published)), "fresh_next"
    for b in published:
        p = pool.parent[b]
        if p == NO_PARENT:
            assert pool.depth[b] == 1, f"root {b} at depth {pool.depth[b]}"
        else:
            assert pool.depth[p], f"INV-ANCESTOR: {b}'s parent {p} is unpublished"
            assert pool.depth[b] == pool.depth[p] + 1, f"{b}'s depth"
        children = sum(1 for c in published if pool.parent[c] == b)
        assert pool.num_children[b] == children, f"num_children[{b}]"
    anchored = _anchored(pool)
    for b in published:
        count = sum(1 for c in anchored if pool.parent[c] == b)
        assert pool.anchored_children[b] == count, f"anchored_children[{b}]"
    assert pool.num_reclaimable == len(published) - len(anchored), "num_reclaimable"
    assert pool.supply == pool.num_free + pool.num_reclaimable
    assert set(pool.extra) <= set(published), "extra keys of an unpublished block"
    assert pool.eviction_order() == leaf_order(pool), "eviction order"


class Driver:
    """Drives a pool as the manager does: sequences hold a chain, publish, are released."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.seqs: list[list[int]] = []
        self.clock = 0
        self.keys = itertools.count(1)

    def take(self, count: int) -> list[int] | None:
        """``count`` blocks, evicting leaves first if needed; None when supply is short."""
        pool = self.pool
        if count > pool.supply:
            return None
        short = count - pool.num_free
        if short > 0:
            self.evict(short)
        return pool.allocate(count)

    def evict(self, count: int) -> list[int]:
        pool = self.pool
        expected: list[int] = []
        for _ in range(count):  # the reference: the next leaf, the victims taken out
            order = leaf_order(pool, expected)
            if not order:
                break
            expected.append(order[0])
        victims = pool.pop_leaves(count)
        assert victims == expected, "eviction order (the climb included)"
        assert all(pool.depth[b] for b in victims), "a victim unpublished before forget"
        pool.forget(victims)
        pool.maybe_compact()
        return victims

    def admit(self, hit: int, new: int, publish: int, how: str, twin: int | None) -> None:
        """A sequence: pin the chain up to cached block ``hit`` (or none), take ``new``
        blocks, publish the first ``publish`` of them (``how``: one at a time, ``run`` or
        ``extra``) under the chain or, with no chain, under the published block ``twin``
        (an index into the published blocks once the new ones are taken), which it does not
        hold (a private duplicate's next block goes under its canonical twin)."""
        pool = self.pool
        chain: list[int] = []
        b = hit
        while b != NO_PARENT:
            chain.append(b)
            b = pool.parent[b]
        chain.reverse()
        # The manager's admission check: pinning the unanchored part of the chain takes
        # it out of the supply.
        unanchored = sum(1 for b in chain if not pool.ref[b] and not pool.anchored_children[b])
        if new > pool.supply - unanchored:
            return
        if chain:
            pool.pin(chain)
        fresh = self.take(new)
        assert fresh is not None, "the supply promised blocks eviction cannot deliver"
        parent = chain[-1] if chain else NO_PARENT
        if twin is not None and not chain:
            # a cached twin if there is one (unheld: the case anchoring is for)
            published = [b for b in range(pool.num_blocks) if pool.depth[b]]
            cached = [b for b in published if not pool.ref[b]]
            if cached or published:
                parent = (cached or published)[twin % len(cached or published)]
        self.publish(fresh[:publish], parent, how)
        self.seqs.append(chain + fresh)

    def publish(self, run: list[int], parent: int, how: str) -> None:
        if not run:
            return
        pool = self.pool
        depth = pool.depth[parent] + 1 if parent >= 0 else 1
        keys = [next(self.keys) for _ in run]
        tokens = [_tokens(k, k) for k in keys]
        if how == "run" and not pool.wire_hashes:
            pool.publish_run(run, b"".join(tokens), NS, parent, keys, depth, keys)
            return
        for b, key, toks in zip(run, keys, tokens, strict=True):
            if how == "extra":
                pool.publish(b, toks, NS, ((0, b"img"),), parent, key, key, depth, key)
            else:
                pool.publish_plain(b, toks, NS, parent, key, depth, key)
            parent, depth = b, depth + 1

    def free(self, i: int) -> None:
        self.clock += 1
        self.pool.release(self.seqs.pop(i), self.clock)

    def reset(self) -> None:
        for seq in self.seqs:
            self.pool.release(seq, self.clock)
        self.seqs.clear()
        self.pool.clear([b for b in range(self.pool.num_blocks) if self.pool.depth[b]])


@settings(max_examples=100, deadline=None)
@given(
    num_blocks=st.integers(1, 12),
    wire_hashes=st.booleans(),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "free", "admit", "free", "evict", "admit", "free", "reset"]),
            # where a sequence's new blocks go: a new root, after a cached chain it pins,
            # or under a published block it does not hold (a private duplicate's twin)
            st.sampled_from(["root", "chain", "twin"]),
            st.integers(0, 1_000),
            st.integers(1, 4),
            st.integers(1, 4),
            st.sampled_from(["one", "run", "extra"]),
        ),
        min_size=8,
        max_size=40,
    ),
)
def test_every_invariant_holds_after_every_method(
    num_blocks: int, wire_hashes: bool, steps: list[tuple[str, str, int, int, int, str]]
) -> None:
    pool = BlockPool(num_blocks, BS, wire_hashes=wire_hashes, heap_slack=-num_blocks)
    driver = Driver(pool)
    assert_consistent(pool)
    for op, mode, pick, new, publish, how in steps:
        if op == "admit":
            cached = [b for b in range(num_blocks) if pool.depth[b] and not pool.ref[b]]
            hit = cached[pick % len(cached)] if cached and mode == "chain" else NO_PARENT
            twin = pick if mode == "twin" else None
            driver.admit(hit, new, min(publish, new), how, twin)
        elif op == "free" and driver.seqs:
            driver.free(pick % len(driver.seqs))
        elif op == "evict":
            driver.evict(new)
        elif op == "reset":
            driver.reset()
        assert_consistent(pool)


def _columns(pool: BlockPool) -> dict[str, object]:
    return {name: getattr(pool, name) for name in BlockPool.__slots__ if name != "_leaves"}


@pytest.mark.parametrize("run", [[0, 1, 2, 3], [3, 1, 0, 2], [1]])
def test_a_run_is_published_as_its_blocks_one_at_a_time(run: list[int]) -> None:
    """``publish_run`` (the slices of a consecutive run, or one store per block) leaves the
    pool exactly as ``publish_plain`` of each block in turn."""
    pools = [BlockPool(6, BS, wire_hashes=False) for _ in range(2)]
    for pool in pools:
        assert pool.allocate(5) == [0, 1, 2, 3, 4]
        pool.publish_plain(4, _tokens(7, 7), NS, NO_PARENT, 99, 1, 99)
    keys = [10 + i for i in range(len(run))]
    raw = b"".join(_tokens(k, k) for k in keys)
    pools[0].publish_run(run, raw, NS, 4, keys, 2, keys)
    parent = 4
    for depth, (b, key) in enumerate(zip(run, keys, strict=True), start=2):
        pools[1].publish_plain(b, _tokens(key, key), NS, parent, key, depth, key)
        parent = b
    assert _columns(pools[0]) == _columns(pools[1])
    for pool in pools:
        assert_consistent(pool)


def test_the_free_queue_is_fifo_fresh_ids_first() -> None:
    pool = BlockPool(4, BS)
    assert pool.free_queue() == (0, 1, 2, 3) and pool.num_free == 4
    a = pool.allocate(3)
    pool.release([a[2], a[0]], clock=1)  # the tail first: a[0] goes to the queue first
    assert pool.free_queue() == (3, 0, 2)
    assert pool.allocate(1) == [3] and pool.allocate(2) == [0, 2]
    assert [pool.ref[b] for b in range(4)] == [1, 1, 1, 1]
    assert_consistent(pool)


def test_identity_is_compared_exactly() -> None:
    pool = BlockPool(3, BS)
    root, child, _ = pool.allocate(3)
    pool.publish(root, _tokens(1, 2), NS, (), NO_PARENT, 5, 50, 1, 1)
    pool.publish(child, _tokens(3, 4), NS, ((0, b"img"),), root, 6, 60, 2, 2)
    assert pool.has_identity(child, _tokens(3, 4), root, NS, ((0, b"img"),))
    assert not pool.has_identity(child, _tokens(3, 4), root, NS, ())  # extra keys differ
    assert not pool.has_identity(child, _tokens(3, 5), root, NS, ((0, b"img"),))
    assert not pool.has_identity(child, _tokens(3, 4), NO_PARENT, NS, ((0, b"img"),))
    assert not pool.has_identity(root, _tokens(1, 2), NO_PARENT, b"other", ())
    assert pool.token_ids(child) == (3, 4) and pool.event_hash[child] == 60


def test_a_generation_moves_on_when_a_block_is_evicted() -> None:
    pool = BlockPool(2, BS)
    (b,) = pool.allocate(1)
    pool.publish(b, _tokens(1, 1), NS, ((0, b"x"),), NO_PARENT, 1, 1, 1, 1)
    pool.release([b], clock=1)
    gen = pool.gen[b]
    victims = pool.pop_leaves(1)
    assert victims == [b]
    pool.forget(victims)
    assert pool.gen[b] != gen and not pool.is_published(b) and b not in pool.extra
    assert pool.free_queue() == (1, b)
    assert_consistent(pool)


def test_a_child_published_under_an_unheld_twin_anchors_it() -> None:
    """A private duplicate's next block is published under the canonical twin, which the
    sequence does not hold: the twin must count as anchored (not reclaimable)."""
    pool = BlockPool(3, BS)
    (twin,) = pool.allocate(1)
    pool.publish_plain(twin, _tokens(1, 1), NS, NO_PARENT, 1, 1, 1)
    pool.release([twin], clock=1)
    assert pool.num_reclaimable == 1 and pool.supply == 3
    dup, child = pool.allocate(2)
    pool.publish_plain(child, _tokens(2, 2), NS, twin, 2, 2, 2)
    assert pool.anchored_children[twin] == 1 and pool.num_reclaimable == 0
    assert pool.eviction_order() == []  # the twin has a published child: not a leaf
    assert_consistent(pool)
    pool.release([dup, child], clock=2)
    assert pool.num_reclaimable == 2 and pool.eviction_order() == [child]
    assert_consistent(pool)


def test_drop_child_counts_a_child_out() -> None:
    pool = BlockPool(3, BS)
    a, b, c = pool.allocate(3)
    pool.publish_plain(a, _tokens(1, 1), NS, NO_PARENT, 1, 1, 1)
    pool.publish_plain(b, _tokens(2, 2), NS, a, 2, 2, 2)
    pool.publish_plain(c, _tokens(3, 3), NS, a, 3, 2, 3)
    assert pool.num_children[a] == 2
    assert pool.drop_child(a) == 1 and pool.num_children[a] == 1
    assert pool.drop_child(a) == 0 and pool.num_children[a] == 0
