"""The default index is keyed: prompts crafted against the public hash do not share a bucket.

``fast_hash`` (the identity hash that KV events carry) is CPython's tuple hash: deterministic
and invertible, so blocks can be crafted to collide under it
(:func:`prefixkv.benchmarks.collisions.craft_colliding_blocks`). The manager files blocks in its
index under a keyed chain hash instead; these tests check that the crafted blocks collide
under the public hash, land in distinct buckets of the index, and that the identity hashes
the snapshot (and the events) carry are still the public, deterministic ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import SpecCache
from prefixkv.spec.hashing import weak_hash
from prefixkv.spec.identity import fast_hash

from prefixkv.benchmarks.collisions import largest_bucket, lookup_setup, publish

NUM_PROMPTS = 256


@pytest.fixture(scope="module")
def crafted() -> tuple[tuple[int, ...], ...]:
    return lookup_setup(True, NUM_PROMPTS, num_probes=16).prompts


def _filled(prompts: tuple[tuple[int, ...], ...], **kwargs: Any) -> PrefixCacheManager:
    cache = PrefixCacheManager(4 * NUM_PROMPTS, 16, **kwargs)
    publish(cache, prompts)
    return cache


def test_crafted_blocks_collide_under_the_public_hash(crafted: tuple[tuple[int, ...], ...]) -> None:
    # The premise: without a key, one bucket would hold them all.
    assert largest_bucket(fast_hash, crafted) == NUM_PROMPTS


def test_default_index_spreads_crafted_blocks(crafted: tuple[tuple[int, ...], ...]) -> None:
    cache = _filled(crafted)
    assert cache.stats().num_published_blocks == 16 + NUM_PROMPTS
    assert cache.largest_index_bucket() == 1


def test_an_explicit_hasher_is_the_index_key(crafted: tuple[tuple[int, ...], ...]) -> None:
    # Tests force collisions with a weak hasher: that must still reach the index.
    cache = _filled(crafted, hasher=weak_hash)
    assert cache.largest_index_bucket() > 1


@pytest.mark.parametrize("record_events", [False, True])
def test_identity_hashes_stay_public(
    crafted: tuple[tuple[int, ...], ...], record_events: bool
) -> None:
    prompts = crafted[:48]
    spec = SpecCache(4 * NUM_PROMPTS, 16, record_events=record_events)
    publish(spec, prompts)
    one = _filled(prompts, record_events=record_events)
    two = _filled(prompts, record_events=record_events)
    # Each manager keys its own index (per-manager salt) ...
    assert sorted(k for k, _ in one._index.entries()) != sorted(k for k, _ in two._index.entries())
    # ... yet the identity hashes it reports are the spec's, in snapshots and events.
    want, want_events = spec.snapshot(), spec.take_events()
    assert bool(want_events) == record_events
    for cache in (one, two):
        got = cache.snapshot()
        assert got.index == want.index
        assert [v.block_hash for v in got.blocks] == [v.block_hash for v in want.blocks]
        assert cache.take_events() == want_events
