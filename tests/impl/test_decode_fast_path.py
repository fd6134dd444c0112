"""The decode fast paths of the impl (``commit``, ``advance``, ``advance_batch``).

Each fast path must be invisible: the same states as the per-call API and the spec, and on
any input its predicates do not vouch for, the general path's typed error with nothing
changed. The differential machines check this at random; these tests pin the edges.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    BatchOutcome,
    DecodeStep,
    DuplicateSequence,
    InvalidRequest,
    Namespace,
    PrefixCacheError,
    Request,
    SpecCache,
)
from prefixkv.spec.steps import check_batch

NS = Namespace("m")


def _decoding(cls: type[Any], block_size: int = 4, pending: int = 1) -> Any:
    """A cache with sequence 1 past its prompt, ``pending`` slots reserved, not computed."""
    cache = cls(96, block_size)
    adm = cache.admit(Request(1, [3, 1, 4, 1, 5], NS))
    cache.commit(1, adm.num_scheduled_tokens, [9])
    cache.append(1, pending)
    return cache


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("reserve", [0, 1, 2])
def test_call_shapes_agree_with_the_spec(block_size: int, reserve: int) -> None:
    """Per call, fused and batched decode steps leave the spec's state after every step,
    across block boundaries (where the fast path hands over to the general one)."""
    spec = _decoding(SpecCache, block_size)
    percall, fused, batched = (_decoding(PrefixCacheManager, block_size) for _ in range(3))
    for step in range(24):
        tok = (100 + step,)
        spec.commit(1, 1, tok)
        percall.commit(1, 1, tok)
        want = spec.append(1, reserve) if reserve else []
        assert (percall.append(1, reserve) if reserve else []) == want
        assert fused.advance(1, 1, tok, num_reserve=reserve) == want
        out = batched.advance_batch([DecodeStep(1, 1, tok, num_reserve=reserve)])
        assert out == BatchOutcome((tuple(want),)) and out.ok
        expected = spec.snapshot()
        for cache in (percall, fused, batched):
            assert cache.snapshot() == expected, (step, cache)
        if not reserve:  # nothing left to commit: reserve the next token per call
            for cache in (spec, percall, fused, batched):
                cache.append(1, 1)


#: ``advance`` arguments that look like a decode step but must be refused, with the error the
#: spec raises. Each one fails exactly one predicate of the fast path.
BAD_ADVANCE: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "bool seq id": ((True, 1, (7,)), {}),
    "unknown seq id": ((2, 1, (7,)), {}),
    "float num_computed": ((1, 1.0, (7,)), {}),
    "bool num_computed": ((1, True, (7,)), {}),
    "negative num_computed": ((1, -1, (7,)), {}),
    "past the reservation": ((1, 3, (7, 8, 9)), {}),
    "past the known tokens": ((1, 2, ()), {}),
    "negative token": ((1, 1, (-1,)), {}),
    "token past uint32": ((1, 1, (2**32,)), {}),
    "bool token": ((1, 1, (True,)), {}),
    "float token": ((1, 1, [7.0]), {}),
    "tokens as a string": ((1, 1, "7"), {}),
    "bool num_reserve": ((1, 1, (7,)), {"num_reserve": True}),
    "negative num_reserve": ((1, 1, (7,)), {"num_reserve": -1}),
    "bool num_rejected": ((1, 1, (7,)), {"num_rejected": False}),
    "float num_rejected": ((1, 1, (7,)), {"num_rejected": 0.0}),
}


def _raised(call: Any) -> type[BaseException] | None:
    try:
        call()
    except PrefixCacheError as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("kind", sorted(BAD_ADVANCE))
def test_bad_decode_step_raises_as_the_spec(kind: str) -> None:
    """Refused with the spec's typed error by ``advance``, ``advance_batch`` (in the
    outcome) and, for the commit's own arguments, ``commit``; nothing changes."""
    args, kwargs = BAD_ADVANCE[kind]
    spec, impl = _decoding(SpecCache, pending=2), _decoding(PrefixCacheManager, pending=2)
    assert not _raised(lambda: _decoding(PrefixCacheManager, pending=2).advance(1, 1, (7,)))
    want = _raised(lambda: spec.advance(*args, **kwargs))
    assert want is not None and issubclass(want, PrefixCacheError)
    before = impl.snapshot()
    assert _raised(lambda: impl.advance(*args, **kwargs)) is want
    assert impl.snapshot() == before
    if kind != "bool seq id":  # a bool id is a malformed batch: check_batch raises
        out = impl.advance_batch([DecodeStep(*args, **kwargs)])
        assert out.num_applied == 0 and type(out.error) is want
        assert out == BatchOutcome((), out.error, args[0])
        assert impl.snapshot() == before
    if not kwargs:
        assert _raised(lambda: impl.commit(*args)) is _raised(lambda: spec.commit(*args))
        assert impl.snapshot() == before


