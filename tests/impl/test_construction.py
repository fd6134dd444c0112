"""Constructor edges: sizes past what can be allocated, a hasher that is no function,
``record_events`` that is no bool. Each is ``InvalidConfig`` at construction, from the spec
and the impl alike (the bounds are the contract's: :func:`prefixkv.spec.contract.
check_pool_shape`), before anything is allocated.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.impl import cache as impl_cache
from prefixkv.impl._leaves import COMPACT_SLACK, LeafHeap
from prefixkv.impl._pool import BlockPool
from prefixkv.spec import HybridSpecCache, Namespace, PrefixCacheError, Request, SpecCache
from prefixkv.spec.contract import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, MAX_STATE_SLOTS

from prefixkv.errors import InvalidConfig

CACHES = [SpecCache, PrefixCacheManager]

#: (num_blocks, block_size, what the message names)
TOO_BIG = [
    (2**70, 4, "num_blocks"),
    (MAX_NUM_BLOCKS + 1, 4, "num_blocks"),
    (4, 2**40, "block_size"),
    (4, MAX_BLOCK_SIZE + 1, "block_size"),
]


def _refused(make: Any, what: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        make()
    assert not isinstance(err.value, PrefixCacheError)  # a bad setup, not a bad request
    assert what in str(err.value)


@pytest.mark.parametrize("cls", CACHES)
@pytest.mark.parametrize(("num_blocks", "block_size", "what"), TOO_BIG)
def test_sizes_past_the_bounds(cls: type, num_blocks: int, block_size: int, what: str) -> None:
    _refused(lambda: cls(num_blocks, block_size), what)


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridPrefixCacheManager])
def test_state_slots_past_the_bound(cls: type) -> None:
    _refused(lambda: cls(8, 2, max_num_seqs=2**70, state_budget=0), "max_num_seqs")
    _refused(lambda: cls(8, 2, max_num_seqs=1, state_budget=MAX_STATE_SLOTS), "state_budget")


def test_a_pool_past_this_hosts_memory_is_refused_before_it_is_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the bounds, but more than the host has: refused by its size (allocating it
    would be killed by the kernel on an overcommitting host, not raise)."""
    _refused(lambda: PrefixCacheManager(MAX_NUM_BLOCKS, MAX_BLOCK_SIZE), "more than this host")
    monkeypatch.setattr(impl_cache, "host_memory", lambda: 1 << 20)
    _refused(lambda: PrefixCacheManager(1 << 16, 16), "65536 blocks")
    PrefixCacheManager(64, 16)  # 64 blocks fit in 1 MiB


def test_a_failed_allocation_is_invalid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMemory(BlockPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise MemoryError

    monkeypatch.setattr(impl_cache, "host_memory", lambda: None)
    monkeypatch.setattr(impl_cache, "BlockPool", NoMemory)
    _refused(lambda: PrefixCacheManager(8, 4), "more than this host can allocate")


@pytest.mark.parametrize("wire_hashes", [False, True])
@pytest.mark.parametrize(("num_blocks", "block_size"), [(1, 1), (37, 16), (256, 3)])
def test_pool_nbytes_is_what_the_pool_allocates(
    num_blocks: int, block_size: int, wire_hashes: bool
) -> None:
    """``BlockPool.nbytes`` (what the host-memory check asks for) against the buffers a
    built pool holds, one per block attribute."""
    pool = BlockPool(num_blocks, block_size, wire_hashes=wire_hashes)
    held = 0
    heap = pool._leaves  # the eviction order keeps its own column, the leaf versions
    parts: list[tuple[object, str]] = [(pool, name) for name in BlockPool.__slots__]
    parts += [(heap, name) for name in LeafHeap.__slots__]
    for owner, name in parts:
        value = getattr(owner, name, None)
        if isinstance(value, (bytes, bytearray)):
            held += len(value)
        elif isinstance(value, array):
            held += value.itemsize * len(value)
        elif isinstance(value, list) and len(value) == num_blocks:
            held += 8 * len(value)  # one pointer per block
    assert held == BlockPool.nbytes(num_blocks, block_size, wire_hashes=wire_hashes)


@pytest.mark.parametrize("cls", [*CACHES, HybridSpecCache, HybridPrefixCacheManager])
@pytest.mark.parametrize("hasher", [None, 3, "fast", b"x"])
def test_hasher_must_be_a_function(cls: type, hasher: object) -> None:
    kwargs: dict[str, Any] = {"hasher": hasher}
    if cls in (HybridSpecCache, HybridPrefixCacheManager):
        kwargs.update(max_num_seqs=2, state_budget=1)
    _refused(lambda: cls(8, 2, **kwargs), "hasher")


@pytest.mark.parametrize("cls", [*CACHES, HybridSpecCache, HybridPrefixCacheManager])
@pytest.mark.parametrize("record_events", ["no", "", 0, 1, None])
def test_record_events_must_be_a_bool(cls: type, record_events: object) -> None:
    kwargs: dict[str, Any] = {"record_events": record_events}
    if cls in (HybridSpecCache, HybridPrefixCacheManager):
        kwargs.update(max_num_seqs=2, state_budget=1)
    _refused(lambda: cls(8, 2, **kwargs), "record_events")


@pytest.mark.parametrize("cls", CACHES)
def test_valid_options_still_build(cls: type) -> None:
    from prefixkv.spec.hashing import weak_hash

    cache = cls(8, 2, hasher=weak_hash, record_events=True)
    cache.admit(Request(1, (1, 2, 3), Namespace("m")))
    assert cache.record_events is True


@pytest.mark.parametrize("slack", [None, 1.5, True, "8", -9])
def test_heap_slack_must_be_an_int_of_at_least_minus_num_blocks(slack: object) -> None:
    _refused(lambda: PrefixCacheManager(8, 2, heap_slack=slack), "heap_slack")  # type: ignore[arg-type]


def test_heap_slack_is_the_eviction_heaps() -> None:
    assert PrefixCacheManager(8, 2, heap_slack=-8)._pool._leaves.slack == -8
    assert PrefixCacheManager(8, 2)._pool._leaves.slack == COMPACT_SLACK
