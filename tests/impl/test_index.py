"""The hashed index on its own: buckets of one block or a list after a collision, exact finds.

A key is only a way to find candidates: ``find`` returns a block only when the pool's stored
identity is exactly the one asked for, whatever else shares its bucket. The batch operations
(``file_new``, ``remove_all``) must leave the index exactly as the one-at-a-time ones would,
or unchanged when they refuse. Checked here against a plain model: key -> list of blocks.
"""

from __future__ import annotations

import copy
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefixkv.impl._index import HashIndex
from prefixkv.impl._pool import NO_PARENT, BlockPool

NS = b"ns"


def _tokens(*ids: int) -> bytes:
    return array("I", ids).tobytes()


def _model(index: HashIndex) -> dict[int, list[int]]:
    model: dict[int, list[int]] = {}
    for key, b in index.entries():
        model.setdefault(key, []).append(b)
    return model


def _published(num_blocks: int) -> BlockPool:
    """A pool whose block ``b`` is a root with token ids ``(b, b)``."""
    pool = BlockPool(num_blocks, 2)
    for b in pool.allocate(num_blocks):
        pool.publish_plain(b, _tokens(b, b), NS, NO_PARENT, b, 1, b)
    return pool


def test_find_returns_only_the_exact_identity_in_a_shared_bucket() -> None:
    pool = _published(4)
    index = HashIndex()
    for b in (0, 1, 2):
        index.insert(7, b)  # three identities under one (colliding) key
    assert index.largest_bucket() == 3
    for b in (0, 1, 2):
        assert index.find(pool, 7, NO_PARENT, _tokens(b, b), NS, ()) == b
    assert index.find(pool, 7, NO_PARENT, _tokens(3, 3), NS, ()) == -1  # not filed there
    assert index.find(pool, 7, NO_PARENT, _tokens(1, 1), b"other", ()) == -1
    assert index.find(pool, 7, 0, _tokens(1, 1), NS, ()) == -1  # another parent
    assert index.find(pool, 8, NO_PARENT, _tokens(1, 1), NS, ()) == -1  # another key


def test_removing_from_a_bucket_keeps_the_others() -> None:
    pool = _published(3)
    index = HashIndex()
    for b in (0, 1, 2):
        index.insert(7, b)
    index.remove(7, 1)
    assert _model(index) == {7: [0, 2]}
    assert index.find(pool, 7, NO_PARENT, _tokens(2, 2), NS, ()) == 2
    index.remove(7, 0)
    assert index.get_one(7) == 2  # one block left: the bucket is the id again
    index.remove(7, 2)
    assert index.get_one(7) is None and len(index.blocks()) == 0


def test_claim_files_a_new_block_and_hands_back_a_filed_one() -> None:
    index = HashIndex()
    b = 12345  # an int not cached by the interpreter: identity is what claim promises
    assert index.claim(3, b) is b
    other = 54321
    assert index.claim(3, other) == b and _model(index) == {3: [b]}


def test_file_new_files_all_or_nothing() -> None:
    index = HashIndex()
    assert index.file_new([1, 2], [10, 20])
    assert _model(index) == {1: [10], 2: [20]}
    assert not index.file_new([3, 2], [30, 40])  # 2 is filed: nothing changes
    assert _model(index) == {1: [10], 2: [20]}
    assert not index.file_new([5, 6, 5], [50, 60, 70])  # a key twice in the run
    assert _model(index) == {1: [10], 2: [20]}
    assert index.none_filed([3, 4]) and not index.none_filed([4, 1])


def test_a_deep_copy_is_independent() -> None:
    index = HashIndex()
    index.insert(1, 10)
    index.insert(2, 20)
    index.insert(2, 21)
    twin = copy.deepcopy(index)
    twin.insert(3, 30)
    assert twin.claim(4, 40) == 40
    twin.remove(2, 20)
    assert _model(index) == {1: [10], 2: [20, 21]}
    assert index.get_one(3) is None and index.get_one(4) is None
    assert _model(twin) == {1: [10], 2: [21], 3: [30], 4: [40]}


def test_clear_empties_the_index() -> None:
    index = HashIndex()
    index.insert(1, 1)
    index.insert(1, 2)
    index.clear()
    assert index.entries() == [] and index.largest_bucket() == 0 and index.get_one(1) is None


_OPS = st.lists(
    st.tuples(st.sampled_from(["insert", "file_new", "remove", "remove_all"]), st.integers()),
    max_size=40,
)


@pytest.mark.parametrize("num_keys", [2, 40])  # many collisions, and few
@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_batches_match_one_at_a_time(num_keys: int, ops: list[tuple[str, int]]) -> None:
    """Against a model (key -> blocks in filing order): every operation, batches included,
    leaves the same buckets as inserting or removing one block at a time."""
    index = HashIndex()
    model: dict[int, list[int]] = {}
    filed: list[tuple[int, int]] = []  # (key, block), the blocks filed, in filing order
    next_block = 0
    for op, seed in ops:
        if op == "insert":
            key = seed % num_keys
            index.insert(key, next_block)
            model.setdefault(key, []).append(next_block)
            filed.append((key, next_block))
            next_block += 1
        elif op == "file_new":
            keys = [(seed + i * 7) % num_keys for i in range(seed % 3 + 1)]
            blocks = list(range(next_block, next_block + len(keys)))
            fresh = len(set(keys)) == len(keys) and not set(keys) & set(model)
            assert index.file_new(keys, blocks) == fresh
            if fresh:
                for key, b in zip(keys, blocks, strict=True):
                    model[key] = [b]
                    filed.append((key, b))
                next_block += len(keys)
        elif filed:
            count = 1 if op == "remove" else seed % 3 + 1
            gone = [filed.pop((seed + i) % len(filed)) for i in range(min(count, len(filed)))]
            if op == "remove":
                index.remove(*gone[0])
            else:
                index.remove_all([k for k, _ in gone], [b for _, b in gone])
            for key, b in gone:
                model[key].remove(b)
                if not model[key]:
                    del model[key]
        assert _model(index) == model
        assert sorted(index.blocks()) == sorted(b for bs in model.values() for b in bs)
        assert index.largest_bucket() == max(map(len, model.values()), default=0)
        for key, blocks in model.items():
            one = index.get_one(key)
            assert one == (blocks[0] if len(blocks) == 1 else blocks)
