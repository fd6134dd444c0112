"""Example-based scenarios: what the major engines' prefix-cache tests pin, against our API.

Every scenario runs against the spec and the optimized implementation, and checks every
invariant after each step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    BlockRemoved,
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    PrefixCache,
    Request,
    SpecCache,
    invariants,
)

NS = Namespace("tiny-llm@1")
BS = 4

Factory = Callable[..., PrefixCache]


@pytest.fixture(params=[SpecCache, PrefixCacheManager], ids=["spec", "impl"])
def make(request: pytest.FixtureRequest) -> Factory:
    cls = request.param

    def factory(num_blocks: int = 32, block_size: int = BS) -> PrefixCache:
        return cls(num_blocks, block_size, record_events=True)  # type: ignore[no-any-return]

    return factory


def prefill(cache: PrefixCache, req: Request, sampled: int = 999) -> int:
    """Admit, write the whole prompt's KV in chunks, accept one sampled token."""
    adm = cache.admit(req)
    cache.commit(req.seq_id, adm.num_scheduled_tokens, [] if _chunked(cache, req) else [sampled])
    while cache.num_computed_tokens(req.seq_id) < req.num_tokens:
        n = cache.continue_prefill(req.seq_id)
        done = cache.num_computed_tokens(req.seq_id) + n >= req.num_tokens
        cache.commit(req.seq_id, n, [sampled] if done else [])
    invariants.check(cache)  # type: ignore[arg-type]
    return adm.num_cached_tokens


def _chunked(cache: PrefixCache, req: Request) -> bool:
    return cache.snapshot().sequences[-1].num_reserved < req.num_tokens  # type: ignore[attr-defined]


def decode(cache: PrefixCache, seq_id: str, tokens: list[int]) -> None:
    for t in tokens:
        cache.append(seq_id, 1)
        cache.commit(seq_id, 1, [t])
    invariants.check(cache)  # type: ignore[arg-type]


def test_hits_across_sessions_and_turns(make: Factory) -> None:
    """A second turn re-sending the history hits every full block the first turn computed."""
    cache = make()
    turn1 = list(range(10))
    prefill(cache, Request("s1", turn1, NS), sampled=50)
    decode(cache, "s1", [51, 52, 53])
    history = cache.snapshot().sequences[0].token_ids  # type: ignore[attr-defined]
    cache.free(["s1"])
    turn2 = Request("s2", [*history, 60, 61], NS)
    assert len(history) == 14
    # KV exists for 13 of the 14 history tokens: 3 full blocks (12 tokens) are reusable.
    assert cache.match(turn2).num_cached_tokens == 12
    assert prefill(cache, turn2) == 12
    # Another session with only the system prompt in common shares just those blocks.
    assert cache.match(Request("s3", [*turn1[:8], 7, 7, 7], NS)).num_cached_tokens == 8


def test_partial_last_block_is_never_published(make: Factory) -> None:
    """Only full blocks are matchable; a 10-token prompt publishes 2 blocks, not 3."""
    cache = make()
    prefill(cache, Request("a", list(range(10)), NS))
    assert cache.stats().num_published_blocks == 2
    assert cache.match(Request("b", list(range(11)), NS)).num_cached_tokens == 8


def test_full_prompt_hit_is_capped(make: Factory) -> None:
    """A prompt whose every block is cached still computes its last block (choice 4)."""
    cache = make()
    prefill(cache, Request("a", list(range(12)), NS))
    cache.free(["a"])
    m = cache.match(Request("b", list(range(12)), NS))
    assert m.num_cached_tokens == 8
    assert m.lost.cap == BS
    adm = cache.admit(Request("b", list(range(12)), NS))
    assert adm.num_scheduled_tokens == 4


