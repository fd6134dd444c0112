"""Example-based tests of the executable spec (SpecCache): each pins one design choice.

The differential machines check that the impl agrees with the spec; these tests check that
the spec says what the design says, on small cases worked out by hand.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheBusy,
    CacheState,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    InvariantViolation,
    LostReuse,
    Match,
    Namespace,
    OutOfBlocks,
    PrefixCacheError,
    Request,
    SpecCache,
    UnknownSequence,
    check,
    check_match,
    violations,
)
from prefixkv.spec.invariants import check_unchanged

NS = Namespace("tiny-llm@1")


def cache(num_blocks: int = 8, block_size: int = 2, **kwargs: object) -> SpecCache:
    return SpecCache(num_blocks, block_size, record_events=True, **kwargs)  # type: ignore[arg-type]


def run_prompt(c: SpecCache, seq_id: object, tokens: tuple[int, ...], sampled: int = 9) -> None:
    """Admit, prefill and sample one token: the prompt's full blocks are published."""
    adm = c.admit(Request(seq_id, tokens, NS))  # type: ignore[arg-type]
    c.commit(seq_id, adm.num_scheduled_tokens, [sampled])  # type: ignore[arg-type]


def published(c: SpecCache) -> list[int]:
    return [v.block_id for v in c.snapshot().blocks if v.published]


# -- matching ------------------------------------------------------------------------------


def test_full_prompt_hit_is_capped() -> None:
    """Choice 4: a full-prompt hit is capped to floor((len - 1) / block_size) blocks."""
    c = cache(block_size=4)
    run_prompt(c, "a", tuple(range(1, 9)))  # 8 tokens: two full blocks, both published
    assert published(c) == [0, 1]
    m = c.match(Request("b", tuple(range(1, 9)), NS))
    assert (m.num_cached_tokens, m.block_ids, m.lost.cap) == (4, (0,), 4)
    longer = c.match(Request("b", tuple(range(1, 10)), NS))
    assert (longer.num_cached_tokens, longer.block_ids, longer.lost.cap) == (8, (0, 1), 0)
    assert longer.lost.total == longer.lost.never_cached == 1  # the partial last block
    assert c.match(Request("b", (1,), NS)).num_cached_tokens == 0


def test_match_is_pure_and_verified() -> None:
    """match changes nothing, and every matched block has the request's identity (INV-MATCH)."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    before = c.snapshot()
    req = Request("b", (1, 2, 3, 4, 6), NS)
    m = c.match(req)
    assert m == Match(5, 4, (0, 1), LostReuse(never_cached=1))
    check_match(c, req, m)
    assert c.snapshot() == before
    assert c.match(Request("b", (1, 2, 4, 4, 6), NS)).block_ids == (0,)


# -- publication ---------------------------------------------------------------------------


def test_publish_only_after_commit() -> None:
    """Choice 1: blocks become matchable only when committed, never when scheduled."""
    c = cache()
    req = Request("a", (1, 2, 3, 4, 5), NS)
    c.admit(req)
    probe = Request("p", (1, 2, 3, 4, 5, 6), NS)
    assert c.match(probe).num_cached_tokens == 0  # scheduled, not computed
    c.commit("a", 3)  # one full block written, the second half-written
    assert c.match(probe).block_ids == (0,)
    c.commit("a", 2, [7])
    assert c.match(probe).block_ids == (0, 1)
    assert c.stats().blocks_published == 2


def test_draft_tokens_are_never_published() -> None:
    """Choices 1 and 10: speculative drafts rolled back leave nothing matchable."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3), sampled=4)  # KV for 3 tokens, token 4 sampled
    assert c.append("a", 4) == [2, 3]  # the sampled token + 3 drafts: slots 3..6
    c.commit("a", 2, [5, 6])  # the sampled token and one draft accepted (+ a bonus token)
    c.rollback("a", 2)  # two rejected drafts: block 3 (slots 6, 7) goes back
    assert c.block_table("a") == (0, 1, 2)
    view = c.snapshot().sequences[0]
    assert (view.num_computed, view.num_reserved, view.token_ids) == (5, 5, (1, 2, 3, 4, 5, 6))
    assert published(c) == [0, 1]  # (1, 2) and (3, 4); (5, 6) is not computed yet
    assert c.match(Request("p", (1, 2, 3, 4, 5, 6, 7), NS)).block_ids == (0, 1)


