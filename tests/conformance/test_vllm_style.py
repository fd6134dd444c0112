"""The vLLM-v1-style example manager: its own API first, then the conformance kit.

The kit part shows that the correct manager passes under its declared capabilities (also
with a 3-bit hash, because it then verifies every hit) and that each classic bug of
:data:`examples.vllm_style.BUGS`, and the weak hash trusted, is caught by the check named
here.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit_runs import first_failure, passes, shortest_failure

from examples.vllm_style import (
    BUGS,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    Request,
    weak_block_hash,
)
from examples.vllm_style_adapter import (
    BUG_FACTORIES,
    CAPABILITIES,
    make_manager,
    make_verified_weak_hash,
)

BS = 2


def _ids(blocks: Any) -> list[int]:
    return [b.block_id for b in blocks]


def _admit(m: KVCacheManager, rid: Any, tokens: list[int], budget: int | None = None) -> Request:
    r = Request(rid, tokens)
    hits, cached = m.get_computed_blocks(r)
    todo = len(tokens) - cached if budget is None else budget
    assert m.allocate_slots(r, todo, hits) is not None
    return r


# -- the manager's own API -------------------------------------------------------------------


def test_free_queue_is_doubly_linked_with_o1_remove() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert _ids(q) == [0, 1, 3] and q.num_free_blocks == 3
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert _ids(q) == [1, 3, 2]
    with pytest.raises(ValueError):
        q.remove(blocks[0])  # not in the queue
    for _ in range(3):
        q.popleft()
    with pytest.raises(ValueError):
        q.popleft()


def test_the_block_hash_is_chained_and_salted() -> None:
    m = KVCacheManager(8, BS)
    a, b, c = Request("a", [1, 2, 3, 4]), Request("b", [9, 9, 3, 4]), Request("c", [1, 2], b"x")
    for r in (a, b, c):
        m.hash_request_blocks(r)
    assert a.block_hashes[1] != b.block_hashes[1]  # same tokens, other prefix
    assert a.block_hashes[0] != c.block_hashes[0]  # same tokens, other salt


def test_blocks_are_published_at_schedule_time() -> None:
    m = KVCacheManager(8, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5])
    assert a.num_computed_tokens == 0  # nothing computed yet, but the blocks are findable
    hits, cached = m.get_computed_blocks(Request("b", [1, 2, 3, 4, 6]))
    assert _ids(hits) == m.get_block_ids("a")[:2] and cached == 4


def test_a_writer_freed_before_computing_unpublishes_its_blocks() -> None:
    m = KVCacheManager(8, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5])
    table = m.get_block_ids("a")
    m.record_forward(a, 2)  # block 0 written, block 1 not
    m.free(a)
    hits, _ = m.get_computed_blocks(Request("b", [1, 2, 3, 4, 6]))
    assert _ids(hits) == table[:1]


def test_a_rollback_unpublishes_blocks_no_longer_scheduled() -> None:
    m = KVCacheManager(8, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5])
    m.free_tail_slots(a, 3)  # keeps 2 slots: block 1 is gone, block 0 stays published
    assert len(m.get_computed_blocks(Request("b", [1, 2, 3, 4, 6]))[0]) == 1
    with pytest.raises(ValueError):
        m.free_tail_slots(a, 3)


def test_a_rollback_may_not_cut_a_cached_block_that_another_request_read() -> None:
    m = KVCacheManager(8, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5])
    _admit(m, "b", [1, 2, 3, 4, 6])  # the same step: b reads a's blocks 0 and 1
    with pytest.raises(ValueError, match="other requests read"):
        m.free_tail_slots(a, 2)  # would leave a's block 1 half scheduled
    assert m.num_scheduled_tokens["a"] == 5
    m.free_tail_slots(a, 1)  # the partial tail block is a's own


def test_several_blocks_per_hash() -> None:
    m = KVCacheManager(8, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5], budget=2)  # first chunk: block 0 only
    _admit(m, "b", [1, 2, 3, 4, 5])  # hits a's block 0, publishes its own block 1
    m.allocate_slots(a, 3)  # a's block 1 is full now: a second block under that hash
    (h,) = {a.block_hashes[1]}
    assert sorted(m.block_pool.cached_block_hash_to_block[h]) == sorted(
        [m.get_block_ids("a")[1], m.get_block_ids("b")[1]]
    )


def test_freed_tail_first_and_cached_blocks_evicted_from_the_queue_head() -> None:
    m = KVCacheManager(4, BS)
    a = _admit(m, "a", [1, 2, 3, 4, 5])
    m.record_forward(a, 5)
    table = m.get_block_ids("a")
    m.free(a)
    assert _ids(m.block_pool.free_block_queue) == [3, *reversed(table)]
    _admit(m, "b", [7, 7, 7])  # takes free block 3, then the head: a's tail (not cached)
    _admit(m, "c", [8, 8, 8])  # two more from the head: a's block 1, then block 0
    assert m.block_pool.num_evictions == 2
    assert not set(a.block_hashes) & set(m.block_pool.cached_block_hash_to_block)


def test_a_cancelled_writer_leaves_the_blocks_chained_to_its_own_unreachable() -> None:
    m = KVCacheManager(8, BS)
    w = _admit(m, "w", [1, 2, 3, 4, 5])  # publishes w0 [1 2], w1 [3 4] at schedule time
    _admit(m, "r", [1, 2, 3, 4, 5, 6, 7])  # same step: hits w0 w1, publishes r2 [5 6]
    r2 = m.req_to_blocks["r"][2]
    m.free(w)  # w never ran: w0 and w1 leave the index, r2 stays in it
    assert r2.block_hash is not None and r2.parent_block_hash not in (
        m.block_pool.cached_block_hash_to_block
    )
    # the chain is broken at block 0: r2 is unreachable, which is harmless
    assert m.get_computed_blocks(Request("x", [1, 2, 3, 4, 5, 6, 7]))[0] == []


def test_verification_turns_a_weak_hash_collision_into_a_miss() -> None:
    trusting = KVCacheManager(16, BS, hash_fn=weak_block_hash)
    verifying = KVCacheManager(16, BS, hash_fn=weak_block_hash, verify_hits=True)
    wrong = 0
    for m in (trusting, verifying):
        for i in range(8):
            _admit(m, i, [i, i, 0])
        hits, _ = m.get_computed_blocks(Request("q", [99, 99, 0]))
        wrong += m is verifying and len(hits)
        if m is trusting:
            assert hits  # 8 blocks under a 3-bit hash: [99, 99] collides with one of them
    assert wrong == 0


def test_reset_prefix_cache_is_refused_while_blocks_are_in_use() -> None:
    m = KVCacheManager(4, BS)
    a = _admit(m, "a", [1, 2, 3])
    assert not m.reset_prefix_cache()
    m.free(a)
    b = _admit(m, "b", [1, 2, 3])
    m.record_forward(b, 3)
    m.free(b)
    assert m.block_pool.cached_block_hash_to_block
    assert m.reset_prefix_cache() and not m.block_pool.cached_block_hash_to_block


# -- the conformance kit ---------------------------------------------------------------------


#: bug -> the checks that may catch it first. A capacity check that is too generous is a
#: room query that promised more blocks than the snapshot can supply (CAN-ADMIT,
#: CAN-APPEND), named before the manager's own allocation guard trips.
EXPECTED = {
    "stale_hash_after_reuse": {"INV-INDEX"},
    # published under no parent: the block's identity is not its writer's prefix, caught
    # at publication (INV-PUBLISH's parent part, at schedule time) or at a wrong hit
    "unchained_hash": {"INV-PUBLISH", "INV-MATCH"},
    "evictable_hits_not_counted": {"CAN-ADMIT"},
    "one_token_capacity_check": {"CAN-APPEND"},
    "cancelled_writer_still_findable": {"INV-PUBLISH"},
    "hit_not_touched": {"INV-REF"},
    "weak_hash_trusted": {"INV-MATCH"},
}


def test_every_bug_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(BUG_FACTORIES) == {*BUGS, "weak_hash_trusted"}


@pytest.mark.parametrize("factory", [make_manager, make_verified_weak_hash])
def test_the_correct_manager_passes_the_kit(factory: Any) -> None:
    assert factory.capabilities == CAPABILITIES
    passes(factory, examples=500 if factory is make_manager else 200)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_bug_is_caught(bug: str) -> None:
    """Found without shrinking: a failing run is mostly shrinking, and the shortest
    replays are in docs/conformance.md (measured with it)."""
    failure = first_failure(BUG_FACTORIES[bug])
    assert failure.check in EXPECTED[bug], str(failure)


def test_a_bug_shrinks_to_a_short_replay() -> None:
    failure = shortest_failure(BUG_FACTORIES["cancelled_writer_still_findable"])
    assert failure.check in EXPECTED["cancelled_writer_still_findable"] and failure.steps <= 3, (
        failure.format()
    )
