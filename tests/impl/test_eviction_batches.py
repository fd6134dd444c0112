"""Eviction in batches: the impl evicts, unindexes and remembers exactly as the spec does.

The impl handles a single victim (the decode path in a full pool) and a batch of victims
(an admission that needs many blocks) by slightly different code: a single index removal
or one pass over the batch, a parent left childless offered back to the heap before it is
pushed, and an eviction record whose keys carry the namespace only at the root. These tests
drive both against the spec, step by step, on the cases a random walk reaches rarely:

* chains evicted whole in one call, then matched again ("evicted" in LostReuse, block by
  block, exactly as far as the spec says);
* the same token ids under two namespaces and under two parents;
* the record's bound (``num_blocks`` identities, oldest out first) and an identity evicted
  again moving to the newest end;
* collision buckets (a weak hasher) emptied by one batch;
* multimodal blocks, whose keys carry extra keys;
* the boundaries of ``evict``: zero, more than there are leaves, a bad count.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import InvalidRequest, MultimodalSpan, Namespace, Request, SpecCache
from prefixkv.spec.errors import PrefixCacheError
from prefixkv.spec.hashing import weak_hash

BS = 4
NS = Namespace("m")
OTHER = Namespace("m", adapter="lora-1")


def _pair(num_blocks: int, **kwargs: Any) -> tuple[Any, Any]:
    return (
        PrefixCacheManager(num_blocks, BS, record_events=True, **kwargs),
        SpecCache(num_blocks, BS, record_events=True, **kwargs),
    )


def _same(impl: Any, spec: Any, probes: list[Request]) -> None:
    """Everything observable agrees: the whole state, events, every probe's match."""
    assert impl.snapshot() == spec.snapshot()
    assert impl.take_events() == spec.take_events()
    for req in probes:
        assert impl.match(req) == spec.match(req), req


def _both(impl: Any, spec: Any, call: str, *args: Any) -> Any:
    got = getattr(impl, call)(*args)
    want = getattr(spec, call)(*args)
    assert got == want, (call, args)
    return got


def _prefill(impl: Any, spec: Any, seq_id: int, prompt: list[int], ns: Namespace = NS) -> None:
    adm = _both(impl, spec, "admit", Request(seq_id, prompt, ns))
    _both(impl, spec, "commit", seq_id, adm.num_scheduled_tokens, [7])


def _chain(start: int, blocks: int) -> list[int]:
    return [start + i for i in range(blocks * BS + 1)]


@pytest.mark.parametrize("batch", [1, 2, 3, 100], ids=lambda k: f"evict{k}")
def test_chains_evicted_by_any_batch_size_are_remembered_like_the_spec(batch: int) -> None:
    impl, spec = _pair(32)
    prompts = [_chain(100 * i, 5) for i in range(4)]
    for i, p in enumerate(prompts):
        _prefill(impl, spec, i, p)
        _both(impl, spec, "free", [i])
    probes = [Request(99, p, NS) for p in prompts] + [Request(98, p[:9], NS) for p in prompts]
    _same(impl, spec, probes)
    while _both(impl, spec, "evict", batch):
        _same(impl, spec, probes)
    assert impl.stats().num_published_blocks == 0
    assert all(impl.match(r).lost.evicted > 0 for r in probes)


def test_a_root_is_remembered_under_its_namespace() -> None:
    """The same token ids under another namespace were never cached, even once evicted."""
    impl, spec = _pair(16)
    prompt = _chain(0, 3)
    _prefill(impl, spec, 0, prompt, NS)
    _both(impl, spec, "free", [0])
    _both(impl, spec, "evict", 16)
    probes = [Request(9, prompt, NS), Request(9, prompt, OTHER)]
    _same(impl, spec, probes)
    assert impl.match(probes[0]).lost.evicted == 3 * BS
    assert impl.match(probes[1]).lost.evicted == 0
    # Republished under the other namespace and evicted again: both remembered, apart.
    _prefill(impl, spec, 1, prompt, OTHER)
    _both(impl, spec, "free", [1])
    _both(impl, spec, "evict", 1)
    _same(impl, spec, probes)
    _both(impl, spec, "evict", 16)
    _same(impl, spec, probes)
    assert impl.match(probes[1]).lost.evicted == 3 * BS


def test_a_child_is_remembered_under_its_parent() -> None:
    """The same block of token ids after two different parents: two identities."""
    impl, spec = _pair(16)
    tail = [50, 51, 52, 53]
    a, b = [1, 2, 3, 4, *tail, 9], [5, 6, 7, 8, *tail, 9]
    _prefill(impl, spec, 0, a)
    _both(impl, spec, "free", [0])
    _both(impl, spec, "evict", 1)  # a's second block only
    probes = [Request(9, a, NS), Request(9, b, NS)]
    _same(impl, spec, probes)
    assert impl.match(probes[0]).lost.evicted == BS
    assert impl.match(probes[1]).lost.evicted == 0