def test_duplicate_publication_stays_private() -> None:
    """Choice 2: the second of two identical prompts keeps its own private blocks."""
    c = cache()
    a = c.admit(Request("a", (1, 2, 3, 4, 5), NS))
    b = c.admit(Request("b", (1, 2, 3, 4, 5), NS))  # same step: neither is published yet
    assert (a.block_ids, b.block_ids) == ((0, 1, 2), (3, 4, 5))
    c.commit("a", 5, [6])
    c.commit("b", 5, [6])
    s = c.snapshot()
    assert c.block_table("b") == (3, 4, 5)  # no block swapped under b
    assert [s.blocks[i].published for i in (0, 1, 3, 4)] == [True, True, False, False]
    assert [s.blocks[i].refcount for i in (0, 1, 3, 4)] == [1, 1, 1, 1]
    assert c.stats().blocks_published == 2
    c.free(["b"])
    assert c.snapshot().free_queue[-3:] == (5, 4, 3)  # private, so freed tail first
    check(c)


def test_publish_under_canonical_twin() -> None:
    """A private duplicate's next block is published under the canonical twin (INV-ANCESTOR)."""
    c = cache()
    c.admit(Request("a", (1, 2, 3, 4, 5), NS))
    c.admit(Request("b", (1, 2, 3, 4, 5), NS))
    c.commit("a", 5, [6])
    c.commit("b", 5, [6])
    c.free(["a"])
    c.append("b", 1)
    c.commit("b", 1, [7])  # b's block 2 = (5, 6), published; its parent identity is block 1
    s = c.snapshot()
    assert (s.blocks[5].published, s.blocks[5].parent) == (True, 1)
    assert c.match(Request("p", (1, 2, 3, 4, 5, 6, 0), NS)).block_ids == (0, 1, 5)


# -- eviction ------------------------------------------------------------------------------


def test_eviction_is_lru_over_leaves() -> None:
    """Choice 3: least recently released leaf first; a parent goes only after its children."""
    c = cache()
    run_prompt(c, "x", (1, 2, 3, 4, 5))  # blocks 0 <- 1, private 2
    c.free(["x"])  # clock 1
    run_prompt(c, "y", (5, 6, 7))  # block 3, private 4
    c.free(["y"])  # clock 2
    evicted = []
    for _ in range(3):
        c.take_events()
        assert c.evict(1) == 1
        (event,) = c.take_events()
        assert isinstance(event, BlockRemoved)
        evicted.append(c.snapshot().free_queue[-1])
    assert evicted == [1, 0, 3]
    assert c.evict(5) == 0


def test_eviction_tie_breaks() -> None:
    """Choice 3: released together, the deeper leaf goes first, then the lower block id."""
    c = cache()
    run_prompt(c, "x", (1, 2, 3, 4, 5))  # 0 <- 1
    run_prompt(c, "y", (5, 6, 7))  # 3
    run_prompt(c, "z", (8, 8, 7))  # 5
    c.free(["z", "y", "x"])  # one batch: one release time for all
    order = []
    while c.evict(1):
        order.append(c.snapshot().free_queue[-1])
    assert order == [1, 0, 3, 5]


def test_eviction_skips_parent_of_held_child() -> None:
    """Choice 3: a cached parent whose child is held is not a leaf, however old it is."""
    c = cache()
    c.admit(Request("a", (1, 2, 3, 4, 5), NS))
    c.admit(Request("b", (1, 2, 3, 4, 5), NS))
    c.commit("a", 5, [6])
    c.commit("b", 5, [6])
    c.free(["a"])  # 0 <- 1 cached, released at clock 1
    c.append("b", 1)
    c.commit("b", 1, [7])  # b's block 5 published under 1 and held by b
    assert c.evict(5) == 0
    assert not c.can_admit(Request("c", (9,) * 7, NS))  # needs 4: 3 free, 0 evictable
    c.free(["b"])  # block 5 released at clock 2: younger than 1, but 1 is not a leaf
    order = []
    while c.evict(1):
        order.append(c.snapshot().free_queue[-1])
    assert order == [5, 1, 0]


# -- admission -----------------------------------------------------------------------------


