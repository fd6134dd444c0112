"""The publication fast paths of the impl (one block; a run of prompt blocks).

``_publish`` hands the plain case (keyed index, no events, no spans) to ``_publish_one`` (a
decode step completing its block) or ``_publish_run`` (a prefill's new prompt blocks). Each
must be invisible: the spec's state after every call, and on anything it does not finish (a
twin, a colliding key, a private parent) nothing changed before the general loop takes
over. These tests pin each branch; the differential machines check the rest at random,
here also with the keyed index shrunk to one bit, so that nearly every key collides.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import prefixkv.impl as impl_package
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from prefixkv.impl import PrefixCacheManager
from prefixkv.impl import _keys as keys_module
from prefixkv.impl._index import HashIndex
from prefixkv.impl._publication import Publisher
from prefixkv.spec import Namespace, Request, SpecCache

from prefixkv.conformance.machines import build_machine
from prefixkv.conformance.machines.factories import spec_vs_impl

NS = Namespace("m")


class Calls:
    """Counts what each fast path returned (True: it published; False: it handed over)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.one: list[bool] = []
        self.run: list[bool] = []
        one, run = Publisher._publish_one, Publisher._publish_run

        def counted_one(publisher: Publisher, *args: Any) -> bool:
            self.one.append(one(publisher, *args))
            return self.one[-1]

        def counted_run(publisher: Publisher, *args: Any) -> bool:
            self.run.append(run(publisher, *args))
            return self.run[-1]

        monkeypatch.setattr(Publisher, "_publish_one", counted_one)
        monkeypatch.setattr(Publisher, "_publish_run", counted_run)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


