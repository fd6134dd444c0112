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