def test_a_boundary_step_in_a_full_pool_runs_without_a_saved_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that publishes the sequence's own next block and allocates one, in a pool
    whose supply is below the block's index, runs inline: publishing under a parent the
    sequence holds anchors nothing, so no copy of the state is needed (it used to take one
    whenever the supply was below ``stop - 1``: a copy of the whole pool per block)."""
    spec, impl = SpecCache(24, 2), PrefixCacheManager(24, 2)

    def no_copy(*_: Any) -> list[int]:
        raise AssertionError("the step took the saved-state path")

    monkeypatch.setattr(PrefixCacheManager, "_advance_saved", no_copy)
    for cache in (spec, impl):
        cache.admit(Request(1, list(range(31)), NS))  # 16 of 24 blocks
        cache.commit(1, 31, [99])
        cache.append(1, 1)
    assert impl.stats().num_free_blocks == 8
    for step in range(14):  # 7 boundary steps, the supply falls to 1
        tok = (200 + step,)
        spec.commit(1, 1, tok)
        want = spec.append(1, 1)
        assert impl.advance(1, 1, tok) == want
        assert impl.snapshot() == spec.snapshot()
    assert impl.stats().num_free_blocks == 1


@pytest.mark.parametrize("twin", [False, True], ids=["new", "twin"])
def test_the_prefill_commit_in_a_full_pool_runs_without_a_saved_state(
    monkeypatch: pytest.MonkeyPatch, twin: bool
) -> None:
    """The step that commits a whole prefill and reserves the first decode slot, in a pool
    with one block of supply left: none of the prompt blocks' keys is filed, so their
    publication anchors nothing and the step runs inline (it used to take a saved copy of
    the state whenever the supply was within the prompt's length in blocks). With a twin
    published in between, the bound stays the cautious one, and the outcome the spec's."""
    spec, impl = SpecCache(18 if twin else 10, 2), PrefixCacheManager(18 if twin else 10, 2)
    saved: list[int] = []
    real = PrefixCacheManager._advance_saved

    def counted(self: PrefixCacheManager, *args: Any) -> list[int]:
        saved.append(1)
        return real(self, *args)

    monkeypatch.setattr(PrefixCacheManager, "_advance_saved", counted)
    prompt = list(range(16))  # 8 full blocks: the reservation needs a 9th
    for cache in (spec, impl):
        cache.admit(Request(1, prompt, NS))
        cache.admit(Request(2, [500, 501], NS))  # one free block left
        if twin:
            cache.admit(Request(3, prompt, NS))  # the same prompt, in blocks of its own
            cache.commit(3, 16, [7])  # published first: seq 1's blocks become duplicates
    assert impl.stats().num_free_blocks == 1
    want = spec.advance(1, 16, (99,), num_reserve=1)
    assert impl.advance(1, 16, (99,), num_reserve=1) == want
    assert impl.snapshot() == spec.snapshot()
    assert saved == ([1] if twin else [])


def test_decode_step_is_a_light_immutable_record() -> None:
    """Positional and keyword construction, equality, hash, repr, immutability."""
    step = DecodeStep("s", 1, (7,), num_reserve=2)
    assert step == DecodeStep("s", 1, (7,), 0, 2)
    assert step != DecodeStep("s", 1, (7,), 0, 1)
    assert hash(step) == hash(DecodeStep("s", 1, (7,), 0, 2))
    assert repr(step) == (
        "DecodeStep(seq_id='s', num_computed=1, accepted_tokens=(7,), num_rejected=0, "
        "num_reserve=2)"
    )
    assert DecodeStep(seq_id="s", num_computed=0) == DecodeStep("s", 0, (), 0, 1)
    with pytest.raises(AttributeError):
        step.num_reserve = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        DecodeStep("s")  # type: ignore[call-arg]


def test_check_batch_accepts_only_decode_steps() -> None:
    """A plain tuple of the same fields is not a step, nor is a step a batch."""
    step = DecodeStep("s", 1)
    assert list(check_batch((step,))) == [step]
    assert list(check_batch([step, DecodeStep("t", 0)])) == [step, DecodeStep("t", 0)]
    for bad in ([("s", 1, (), 0, 1)], step, "s", 7, [DecodeStep(True, 1)]):
        with pytest.raises(InvalidRequest):
            check_batch(bad)
    with pytest.raises(DuplicateSequence):
        check_batch([step, DecodeStep("s", 2)])
    out = BatchOutcome(((), (3,)))
    assert out.ok and out.num_applied == 2 and out.error is None and out.failed_seq_id is None
    out.raise_for_error()


# -- the steps that complete a block (advance's and commit's lean paths) -----------------


def _checked_paths_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a valid step reaches the general (checked) paths."""

    def forbidden(*_: Any) -> Any:
        raise AssertionError("a valid step took the general path")

    for name in ("_advance_general", "_check_commit_args"):
        monkeypatch.setattr(PrefixCacheManager, name, forbidden)


@pytest.mark.parametrize("shape", ["percall", "fused", "batched"])
@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_valid_steps_never_take_the_general_path(
    monkeypatch: pytest.MonkeyPatch, shape: str, block_size: int
) -> None:
    """The prefill commit (several blocks), every block-completing step (publish, then
    reserve the next block) and every step inside a block run without the general path,
    and leave the spec's state, events and statistics."""
    spec = SpecCache(48, block_size, record_events=True)
    impl = PrefixCacheManager(48, block_size, record_events=True)
    for cache in (spec, impl):
        cache.admit(Request(1, list(range(9)), NS))
        # The same prompt, committed second: its blocks stay private duplicates, so its
        # decode blocks publish under sequence 1's (canonical) blocks.
        cache.admit(Request(2, list(range(9)), NS))
    _checked_paths_forbidden(monkeypatch)
    for step in range(3 * block_size + 2):
        for sid in (1, 2):
            c, tok = (9, (50 + sid,)) if step == 0 else (1, (100 + step,))
            spec.commit(sid, c, tok)
            want = spec.append(sid, 1)
            if shape == "percall":
                impl.commit(sid, c, tok)
                assert impl.append(sid, 1) == want
            elif shape == "fused":
                assert impl.advance(sid, c, tok) == want
            else:
                out = impl.advance_batch([DecodeStep(sid, c, tok)])
                assert out == BatchOutcome((tuple(want),))
            assert impl.snapshot() == spec.snapshot(), (step, sid)
    assert impl.take_events() == spec.take_events()
    assert impl.stats() == spec.stats()


def test_a_batch_reports_each_steps_new_blocks_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a batch where only some steps complete a block and allocate, the outcome holds
    each step's new blocks at its own position and () elsewhere."""
    spec, impl = SpecCache(64, 4), PrefixCacheManager(64, 4)
    for cache in (spec, impl):
        for sid, n in ((1, 7), (2, 5), (3, 3), (4, 6)):  # 1 and 3 fill a block next step
            adm = cache.admit(Request(sid, [sid * 10 + i for i in range(n)], NS))
            cache.commit(sid, adm.num_scheduled_tokens, [9])
            cache.append(sid, 1)
    _checked_paths_forbidden(monkeypatch)
    batch = [DecodeStep(sid, 1, (70 + sid,)) for sid in (1, 2, 3, 4)]
    out = impl.advance_batch(batch)
    want = spec.advance_batch(batch)
    assert out == want and out.ok
    assert [bool(b) for b in out.new_blocks] == [True, False, True, False]
    assert impl.snapshot() == spec.snapshot()


#: A valid step that completes block 1 (slots 4..7) and reserves into block 2, on
#: ``_decoding(cls, pending=3)``: 5 computed, 6 tokens known, 8 reserved.
BOUNDARY_STEP = (1, 3, (7, 8))

#: Each bad input, at that boundary: each fails one predicate of the lean path.
BAD_AT_BOUNDARY: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "float num_computed": ((1, 3.0, (7, 8)), {}),
    "bool num_computed": ((1, True, (7, 8, 9)), {}),
    "one past the reservation": ((1, 4, (7, 8, 9)), {}),
    "one past the known tokens": ((1, 3, (7,)), {}),
    "negative token": ((1, 3, (7, -1)), {}),
    "token past uint32": ((1, 3, (7, 2**32)), {}),
    "bool token": ((1, 3, (7, False)), {}),
    "negative num_reserve": ((1, 3, (7, 8)), {"num_reserve": -1}),
    "bool num_reserve": ((1, 3, (7, 8)), {"num_reserve": True}),
    "float num_rejected": ((1, 3, (7, 8)), {"num_rejected": 0.0}),
    "unknown seq id": ((2, 3, (7, 8)), {}),
}


