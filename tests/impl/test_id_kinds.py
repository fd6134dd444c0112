"""Every valid sequence id, not only a plain ``int`` or ``str``, behaves as the spec says.

The managers' hot paths look a sequence up directly when its id is exactly an ``int`` or a
``str`` and fall back to the contract's check for anything else. A fallback that answers
differently (the hybrid ``commit`` once took 0 computed tokens for any other id, so routed
experts landed on the wrong block) is a wrong result, so each scripted life cycle here runs
with subclasses of ``int`` and ``str`` and ``IntEnum`` members on the spec and the impl and
compares their snapshots. The differential machines draw the same id kinds
(:func:`prefixkv.conformance.machines.strategies.seq_id_of`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import DecodeStep, HybridSpecCache, Namespace, Request, SpecCache

NS = Namespace("tiny-llm@1")


class IdInt(int):
    pass


class IdStr(str):
    pass


class IdEnum(enum.IntEnum):
    FIRST = 7
    SECOND = 8


IDS: dict[str, tuple[Any, Any]] = {
    "int": (7, 8),
    "str": ("a", "b"),
    "int-subclass": (IdInt(7), IdInt(8)),
    "str-subclass": (IdStr("a"), IdStr("b")),
    "IntEnum": (IdEnum.FIRST, IdEnum.SECOND),
}


def _experts_by_block(cache: Any) -> dict[int, bytes | None]:
    return {v.block_id: v.routed_experts for v in cache.snapshot().blocks if v.published}


def _hybrid_life(make: Callable[..., Any], first: Any, second: Any) -> Any:
    """Prefill in chunks with routed experts on the later blocks, decode, hit, free."""
    c = make(16, 2, max_num_seqs=4, state_budget=2, record_events=True)
    c.admit(Request(first, tuple(range(1, 8)), NS), 2)
    c.commit(first, 2)  # block 0, no experts
    c.continue_prefill(first, 4)
    c.commit(first, 4, routed_experts=[b"e1", b"e2"])  # blocks 1 and 2
    c.append(first, 1)
    c.commit(first, 1, (9,))
    c.append(first, 1)
    c.advance(first, 1, (10,), num_reserve=1)
    adm = c.admit(Request(second, tuple(range(1, 8)), NS))
    assert adm.num_cached_tokens == 6
    c.free([first])
    return c


def _plain_life(make: Callable[..., Any], first: Any, second: Any) -> Any:
    c = make(8, 2, record_events=True)
    c.admit(Request(first, (1, 2, 3, 4, 5), NS))
    c.commit(first, 5, (6,))
    c.append(first, 1)
    out = c.advance_batch([DecodeStep(first, 1, (7,), num_reserve=1)])
    assert out.error is None
    c.admit(Request(second, (1, 2, 3, 4, 9), NS))
    c.rollback(second, 1)
    c.append(second, 1)
    c.commit(second, 1, (3,))
    c.free([first, second])
    return c


@pytest.mark.parametrize("kind", sorted(IDS))
def test_hybrid_routed_experts_land_on_the_spec_block(kind: str) -> None:
    first, second = IDS[kind]
    spec = _hybrid_life(HybridSpecCache, first, second)
    impl = _hybrid_life(HybridPrefixCacheManager, first, second)
    assert _experts_by_block(impl) == _experts_by_block(spec)
    assert _experts_by_block(spec)[2] == b"e2"
    assert impl.snapshot() == spec.snapshot()


@pytest.mark.parametrize("kind", sorted(IDS))
def test_manager_matches_the_spec_for_every_id_kind(kind: str) -> None:
    first, second = IDS[kind]
    spec = _plain_life(SpecCache, first, second)
    impl = _plain_life(PrefixCacheManager, first, second)
    assert impl.snapshot() == spec.snapshot()
