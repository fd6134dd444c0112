"""Room promises (CAN-ADMIT, CAN-APPEND, CAN-CONTINUE): the counts, on the spec's own
snapshots, and the broken promise reported before the operation that would run out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit_runs import first_failure
from prefixkv.spec import Namespace, OutOfBlocks, Request, SeqId, SpecCache

from examples.minimal_engine_adapter import BUG_FACTORIES
from prefixkv.conformance import Capabilities, adapter
from prefixkv.conformance.failures import message_shape
from prefixkv.conformance.room import Room, admission_room, append_room, continue_room

_NS = Namespace("m")
BS = 2


def _cached(cache: SpecCache, seq_id: str, tokens: list[int]) -> None:
    """Admit, compute and free a prompt: its full blocks stay cached, evictable."""
    adm = cache.admit(Request(seq_id, tokens, _NS))
    cache.commit(seq_id, adm.num_scheduled_tokens, (0,))
    cache.free([seq_id])


def _room(cache: SpecCache, req: Request, budget: int | None = None) -> Room:
    return admission_room(cache.snapshot(), req, budget, cache.match(req))


def _need(room: Room | None) -> int:
    assert room is not None
    return room.need


def test_an_admission_pins_its_evictable_hits_before_it_counts_the_supply() -> None:
    cache = SpecCache(4, BS)
    _cached(cache, "a", [1, 2, 3, 4, 5])  # blocks [1 2] [3 4] cached, two blocks free
    fits = Request("b", [1, 2, 3, 4, 9, 9, 9], _NS)  # 2 hits + 2 new blocks
    room = _room(cache, fits)
    assert (room.need, room.free, room.evictable, room.own_hits) == (2, 2, 2, 2)
    assert not room.short and cache.can_admit(fits)
    # one more block: the two cached blocks are the request's own hits, not supply
    over = Request("c", [1, 2, 3, 4, 9, 9, 9, 9, 9], _NS)
    room = _room(cache, over)
    assert (room.need, room.supply) == (3, 2) and room.short
    assert not cache.can_admit(over)
    # without the hits, the same cached blocks are supply: they can be evicted
    miss = Request("d", [7, 7, 7, 7, 7, 7, 7], _NS)
    room = _room(cache, miss)
    assert (room.need, room.own_hits, room.supply) == (4, 0, 4) and not room.short


def test_a_budget_and_a_recompute_window_size_the_admission() -> None:
    cache = SpecCache(8, BS)
    _cached(cache, "a", [1, 2, 3, 4, 5, 6, 7])
    req = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9], _NS)  # 3 hits, then 3 blocks of 5 tokens
    assert _room(cache, req).need == 2
    assert _room(cache, req, budget=1).need == 1  # 7 slots: one block past the hits
    window = Request("w", [1, 2, 3, 4, 5, 6, 7, 8, 9], _NS, recompute_blocks=2)
    room = _room(cache, window)  # the window's two blocks are recomputed into new ones
    assert (room.need, room.own_hits) == (4, 1)


def test_an_append_needs_only_the_blocks_past_its_reservation() -> None:
    cache = SpecCache(4, BS)
    cache.admit(Request("a", [1, 2, 3], _NS))  # 3 slots in 2 blocks: one slot to spare
    state = cache.snapshot()
    assert [_need(append_room(state, "a", n)) for n in (1, 2, 3, 4)] == [0, 1, 1, 2]
    room = append_room(state, "a", 6)
    assert room is not None and (room.need, room.supply, room.short) == (3, 2, True)
    with pytest.raises(OutOfBlocks):
        cache.append("a", 6)
    assert append_room(state, "ghost", 1) is None


def test_a_chunk_is_sized_by_its_limit() -> None:
    cache = SpecCache(8, BS)
    cache.admit(Request("a", list(range(1, 10)), _NS, kv_token_limit=4))  # 4 of 9 tokens
    cache.commit("a", 4)
    state = cache.snapshot()
    room = continue_room(state, "a", None)
    assert room is not None and room.need == 2  # slots 4..8: blocks 2 and 3
    assert _need(continue_room(state, "a", 1)) == 1


def test_the_message_has_one_shape_whatever_the_counts() -> None:
    a = Room(3, 1, 4, 4).broken("admit(1, None): a prompt of 9 tokens")
    b = Room(5, 0, 13, 12).broken("admit('x', 4): a prompt of 30 tokens")
    assert a.startswith("can_admit said True, but admit needs 3 new blocks")
    assert "1 free + 4 evictable - 4 evictable blocks it hits" in a
    assert message_shape(a) == message_shape(b)
    assert "pins" not in Room(2, 1, 0).broken("append(1, 4): ...")


_TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=9)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.tuples(_TOKENS, st.booleans()), max_size=6),
    probe=_TOKENS,
    budget=st.none() | st.integers(1, 6),
    grow=st.integers(1, 7),
)
def test_the_spec_never_promises_more_than_the_counts(
    prompts: list[tuple[list[int], bool]], probe: list[int], budget: int | None, grow: int
) -> None:
    """The spec is a correct cache: whenever its room query says yes, the counts agree
    (no false alarm), and the operation then succeeds."""
    cache = SpecCache(6, BS)
    for i, (tokens, keep) in enumerate(prompts):
        req = Request(i, tokens, _NS)
        if not cache.can_admit(req):
            continue
        adm = cache.admit(req)
        cache.commit(i, adm.num_scheduled_tokens, (0,))
        if not keep:
            cache.free([i])
    req = Request("p", probe, _NS)
    if cache.can_admit(req, budget):
        assert not _room(cache, req, budget).short
    for seq_id in cache.seq_ids():
        if cache.can_append(seq_id, grow):
            room = append_room(cache.snapshot(), seq_id, grow)
            assert room is not None and not room.short


def test_hits_counted_free_is_a_broken_promise_before_the_admission() -> None:
    """The minimal engine that counts its evictable hits as free: the kit names the broken
    promise at ``can_admit``, with the counts, and never issues the admission that would
    run its free list dry (it was a CRASH of ``admit`` before)."""
    failure = first_failure(BUG_FACTORIES["hits_counted_free"])
    assert failure.check == "CAN-ADMIT", str(failure)
    assert "evictable blocks it hits and pins first" in str(failure)
    assert failure.report.failures[0].operation == "can_admit"


class _PromisesEveryChunk(SpecCache):
    """The spec, but its chunk query sizes one token, whatever the budget (the decode check
    of ``extend_checks_one_page``, on chunks): it promises chunks the pool cannot hold."""

    def can_continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> bool:
        return super().can_continue_prefill(seq_id, 1)


@adapter(capabilities=Capabilities(exact=False))
def _promising(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
    return _PromisesEveryChunk(num_blocks, block_size, record_events=record_events)


def test_a_chunk_promised_without_room_is_named_at_the_query() -> None:
    failure = first_failure(_promising)
    assert failure.check == "CAN-CONTINUE", str(failure)
    assert failure.report.failures[0].operation == "can_continue_prefill", str(failure)
    assert "can_continue_prefill said True, but continue_prefill needs" in str(failure)