@pytest.mark.parametrize("kind", sorted(BAD_AT_BOUNDARY))
def test_bad_step_at_a_block_boundary_raises_as_the_spec(kind: str) -> None:
    """At the step that would publish and allocate, each bad input is refused with the
    spec's error by advance, advance_batch and commit, and changes nothing."""
    args, kwargs = BAD_AT_BOUNDARY[kind]
    assert not _raised(lambda: _decoding(PrefixCacheManager, pending=3).advance(*BOUNDARY_STEP))
    spec, impl = _decoding(SpecCache, pending=3), _decoding(PrefixCacheManager, pending=3)
    want = _raised(lambda: spec.advance(*args, **kwargs))
    assert want is not None and issubclass(want, PrefixCacheError)
    before, stats = impl.snapshot(), impl.stats()
    assert _raised(lambda: impl.advance(*args, **kwargs)) is want
    assert impl.snapshot() == before and impl.stats() == stats
    out = impl.advance_batch([DecodeStep(*args, **kwargs)])
    assert out.num_applied == 0 and type(out.error) is want
    assert impl.snapshot() == before and impl.stats() == stats
    if not kwargs:
        assert _raised(lambda: impl.commit(*args)) is _raised(lambda: spec.commit(*args))
        assert impl.snapshot() == before and impl.stats() == stats