def test_can_admit_is_exact_with_cached_hits() -> None:
    """Choice 9: hits on refcount-0 cached blocks are pinned, not counted as evictable."""
    c = cache(num_blocks=4)
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    c.free(["a"])  # blocks 0 <- 1 cached, 2 and 3 free
    hit2_new2 = Request("b", (1, 2, 3, 4, 5, 6, 7, 8), NS)  # 2 hits + 2 new blocks
    hit2_new3 = Request("b", (1, 2, 3, 4, 5, 6, 7, 8, 9, 10), NS)  # 2 hits + 3 new blocks
    miss4 = Request("b", (9, 9, 9, 9, 9, 9, 9, 9), NS)  # 4 new blocks: evicts both
    assert c.can_admit(hit2_new2)
    assert not c.can_admit(hit2_new3)
    assert c.can_admit(miss4)
    before = c.snapshot()
    with pytest.raises(OutOfBlocks):
        c.admit(hit2_new3)
    check_unchanged(before, c.snapshot(), "admit")
    adm = c.admit(hit2_new2)
    assert (adm.block_ids, adm.num_cached_tokens, adm.num_evicted) == ((0, 1, 3, 2), 4, 0)
    c.free(["b"])  # b computed nothing of its own: 3 and 2 go back, 0 <- 1 stay cached
    adm = c.admit(miss4)
    assert (adm.block_ids, adm.num_evicted) == ((2, 3, 1, 0), 2)
    check(c)


def test_admission_budget_and_stats() -> None:
    """A token budget schedules part of the prompt; stats count the prompt once (INV-STATS)."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    adm = c.admit(Request("b", (1, 2, 3, 4, 5, 6, 7, 8, 9), NS), num_new_tokens=3)
    assert (adm.num_cached_tokens, adm.num_scheduled_tokens, len(adm.block_ids)) == (4, 3, 4)
    st = c.stats()
    assert (st.queries, st.hits, st.prefill_tokens) == (14, 4, 14)
    assert (st.prefill_tokens_skipped, st.prefill_tokens_computed) == (4, 10)
    assert st.admissions == 2 and st.hit_rate == pytest.approx(4 / 14)


def test_rejected_admission_changes_nothing() -> None:
    """INV-TXN: OutOfBlocks, DuplicateSequence and bad budgets leave state and stats alone."""
    c = cache(num_blocks=3)
    run_prompt(c, "a", (1, 2, 3))
    before = c.snapshot()
    for req, budget, error in (
        (Request("b", tuple(range(1, 12)), NS), None, OutOfBlocks),
        (Request("a", (1, 2), NS), None, DuplicateSequence),
        (Request("b", (1, 2), NS), 0, InvalidRequest),
        (Request("b", (1, 2), NS), True, InvalidRequest),
    ):
        with pytest.raises(error):
            c.admit(req, budget)
        check_unchanged(before, c.snapshot(), "admit")


# -- growth, commit, rollback --------------------------------------------------------------


def test_multi_token_append_commit_rollback() -> None:
    """Choice 10: several slots per step; rollback trims the tail and frees whole blocks."""
    c = cache(num_blocks=6)
    run_prompt(c, "a", (1, 2, 3), sampled=4)  # blocks 0, 1; 3 computed
    assert c.can_append("a", 5)
    assert c.append("a", 5) == [2, 3]  # reserved 3 -> 8: blocks for slots 4..7
    assert c.block_table("a") == (0, 1, 2, 3)
    c.commit("a", 2, [5])  # computed 5
    c.rollback("a", 3)  # reserved 5: block 3 dropped, block 2 kept (slot 4 computed)
    assert c.block_table("a") == (0, 1, 2)
    assert c.snapshot().free_queue[-1] == 3
    assert c.num_computed_tokens("a") == 5
    with pytest.raises(InvalidOperation):
        c.rollback("a", 1)  # nothing unwritten is left
    with pytest.raises(InvalidOperation):
        c.commit("a", 1, [6])  # nothing reserved is left
    with pytest.raises(OutOfBlocks):
        c.append("a", 20)
    assert not c.can_append("a", 20)
    check(c)


def test_commit_needs_known_tokens() -> None:
    """commit cannot mark KV written for tokens that are not known yet."""
    c = cache()
    c.admit(Request("a", (1, 2, 3), NS))
    c.commit("a", 3)  # prefill done, no token sampled yet
    c.append("a", 2)
    before = c.snapshot()
    with pytest.raises(InvalidOperation):
        c.commit("a", 1)  # token 4 is not known
    with pytest.raises(InvalidRequest):
        c.commit("a", 1, [2**32])
    check_unchanged(before, c.snapshot(), "commit")
    c.commit("a", 0, [4])  # num_computed 0: record a sampled token only
    c.commit("a", 1)
    assert c.num_computed_tokens("a") == 4


# -- release and reset ---------------------------------------------------------------------


def test_batched_free() -> None:
    """free releases a batch in order; a block in two tables is decremented twice (INV-REF)."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    adm = c.admit(Request("b", (1, 2, 3, 4, 6), NS))
    assert adm.block_ids[:2] == (0, 1)
    c.free(["a", "b"])
    s = c.snapshot()
    assert [s.blocks[b].refcount for b in (0, 1)] == [0, 0]
    assert s.stats.num_sequences == 0
    check(c)