class Pair:
    """The spec and the impl, driven with the same calls and compared after each."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.caches: tuple[Any, Any] = (
            SpecCache(num_blocks, block_size),
            PrefixCacheManager(num_blocks, block_size),
        )

    def __getattr__(self, name: str) -> Any:
        def both(*args: Any, **kwargs: Any) -> Any:
            spec, impl = (getattr(c, name)(*args, **kwargs) for c in self.caches)
            assert impl == spec, name
            assert self.caches[1].snapshot() == self.caches[0].snapshot(), name
            return spec

        return both

    @property
    def impl(self) -> PrefixCacheManager:
        return self.caches[1]  # type: ignore[no-any-return]


def _prefill(pair: Pair, seq_id: int, prompt: list[int], first_token: int = 9) -> Any:
    adm = pair.admit(Request(seq_id, prompt, NS))
    pair.commit(seq_id, adm.num_scheduled_tokens, [first_token])
    return adm


def _decode(pair: Pair, seq_id: int, tokens: list[int]) -> None:
    for t in tokens:
        pair.append(seq_id, 1)
        pair.commit(seq_id, 1, [t])


def test_prefill_run_and_decode_block_take_the_fast_paths(calls: Calls) -> None:
    pair = Pair(64, 4)
    _prefill(pair, 1, list(range(13)))  # 3 full prompt blocks: one run
    assert calls.run == [True] and calls.one == []
    _decode(pair, 1, [20, 21, 22])  # completes block 3: one block
    assert calls.one == [True]
    assert pair.impl.stats().num_published_blocks == 4
    pair.free([1])
    # Every published block is reclaimable again, so a prompt needing the whole pool fits:
    # the run's anchoring was undone exactly.
    assert pair.can_admit(Request(2, list(range(500, 756)), NS))
    assert not pair.can_admit(Request(2, list(range(500, 757)), NS))


def test_runs_of_scattered_and_consecutive_ids_agree_with_the_spec(calls: Calls) -> None:
    # A pool of 4: a sequence that never commits is freed, so its blocks come back tail
    # first (3, 2, 1, 0); the next prompt's run is published over ids 3, 2, 1.
    pair = Pair(4, 4)
    pair.admit(Request(1, list(range(16)), NS))
    pair.free([1])
    adm = _prefill(pair, 2, list(range(50, 63)))
    assert list(adm.block_ids[:3]) == [3, 2, 1]
    pair.free([2])
    _prefill(pair, 3, [*range(50, 63), 9, 9, 9])  # a hit on 3 blocks, then one more
    assert calls.run == [True]
    assert calls.one == [True]


def test_a_one_block_prefill_takes_the_one_block_path(calls: Calls) -> None:
    pair = Pair(64, 4)
    _prefill(pair, 1, [5, 6, 7, 8, 9])
    assert calls.one == [True] and calls.run == []


def test_a_hit_publishes_the_rest_of_the_prompt_under_the_hit(calls: Calls) -> None:
    pair = Pair(64, 4)
    _prefill(pair, 1, list(range(9)))
    adm = _prefill(pair, 2, list(range(8)) + list(range(50, 59)))
    assert adm.num_cached_tokens == 8
    assert calls.run == [True, True]  # blocks 2..3 of seq 2, under seq 1's block 1


def test_a_twin_hands_the_run_over_unchanged(calls: Calls) -> None:
    # Both sequences are admitted before either commits: the second's blocks are twins of
    # the first's and stay private (choice 2); its next block publishes under the twin.
    pair = Pair(64, 4)
    prompt = list(range(12))
    for seq_id in (1, 2):
        pair.admit(Request(seq_id, prompt, NS))
    pair.commit(1, 12, [9])
    pair.commit(2, 12, [9])
    assert calls.run == [True, False]
    _decode(pair, 2, [1, 2, 3, 4])  # block 3 of seq 2: parent private, its twin is canonical
    assert calls.one == [False]
    _decode(pair, 1, [1, 2, 3, 4])  # the same identity, published already by seq 2
    assert calls.one == [False, False]


def test_a_run_after_eviction_takes_back_the_remembered_serials(calls: Calls) -> None:
    # A chain is evicted, its first two blocks are published again by a run, and a prompt
    # along the whole chain must count its last two blocks as lost to eviction: the record
    # finds them under the serials the run took back (fresh ones would say "never cached").
    pair = Pair(16, 4)
    chain = list(range(16))
    _prefill(pair, 1, chain)
    pair.free([1])
    pair.evict(16)
    _prefill(pair, 2, [*chain[:8], 7])  # blocks 0..1 again, by a run
    assert calls.run == [True, True]
    lost = pair.match(Request(3, [*chain, 1], NS)).lost
    assert lost.evicted == 8
    pair.free([2])
    pair.evict(16)
    _prefill(pair, 3, [*chain[:12], 7])  # blocks 0..2, all remembered, by a run
    assert pair.match(Request(4, [*chain, 1], NS)).lost.evicted == 4


def test_decode_blocks_after_eviction_take_back_remembered_serials(calls: Calls) -> None:
    # As above, block by block: a one-block prefill and decode steps publish an evicted
    # chain's first blocks again, and the rest of the chain must still count as evicted.
    pair = Pair(16, 2)
    _prefill(pair, 1, [1, 2, 3])  # block 0
    _decode(pair, 1, [4, 5, 6, 7, 8])  # blocks 1..3: [3, 9] [4, 5] [6, 7]
    pair.free([1])
    pair.evict(16)
    chain = [1, 2, 3, 9, 4, 5, 6, 7]
    _prefill(pair, 2, [1, 2, 3])  # block 0 again
    _decode(pair, 2, [4])  # block 1 again
    assert calls.one == [True] * 6
    assert pair.match(Request(3, [*chain, 1], NS)).lost.evicted == 4
    _decode(pair, 2, [5, 6])  # block 2 again
    assert pair.match(Request(3, [*chain, 1], NS)).lost.evicted == 2


def test_file_new_changes_nothing_unless_every_key_is_new() -> None:
    index = HashIndex()
    index.insert(7, 70)
    before = index.entries()
    assert not index.file_new([1, 7, 2], [10, 11, 12])  # 7 is filed
    assert index.entries() == before
    assert not index.file_new([1, 2, 1], [10, 11, 12])  # 1 twice in the run
    assert index.entries() == before
    assert index.file_new([1, 2, 3], [10, 11, 12])
    assert sorted(index.entries()) == [(1, 10), (2, 11), (3, 12), (7, 70)]


def test_claim_files_only_a_new_key() -> None:
    index = HashIndex()
    b = 1000 + 1  # an int object of its own
    assert index.claim(5, b) is b
    assert index.entries() == [(5, 1001)]
    other = 2000 + 2
    assert index.claim(5, other) == 1001
    assert index.entries() == [(5, 1001)]


CollidingKeys = build_machine(
    "SpecVsImplCollidingKeys",
    spec_vs_impl(),
    num_blocks=(4, 16),
    block_sizes=(1, 3),
    record_events=(False,),
)


@pytest.mark.parametrize("mask", [0, 1])
def test_machines_with_colliding_keyed_keys(mask: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyed index shrunk to ``mask``: every run and every block meets filed keys, and
    runs meet their own keys twice. The impl must still be the spec, step for step."""
    # The mask is read where keys are computed, and nowhere else (another reader would keep
    # the full mask and hide the collisions).
    readers = {
        module.name
        for module in pkgutil.iter_modules(impl_package.__path__)
        if hasattr(importlib.import_module(f"prefixkv.impl.{module.name}"), "KEY_MASK")
    }
    assert readers == {"_keys"}
    monkeypatch.setattr(keys_module, "KEY_MASK", mask)
    run_state_machine_as_test(
        CollidingKeys,
        settings=settings(
            max_examples=max(10, settings().max_examples // 4),
            stateful_step_count=60,
            deadline=None,
        ),
    )
