"""The hash KV events carry: collision-resistant whatever the index hasher.

``fast_hash`` (the default index hasher) can be inverted lane by lane, so a client who
picks its token ids can put thousands of distinct blocks under one ``fast_hash``
(:func:`prefixkv.benchmarks.collisions.craft_colliding_blocks`, a numpy birthday search
per pair of lanes). Those blocks must still carry distinct hashes on the wire: a router's
mirror predicts every one of them exactly after evictions, and INV-EVENTS sees a removal
of the wrong identity.
"""

from __future__ import annotations

import hashlib
import random
import struct

import pytest
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import (
    BlockRemoved,
    BlockStored,
    EventMirror,
    HybridSpecCache,
    Namespace,
    Request,
    SpecCache,
)
from prefixkv.spec.event_mirror import served_prefix_blocks
from prefixkv.spec.hashing import HASHERS
from prefixkv.spec.identity import event_hash, fast_hash
from prefixkv.spec.invariants import check_events, event_violations

from prefixkv.benchmarks.collisions import craft_colliding_blocks, largest_bucket

NS = Namespace("m@1")
BS = 16


def _reference_event_hash(
    parent: int | None, ns: bytes, tokens: tuple[int, ...], extras: tuple[tuple[int, bytes], ...]
) -> int:
    """The encoding of docs/events.md, written out again: what a consumer in another
    language computes."""
    data = b"\x00" if parent is None else b"\x01" + struct.pack(">q", parent)
    data += struct.pack(">Q", len(ns)) + ns
    raw = struct.pack(f"<{len(tokens)}I", *tokens)
    data += struct.pack(">Q", len(raw)) + raw
    if extras:
        data += struct.pack(">Q", len(extras))
        for offset, content in extras:
            data += struct.pack(">q", offset) + struct.pack(">Q", len(content)) + content
    digest = hashlib.blake2b(data, digest_size=8, person=b"prefixkv.event").digest()
    return int.from_bytes(digest, "big", signed=True)


@pytest.mark.parametrize(
    ("parent", "tokens", "extras"),
    [
        (None, (1, 2, 3, 4), ()),
        (-(2**63), (0, 2**32 - 1), ()),
        (2**63 - 1, tuple(range(16)), ((0, b"\x01" * 8), (-3, b""))),
    ],
)
def test_the_encoding_is_the_documented_one(
    parent: int | None, tokens: tuple[int, ...], extras: tuple[tuple[int, bytes], ...]
) -> None:
    ns = Namespace("m@1", "lora", b"salt").key()
    assert event_hash(parent, ns, tokens, extras) == _reference_event_hash(
        parent, ns, tokens, extras
    )


def test_every_part_of_the_identity_changes_the_hash() -> None:
    ns, other = NS.key(), Namespace("m@1", salt=b"t").key()
    base = event_hash(7, ns, (1, 2), ())
    variants = [
        event_hash(None, ns, (1, 2), ()),
        event_hash(8, ns, (1, 2), ()),
        event_hash(7, other, (1, 2), ()),
        event_hash(7, ns, (2, 1), ()),
        event_hash(7, ns, (1, 2, 0), ()),
        event_hash(7, ns, (1, 2), ((0, b"img"),)),
        event_hash(7, ns, (1, 2), ((1, b"img"),)),
    ]
    assert base == event_hash(7, ns, (1, 2), ())
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize("name", sorted(HASHERS))
def test_events_carry_the_event_hash_whatever_the_index_hasher(name: str) -> None:
    """The spec and the impl, under every index hasher (the weak ones included), put the
    same event hashes on the same stream."""
    streams = []
    for cls in (SpecCache, PrefixCacheManager):
        cache = cls(12, 4, hasher=HASHERS[name], record_events=True)
        for i, tokens in enumerate([(1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 9, 9, 9, 9, 9)]):
            adm = cache.admit(Request(i, tokens, NS))
            cache.commit(i, adm.num_scheduled_tokens, ())
        streams.append(cache.take_events())
    assert streams[0] == streams[1]
    stored = [e for e in streams[0] if isinstance(e, BlockStored)]
    root = event_hash(None, NS.key(), (1, 2, 3, 4), ())
    assert stored[0].block_hashes == (root,)
    assert stored[1].block_hashes == (event_hash(root, NS.key(), (5, 6, 7, 8), ()),)
    assert stored[1].parent_block_hash == root