def test_batched_free_errors_change_nothing() -> None:
    """A duplicate or unknown id fails the whole batch; a lone id or a non-iterable is refused."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3))
    run_prompt(c, "b", (4, 5, 6))
    before = c.snapshot()
    for ids, error in (
        (["a", "a"], DuplicateSequence),
        (["b", "a", "b"], DuplicateSequence),
        (["a", "zzz"], UnknownSequence),
        ("a", InvalidRequest),
        (7, InvalidRequest),
    ):
        with pytest.raises(error):
            c.free(ids)  # type: ignore[arg-type]
        check_unchanged(before, c.snapshot(), "free")
    c.free(["a"])
    with pytest.raises(UnknownSequence):
        c.free(["a"])  # double free
    assert c.seq_ids() == ("b",)


def test_reset_preserving_cache() -> None:
    """Choice 12: reset(preserve_cache=True) frees every live sequence, keeps published blocks."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    run_prompt(c, "b", (7, 7, 7))
    c.take_events()
    c.reset(preserve_cache=True)
    assert c.seq_ids() == ()
    assert published(c) == [0, 1, 3]
    assert c.match(Request("p", (1, 2, 3, 4, 5), NS)).block_ids == (0, 1)
    assert c.take_events() == []
    check(c)


def test_full_reset_refused_while_live() -> None:
    """Choice 12: a full reset raises CacheBusy while a sequence is live, changing nothing."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    before = c.snapshot()
    with pytest.raises(CacheBusy):
        c.reset(preserve_cache=False)
    with pytest.raises(InvalidRequest):
        c.reset(preserve_cache=1)  # type: ignore[arg-type]
    check_unchanged(before, c.snapshot(), "reset")
    c.free(["a"])
    c.take_events()
    stats = c.stats()
    c.reset(preserve_cache=False)
    s = c.snapshot()
    assert s.free_queue == tuple(range(8)) and s.index == () and not published(c)
    assert c.take_events() == [AllBlocksCleared()]
    assert (c.stats().queries, c.stats().blocks_published) == (stats.queries, 2)


# -- namespaces ----------------------------------------------------------------------------


def test_namespaces_never_share_blocks() -> None:
    """Model, adapter and salt each separate the KV; equal tokens never hit across them."""
    spaces = [
        NS,
        Namespace("tiny-llm@2"),
        Namespace("tiny-llm@1", adapter="lora-a"),
        Namespace("tiny-llm@1", adapter=""),
        Namespace("tiny-llm@1", salt=b"tenant-1"),
        Namespace("tiny-llm@1", salt=b""),
    ]
    c = cache(num_blocks=32)
    for i, ns in enumerate(spaces):
        assert c.match(Request(i, (1, 2, 3, 4, 5), ns)).num_cached_tokens == 0
        adm = c.admit(Request(i, (1, 2, 3, 4, 5), ns))
        assert adm.num_cached_tokens == 0
        c.commit(i, 5, [6])
    assert c.stats().blocks_published == 2 * len(spaces)
    check(c)


def test_crafted_namespaces_do_not_collide() -> None:
    """Fields that concatenate to the same string still get distinct, injective keys."""
    pairs = [
        (Namespace("m", adapter="ab", salt=b"c"), Namespace("m", adapter="a", salt=b"bc")),
        (Namespace("ma", adapter="b"), Namespace("m", adapter="ab")),
        (Namespace("m", adapter=None), Namespace("m", adapter="")),
        (Namespace("m", salt=b"x"), Namespace("m", adapter="x")),
    ]
    for left, right in pairs:
        assert left.key() != right.key()
        c = cache()
        adm = c.admit(Request("a", (1, 2, 3, 4, 5), left))
        c.commit("a", adm.num_scheduled_tokens, [6])
        assert c.match(Request("b", (1, 2, 3, 4, 5), right)).num_cached_tokens == 0
        assert c.match(Request("b", (1, 2, 3, 4, 5), left)).num_cached_tokens == 4


# -- events --------------------------------------------------------------------------------


def test_events_and_take_events() -> None:
    """BlockStored on publication (chained hashes), BlockRemoved on eviction; drained once."""
    c = cache()
    ns = Namespace("tiny-llm@1", adapter="lora-a")
    adm = c.admit(Request("a", (1, 2, 3, 4, 5), ns))
    assert c.take_events() == []  # nothing is published at admission
    c.commit("a", adm.num_scheduled_tokens, [6])
    first, second = c.take_events()
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert (first.token_ids, first.parent_block_hash, first.adapter) == ((1, 2), None, "lora-a")
    assert second.parent_block_hash == first.block_hashes[0] and second.block_size == 2
    assert c.take_events() == []
    c.free(["a"])
    assert c.evict(2) == 2
    assert c.take_events() == [BlockRemoved(second.block_hashes), BlockRemoved(first.block_hashes)]
    quiet = SpecCache(8, 2)  # record_events defaults to False
    run_prompt(quiet, "a", (1, 2, 3, 4, 5))
    assert quiet.take_events() == []


# -- errors and requests -------------------------------------------------------------------


def test_errors_subclass_builtins() -> None:
    """Typed errors are PrefixCacheErrors and the builtins engines already catch."""
    c = cache()
    with pytest.raises(KeyError):
        c.block_table("nope")
    with pytest.raises(ValueError):
        c.evict(-1)
    with pytest.raises(RuntimeError):
        c.admit(Request("a", tuple(range(100)), NS))
    for error, builtin in (
        (InvalidRequest, ValueError),
        (InvalidOperation, ValueError),
        (DuplicateSequence, ValueError),
        (UnknownSequence, KeyError),
        (OutOfBlocks, RuntimeError),
        (CacheBusy, RuntimeError),
    ):
        assert issubclass(error, PrefixCacheError) and issubclass(error, builtin)
    assert str(UnknownSequence("sequence 'x' is not live")) == "sequence 'x' is not live"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"token_ids": ()},
        {"token_ids": (-1,)},
        {"token_ids": (2**32,)},
        {"token_ids": (1.0,)},
        {"token_ids": ("a",)},
        {"token_ids": "abc"},
        {"seq_id": True},
        {"seq_id": 2.5},
        {"namespace": "tiny-llm@1"},
    ],
)
def test_invalid_requests_are_refused(kwargs: dict[str, object]) -> None:
    """Request validates on construction: bad tokens, ids and namespaces raise InvalidRequest."""
    args: dict[str, object] = {"seq_id": 1, "token_ids": (1, 2), "namespace": NS, **kwargs}
    with pytest.raises(InvalidRequest):
        Request(**args)  # type: ignore[arg-type]


def test_non_requests_and_bad_counts_are_refused() -> None:
    """Operations refuse non-Requests and non-int, bool or out-of-range counts."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3))
    before = c.snapshot()
    for op in (c.match, c.can_admit, c.admit):
        with pytest.raises(InvalidRequest):
            op((1, 2, 3))  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(InvalidRequest):
            c.append("a", bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest):
            c.rollback("a", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        c.commit("a", -1)
    with pytest.raises(InvalidRequest):
        c.block_table(None)  # type: ignore[arg-type]
    check_unchanged(before, c.snapshot(), "bad inputs")


# -- the invariant checker -----------------------------------------------------------------


def _busy_state() -> CacheState:
    """Two sequences sharing a published prefix, plus cached and free blocks."""
    c = cache(num_blocks=10)
    run_prompt(c, "x", (7, 7, 7, 7, 7))
    c.free(["x"])
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    c.admit(Request("b", (1, 2, 3, 4, 6, 6), NS))
    s = c.snapshot()
    check(s)
    return s


def _set_block(s: CacheState, b: int, **changes: Any) -> CacheState:
    blocks = list(s.blocks)
    blocks[b] = attrs.evolve(blocks[b], **changes)
    return attrs.evolve(s, blocks=tuple(blocks))


def _set_seq(s: CacheState, i: int, **changes: Any) -> CacheState:
    seqs = list(s.sequences)
    seqs[i] = attrs.evolve(seqs[i], **changes)
    return attrs.evolve(s, sequences=tuple(seqs))


def _corruptions(s: CacheState) -> list[tuple[str, CacheState]]:
    a_blocks = s.sequences[0].block_ids  # a: published 3 <- 4, private 5
    b_blocks = s.sequences[1].block_ids  # b: shares 3, 4; private 6
    assert b_blocks[:2] == a_blocks[:2]
    root, child, tail_a = a_blocks
    cached_root = 0  # x's (7, 7) chain: 0 <- 1, refcount 0
    free_block = s.free_queue[0]
    return [
        ("INV-REF", _set_block(s, root, refcount=3)),
        ("INV-REF", _set_seq(s, 1, block_ids=(root, root, b_blocks[2]))),
        ("INV-PARTITION", attrs.evolve(s, free_queue=(*s.free_queue, cached_root))),
        (
            "INV-PARTITION",
            attrs.evolve(
                s,
                free_queue=s.free_queue[1:],
                stats=attrs.evolve(s.stats, num_free_blocks=s.stats.num_free_blocks - 1),
            ),
        ),
        ("INV-INDEX", attrs.evolve(s, index=tuple(sorted((*s.index, (5, free_block)))))),
        ("INV-INDEX", attrs.evolve(s, index=s.index[1:])),
        ("INV-ANCESTOR", _set_block(s, child, parent=tail_a)),
        ("INV-ANCESTOR", _set_block(s, child, depth=5)),
        ("INV-WRITE", _set_seq(s, 0, num_computed=2)),
        ("INV-PUBLISH", _set_block(s, child, token_ids=(3, 5))),
        # b's window would start at its shared block 4, which its KV has not covered yet
        ("INV-WINDOW", _set_seq(s, 1, num_cached_tokens=2, num_window_blocks=1, num_computed=3)),
        ("INV-MATCH", _set_seq(s, 1, spans=((3, 6),))),  # b's hit ends inside a span
        ("INV-LIMIT", _set_seq(s, 0, num_reserved=7)),
        ("INV-LIMIT", _set_seq(s, 1, num_computed=7, num_reserved=6)),
        ("INV-STATS", attrs.evolve(s, stats=attrs.evolve(s.stats, hits=s.stats.queries + 1))),
        (
            "INV-STATS",
            attrs.evolve(s, stats=attrs.evolve(s.stats, prefill_tokens_computed=0)),
        ),
    ]


@pytest.mark.parametrize("index", range(16))
def test_invariants_name_the_broken_one(index: int) -> None:
    """invariants.check names the invariant a hand-corrupted snapshot breaks."""
    name, corrupt = _corruptions(_busy_state())[index]
    assert name in {v.invariant for v in violations(corrupt)}
    with pytest.raises(InvariantViolation) as info:
        check(corrupt)
    assert name in {v.invariant for v in info.value.violations}


@pytest.mark.parametrize("index", range(16))
def test_skipped_invariants_are_exactly_the_ones_left_out(index: int) -> None:
    """``violations(s, skip=...)`` is ``violations(s)`` less the skipped invariants, in the
    same order, for every corruption and every subset the conformance kit relaxes."""
    _, corrupt = _corruptions(_busy_state())[index]
    full = violations(corrupt)
    names = sorted({v.invariant for v in full} | {"INV-PUBLISH", "INV-INDEX"})
    for skip in ({n} for n in names):
        assert violations(corrupt, skip=skip) == [v for v in full if v.invariant not in skip]
    relaxed = {"INV-PUBLISH", "INV-WRITE", "INV-ANCESTOR", "INV-INDEX", "INV-CKPT"}
    assert violations(corrupt, skip=relaxed) == [v for v in full if v.invariant not in relaxed]


def test_every_checked_invariant_is_corrupted_once() -> None:
    """The corruption table covers every invariant check() evaluates."""
    from prefixkv.spec.invariants import INVARIANTS

    covered = {name for name, _ in _corruptions(_busy_state())}
    assert covered == set(INVARIANTS)


def test_check_match_and_check_unchanged_name_their_invariant() -> None:
    """check_match raises INV-MATCH on a bad match; check_unchanged raises INV-TXN."""
    c = cache()
    run_prompt(c, "a", (1, 2, 3, 4, 5))
    req = Request("b", (1, 2, 3, 4), NS)
    for bad in (
        Match(4, 4, (0, 1)),  # leaves nothing to compute
        Match(4, 3, (0,)),  # not block-aligned
        Match(4, 2, (1,)),  # block 1 is not the request's first block
        Match(4, 2, (2,)),  # block 2 is not published
    ):
        with pytest.raises(InvariantViolation) as info:
            check_match(c, req, bad)
        assert info.value.invariant == "INV-MATCH"
    before = c.snapshot()
    c.take_events()
    with pytest.raises(InvariantViolation) as info:
        check_unchanged(before, c.snapshot(), "take_events")
    assert info.value.invariant == "INV-TXN"