def test_the_record_keeps_the_newest_num_blocks_identities() -> None:
    """Past num_blocks evicted identities the oldest fall out; an identity evicted again
    moves to the newest end, so it outlives identities evicted in between."""
    impl, spec = _pair(6)
    first = _chain(0, 2)
    prompts = [first] + [_chain(1000 * (i + 1), 2) for i in range(5)]
    probes = [Request(99, p, NS) for p in prompts]
    for i, p in enumerate(prompts):
        _prefill(impl, spec, i, p)
        _both(impl, spec, "free", [i])
        if i == 2:  # evict `first` again: it moves to the newest end
            _prefill(impl, spec, 50, first)
            _both(impl, spec, "free", [50])
        _both(impl, spec, "evict", 6)
        _same(impl, spec, probes)
    lost = [impl.match(r).lost for r in probes]
    assert [x.evicted for x in lost] == [0, 0, 0, 2 * BS, 2 * BS, 2 * BS]
    # Six identities fit: first's two (evicted at step 2), then steps 3..5; 1..2 fell out.
    impl2, spec2 = _pair(6)
    for i, p in enumerate(prompts[:3]):
        _prefill(impl2, spec2, i, p)
        _both(impl2, spec2, "free", [i])
        _both(impl2, spec2, "evict", 6)
    _same(impl2, spec2, probes)


def test_collision_buckets_emptied_in_one_batch() -> None:
    """With a weak hash several published blocks share a bucket; one batch evicts them."""
    impl, spec = _pair(24, hasher=weak_hash)
    prompts = [_chain(10 * i, 3) for i in range(6)]
    for i, p in enumerate(prompts):
        _prefill(impl, spec, i, p)
    _both(impl, spec, "free", list(range(6)))
    assert impl.largest_index_bucket() > 1
    probes = [Request(99, p, NS) for p in prompts]
    _same(impl, spec, probes)
    _both(impl, spec, "evict", 7)
    _same(impl, spec, probes)
    _both(impl, spec, "evict", 100)
    _same(impl, spec, probes)
    assert impl.largest_index_bucket() == 0


def test_multimodal_blocks_are_remembered_with_their_extra_keys() -> None:
    impl, spec = _pair(16)
    prompt = _chain(0, 3)
    cat = MultimodalSpan(4, 8, "image", b"cat")
    dog = MultimodalSpan(4, 8, "image", b"dog")
    adm = _both(impl, spec, "admit", Request(0, prompt, NS, spans=(cat,)))
    _both(impl, spec, "commit", 0, adm.num_scheduled_tokens, [7])
    _both(impl, spec, "free", [0])
    _both(impl, spec, "evict", 16)
    probes = [Request(9, prompt, NS, spans=(s,)) for s in (cat, dog)]
    _same(impl, spec, probes)
    assert impl.match(probes[0]).lost.evicted == 3 * BS
    assert impl.match(probes[1]).lost.evicted == BS  # the root only: then the image differs


def test_evict_boundaries() -> None:
    impl, spec = _pair(8)
    _prefill(impl, spec, 0, _chain(0, 3))
    _both(impl, spec, "free", [0])
    probes = [Request(9, _chain(0, 3), NS)]
    assert _both(impl, spec, "evict", 0) == 0
    _same(impl, spec, probes)
    for bad in (-1, 1.5, True, "2"):
        before = impl.snapshot()
        with pytest.raises(PrefixCacheError) as got:
            impl.evict(bad)
        with pytest.raises(PrefixCacheError) as want:
            spec.evict(bad)
        assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))
        assert isinstance(got.value, (TypeError, ValueError))
        assert impl.snapshot() == before
    assert _both(impl, spec, "evict", 100) == 3  # only three leaves to give
    assert _both(impl, spec, "evict", 1) == 0
    _same(impl, spec, probes)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("hasher", [None, weak_hash], ids=["keyed", "weak"])
def test_random_pressure_agrees_with_the_spec(seed: int, hasher: Any) -> None:
    """Shared prefixes under a tight pool: admissions evict in batches, decode steps one
    block at a time, explicit evictions anything in between."""
    rng = random.Random(seed)
    kwargs = {} if hasher is None else {"hasher": hasher}
    impl, spec = _pair(20, **kwargs)
    stems = [_chain(1000 * s, 2)[:-1] for s in range(3)]
    live: list[int] = []
    probes: list[Request] = []
    for step in range(120):
        op = rng.random()
        if op < 0.45 or not live:
            stem = rng.choice(stems)
            prompt = stem + [rng.randrange(4) for _ in range(rng.randrange(1, 3 * BS))]
            req = Request(step, prompt, rng.choice((NS, NS, OTHER)))
            probes = [*probes, Request(10_000, prompt, req.namespace)][-8:]
            if impl.can_admit(req) != spec.can_admit(req):
                raise AssertionError("can_admit differs")
            try:
                adm = impl.admit(req)
            except PrefixCacheError as exc:
                with pytest.raises(type(exc)):
                    spec.admit(req)
                continue
            assert spec.admit(req) == adm
            _both(impl, spec, "commit", step, adm.num_scheduled_tokens, [rng.randrange(4)])
            live.append(step)
        elif op < 0.75:
            seq = rng.choice(live)
            try:
                got = impl.append(seq, BS)
            except PrefixCacheError as exc:
                with pytest.raises(type(exc)):
                    spec.append(seq, BS)
                continue
            assert spec.append(seq, BS) == got
            toks = [rng.randrange(4) for _ in range(BS)]
            _both(impl, spec, "commit", seq, BS, toks)
        elif op < 0.9:
            seq = live.pop(rng.randrange(len(live)))
            _both(impl, spec, "free", [seq])
        else:
            _both(impl, spec, "evict", rng.choice((1, 2, 5, 50)))
        _same(impl, spec, probes)


def test_bad_requests_still_raise_before_eviction() -> None:
    impl, spec = _pair(4)
    with pytest.raises(InvalidRequest):
        impl.match("not a request")
    with pytest.raises(InvalidRequest):
        spec.match("not a request")