def _crafted_prompts(count: int) -> list[tuple[int, ...]]:
    """Two-block prompts (plus a token) over 4 roots: every second block has one
    ``fast_hash`` under its root, and every root one ``fast_hash``."""
    blocks = craft_colliding_blocks(count + 4, BS, seed=1)
    roots, seconds = blocks[:4], blocks[4:]
    prompts = [roots[i % 4] + seconds[i] + (7,) for i in range(count)]
    assert largest_bucket(fast_hash, tuple(prompts), BS) > count // 8  # they do collide
    return prompts


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_crafted_collisions_are_predicted_exactly_after_evictions(cls: type) -> None:
    """The audit's attack: dozens of blocks with one fast_hash, evicted in a small pool.
    The router's mirror predicts every prompt exactly (0 mispredictions)."""
    prompts = _crafted_prompts(48)
    cache = cls(16, BS, record_events=True)
    mirror = EventMirror()
    rng = random.Random(5)
    mispredicted = checked = evicted = 0
    for step in range(160):
        prompt = rng.choice(prompts)
        sid = f"r{step}"
        adm = cache.admit(Request(sid, prompt, NS))
        cache.commit(sid, adm.num_scheduled_tokens, ())
        cache.free([sid])
        evicted += adm.num_evicted
        mirror.apply_all(cache.take_events())
        state = cache.snapshot()
        check_events(mirror, state)
        for probe in prompts[::3]:
            checked += 1
            want = served_prefix_blocks(state, NS, probe)
            mispredicted += mirror.overlap(event_hash, NS, probe) != want
    assert evicted > 80 and checked > 2_000
    assert mispredicted == 0
    assert all(len(e) == 1 for e in mirror.blocks.values())  # one identity per hash
    assert not mirror.unresolved


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_a_removal_of_the_wrong_identity_is_caught(cls: type) -> None:
    """An eviction's BlockRemoved swapped for another live block with the same fast_hash:
    the stream stays applicable, and INV-EVENTS names the identity that is missing."""
    prompts = _crafted_prompts(8)
    cache = cls(20, BS, record_events=True)
    mirror = EventMirror()
    for i, prompt in enumerate(prompts):
        adm = cache.admit(Request(i, prompt, NS))
        cache.commit(i, adm.num_scheduled_tokens, ())
        if i:
            cache.free([i])
    mirror.apply_all(cache.take_events())
    state = cache.snapshot()
    by_hash = {v.event_hash: v for v in state.blocks if v.published}
    assert cache.evict(1) == 1
    (gone,) = cache.take_events()
    assert isinstance(gone, BlockRemoved)
    left = by_hash[gone.block_hashes[0]]
    # Another published depth-2 block under the same root: the same fast_hash as the one
    # that left, and still published.
    twin = next(
        v
        for v in cache.snapshot().blocks
        if v.published and v.parent == left.parent and v.block_id != left.block_id
    )
    assert fast_hash(
        state.blocks[twin.parent].block_hash, NS.key(), twin.token_ids, ()
    ) == fast_hash(state.blocks[left.parent].block_hash, NS.key(), left.token_ids, ())
    assert twin.event_hash != left.event_hash
    good = mirror.copy()
    good.apply_all([gone])
    assert event_violations(good, cache) == []
    wrong = mirror.copy()
    wrong.apply_all([BlockRemoved((twin.event_hash,))])  # applies: the mirror holds it
    found = [str(v) for v in event_violations(wrong, cache)]
    assert found and all(v.startswith("INV-EVENTS") for v in found)
    assert any(f"published block {twin.block_id}" in v for v in found)


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridPrefixCacheManager])
def test_checkpoint_events_name_blocks_by_their_event_hash(cls: type) -> None:
    cache = cls(16, 4, max_num_seqs=2, state_budget=2, hasher=HASHERS["weak"], record_events=True)
    adm = cache.admit(Request("a", tuple(range(9)), NS))
    cache.commit("a", adm.num_scheduled_tokens, ())
    events = cache.take_events()
    stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
    ckpts = [h for e in events if type(e).__name__ == "CheckpointStored" for h in e.block_hashes]
    assert ckpts and set(ckpts) <= stored
    mirror = EventMirror()
    mirror.apply_all(events)
    check_events(mirror, cache)