def test_eviction_order_under_pressure(make: Factory) -> None:
    """Leaves go first, least recently released first, deeper first on ties (choice 3)."""
    cache = make(num_blocks=6)
    prefill(cache, Request("old", [1] * 9, NS))  # publishes 2 blocks, holds 3
    prefill(cache, Request("new", [2] * 9, NS))
    cache.free(["old"])
    cache.free(["new"])
    snap = cache.snapshot()  # type: ignore[attr-defined]
    old_blocks = [b.block_id for b in snap.blocks if b.token_ids == (1,) * 4]
    cache.admit(Request("x", [3] * 23, NS))  # needs all 6 blocks: evicts every cached one
    removed = [e.block_hashes for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 4
    # the two "old" blocks go first, the deeper one before its parent
    assert {b.block_id for b in snap.blocks if b.wire_hash in removed[0] + removed[1]} == set(
        old_blocks
    )
    assert snap.blocks[old_blocks[1]].wire_hash == removed[0][0]


def test_two_requests_sharing_a_prefix_in_one_step(make: Factory) -> None:
    """Both compute the prefix; the first commit publishes it, the twin stays private."""
    cache = make()
    a = cache.admit(Request("a", [*range(8), 100], NS))
    b = cache.admit(Request("b", [*range(8), 200], NS))
    assert a.num_cached_tokens == b.num_cached_tokens == 0
    cache.commit("a", a.num_scheduled_tokens, [1])
    cache.commit("b", b.num_scheduled_tokens, [2])
    assert cache.stats().num_published_blocks == 2
    assert set(cache.block_table("a")[:2]).isdisjoint(cache.block_table("b")[:2])
    # b's duplicates are freed with b; a's blocks stay cached
    cache.free(["b"])
    assert cache.match(Request("c", [*range(8), 5], NS)).block_ids == cache.block_table("a")[:2]
    invariants.check(cache)  # type: ignore[arg-type]


def test_preempt_and_readmit(make: Factory) -> None:
    """A preempted sequence re-admitted with its tokens so far recomputes only the tail."""
    cache = make()
    prefill(cache, Request("a", list(range(9)), NS), sampled=40)
    decode(cache, "a", [41, 42, 43])
    tokens = cache.snapshot().sequences[0].token_ids  # type: ignore[attr-defined]
    cache.free(["a"])  # preempted
    adm = cache.admit(Request("a", tokens, NS))
    assert adm.num_cached_tokens == 12
    assert adm.num_scheduled_tokens == len(tokens) - 12


def test_multimodal_boundary(make: Factory) -> None:
    """Equal placeholders with other content miss, and a hit never ends inside a span."""
    cache = make()
    prompt = [7] * 14
    cat = MultimodalSpan(5, 11, "image", b"cat")
    dog = MultimodalSpan(5, 11, "image", b"dog")
    prefill(cache, Request("a", prompt, NS, spans=(cat,)))
    assert cache.match(Request("b", [*prompt, 1], NS, spans=(dog,))).num_cached_tokens == 4
    assert cache.match(Request("b", [*prompt, 1], NS, spans=(cat,))).num_cached_tokens == 12
    # a longer image over the same placeholders: the hit stops before the span
    longer = MultimodalSpan(5, 14, "image", b"cat")
    m = cache.match(Request("b", [*prompt, 1], NS, spans=(longer,)))
    assert m.num_cached_tokens == 4
    # the same span, but a prompt that only matches to the middle of it: clamped
    m = cache.match(Request("c", [7] * 9 + [3] * 6, NS, spans=(cat,)))
    assert m.num_cached_tokens == 4 and m.lost.span == 4


def test_span_keys_are_injective_and_offset_aware(make: Factory) -> None:
    """Crafted modality/content pairs that concatenate alike, other lengths and other offsets
    of the same item, and the placeholders typed as text never share a block."""
    cache = make(num_blocks=64)
    prompt = [7] * 4 + [9] * 4 + [7] * 4
    item = MultimodalSpan(4, 8, "image", b"ab")
    prefill(cache, Request("a", prompt, NS, spans=(item,)))
    assert cache.match(Request("q", [*prompt, 1], NS, spans=(item,))).num_cached_tokens == 12
    for other in (
        (MultimodalSpan(4, 8, "imagea", b"b"),),  # "image" + "ab" == "imagea" + "b"
        (MultimodalSpan(4, 8, "image", b"a"),),  # a prefix of the content
        (MultimodalSpan(4, 7, "image", b"ab"),),  # same item, one token shorter
        (MultimodalSpan(5, 8, "image", b"ab"),),  # same item, another offset in the block
        (MultimodalSpan(4, 6, "image", b"ab"), MultimodalSpan(6, 8, "image", b"ab")),
        (),  # the placeholder ids as plain text
    ):
        m = cache.match(Request("q", [*prompt, 1], NS, spans=other))
        assert m.num_cached_tokens == 4, other  # only the text block before the items
    for cls_ns in (Namespace("tiny-llm@1", adapter="lora"), Namespace("tiny-llm@2")):
        m = cache.match(Request("q", [*prompt, 1], cls_ns, spans=(item,)))
        assert m.num_cached_tokens == 0


def test_window_twin_stays_canonical(make: Factory) -> None:
    """After a window recompute, the published block stays canonical; the private copy is
    freed with its owner and never enters the index."""
    cache = make()
    prompt = list(range(1, 14))
    prefill(cache, Request("a", prompt, NS))
    before = {b.block_id for b in cache.snapshot().blocks if b.published}  # type: ignore[attr-defined]
    prefill(cache, Request("b", [*prompt[:12], 50], NS, recompute_blocks=2))
    table = cache.block_table("b")
    snap = cache.snapshot()  # type: ignore[attr-defined]
    published = {b.block_id for b in snap.blocks if b.published}
    assert published == before  # the recomputed twins were not published again
    assert not (set(table[1:3]) & published) and table[0] in published
    cache.free(["b"])
    assert {b.block_id for b in cache.snapshot().blocks if b.published} == before  # type: ignore[attr-defined]
    invariants.check(cache)  # type: ignore[arg-type]


def test_recompute_window_at_a_block_boundary(make: Factory) -> None:
    """The last k matched blocks are recomputed into fresh private blocks (choice 6)."""
    cache = make()
    prefill(cache, Request("a", list(range(13)), NS))
    shared = cache.block_table("a")[:3]
    adm = cache.admit(Request("b", [*range(13), 5], NS, recompute_blocks=1))
    assert adm.num_cached_tokens == 8 and adm.num_window_blocks == 1 and adm.lost.window == 4
    assert adm.block_ids[:2] == shared[:2]
    assert adm.block_ids[2] not in shared
    cache.commit("b", adm.num_scheduled_tokens, [9])
    # the recomputed copy stays private: the published block is still the original
    assert cache.match(Request("c", [*range(12), 1], NS)).block_ids == shared
    invariants.check(cache)  # type: ignore[arg-type]


def test_recompute_window_at_the_start(make: Factory) -> None:
    """A window as long as the hit recomputes everything: nothing counts as cached."""
    cache = make()
    prefill(cache, Request("a", list(range(9)), NS))
    adm = cache.admit(Request("b", list(range(9)), NS, recompute_blocks=5))
    assert adm.num_cached_tokens == 0 and adm.num_window_blocks == 2
    assert cache.stats().hits == 0
    invariants.check(cache)  # type: ignore[arg-type]


def test_long_context_resumes_chunking_from_the_hit(make: Factory) -> None:
    """The cached prefix is skipped in one step; chunks of kv_token_limit follow it."""
    cache = make(num_blocks=64)
    prefill(cache, Request("a", list(range(40)), NS))
    cache.free(["a"])
    req = Request("b", [*range(40), *range(100, 130)], NS, kv_token_limit=8)
    adm = cache.admit(req)
    assert adm.num_cached_tokens == 40
    assert adm.num_scheduled_tokens == 8
    assert len(adm.block_ids) == 12  # 40 cached + 8: ceil(48 / 4)
    cache.commit("b", 8)
    chunks = []
    while cache.num_computed_tokens("b") < req.num_tokens:
        n = cache.continue_prefill("b")
        chunks.append(n)
        assert len(cache.block_table("b")) == -(-(cache.num_computed_tokens("b") + n) // BS)
        cache.commit("b", n)
        invariants.check(cache)  # type: ignore[arg-type]
    assert chunks == [8, 8, 6]


def test_cancel_mid_chunk_leaves_nothing_matchable(make: Factory) -> None:
    """Freeing a sequence between reservation and commit publishes none of its chunk."""
    cache = make()
    req = Request("a", list(range(20)), NS, kv_token_limit=8)
    adm = cache.admit(req)
    cache.commit("a", adm.num_scheduled_tokens)
    cache.continue_prefill("a")  # reserved, never written
    cache.free(["a"])
    assert cache.match(Request("b", list(range(20)), NS)).num_cached_tokens == 8


def test_rejected_admission_leaves_statistics_exact(make: Factory) -> None:
    """An admission that cannot get blocks changes nothing, statistics included (INV-TXN)."""
    cache = make(num_blocks=4)
    prefill(cache, Request("a", list(range(9)), NS))
    before = cache.snapshot()  # type: ignore[attr-defined]
    big = Request("b", list(range(30)), NS)
    assert not cache.can_admit(big)
    with pytest.raises(OutOfBlocks):
        cache.admit(big)
    invariants.check_unchanged(before, cache.snapshot(), "admit")  # type: ignore[attr-defined]
    assert cache.stats().queries == 9
    decode(cache, "a", [1])
    # rolling back a speculative tail: draft slots come back, accepted KV stays
    cache.append("a", 3)
    cache.commit("a", 1, [2])
    cache.rollback("a", 2)
    seq = cache.snapshot().sequences[0]  # type: ignore[attr-defined]
    assert (seq.num_computed, seq.num_reserved) == (11, 11)
    invariants.check(cache)  # type: ignore[arg-type]