@pytest.mark.parametrize("free", [0, 1])
@pytest.mark.parametrize("shape", ["fused", "batched"])
def test_boundary_step_at_the_edge_of_the_supply(
    monkeypatch: pytest.MonkeyPatch, free: int, shape: str
) -> None:
    """The step that publishes a block and needs the next one: with one block left it runs
    on the lean path; with none, the spec's OutOfBlocks and nothing changed."""
    spec, impl = (cls(6, 4) for cls in (SpecCache, PrefixCacheManager))
    for cache in (spec, impl):
        adm = cache.admit(Request(1, [3, 1, 4, 1, 5], NS))  # 2 blocks
        cache.commit(1, adm.num_scheduled_tokens, [9])
        cache.append(1, 3)  # 8 reserved: the blocks are full
        cache.admit(Request(2, list(range(100, 100 + 4 * (4 - free))), NS))
    assert impl.stats().num_free_blocks == free
    before = impl.snapshot()
    if free:
        _checked_paths_forbidden(monkeypatch)
    want = _raised(lambda: spec.advance(*BOUNDARY_STEP))
    if shape == "fused":
        got = _raised(lambda: impl.advance(*BOUNDARY_STEP))
    else:
        out = impl.advance_batch([DecodeStep(*BOUNDARY_STEP)])
        got = None if out.error is None else type(out.error)
    assert got is want and (want is None) == bool(free)
    assert impl.snapshot() == (spec.snapshot() if free else before)
