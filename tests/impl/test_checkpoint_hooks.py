"""The checkpoint store reaches every call that can move a reservation, fused paths included.

A checkpoint reservation is best-effort: when no state slot is free, the sequence has none,
and every later call that follows the save point (the spec's ``on_reserve``: admission,
commit, append, rollback, a prefill chunk) tries again. So a call that changes nothing of
the KV side (a commit within a block, an append within the held blocks, the fused decode
step) still takes a slot that has come free since. The manager's fast paths skip the
store's hooks, so with a store they must be off; each scenario below reaches the retry
through one of them and compares the manager with the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prefixkv.impl import CheckpointStore, HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import HybridSpecCache, Namespace, Request, StateRef

NS = Namespace("hybrid-llm@1")


def _starved(cls: type[Any]) -> Any:
    """``a`` is prefilling 10 tokens with no reservation (both slots were held when it was
    admitted); then ``b`` is freed, and a slot is free again."""
    cache = cls(16, 4, max_num_seqs=2, state_budget=0)
    cache.admit(Request("b", [1, 2, 3], NS))  # no save point: a runtime slot only
    cache.admit(Request("a", list(range(10, 20)), NS))
    assert cache.checkpoint_reservation("a") is None
    cache.free(["b"])
    return cache


#: Calls on ``a`` that leave its KV as it is (no block completed, none allocated).
CALLS: dict[str, Callable[[Any], object]] = {
    "commit within a block": lambda c: c.commit("a", 1),
    "advance within a block": lambda c: c.advance("a", 1, (), num_reserve=0),
    "advance_batch within a block": lambda c: c.advance_columns(["a"], [1], [()], 0, 0),
}


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_a_call_within_a_block_retries_the_reservation(call: str) -> None:
    got = []
    for cls in (HybridSpecCache, HybridPrefixCacheManager):
        cache = _starved(cls)
        CALLS[call](cache)
        got.append((cache.checkpoint_reservation("a"), cache.snapshot().state_slots))
    assert got[0][0] == StateRef(0, 8)  # b's slot; the prompt's last full block
    assert got[1] == got[0]


def test_an_append_within_the_held_blocks_follows_the_save_point() -> None:
    """A decode checkpoint every 4 tokens: appending one slot within the last held block
    moves the save point, and so the reservation."""
    got = []
    for cls in (HybridSpecCache, HybridPrefixCacheManager):
        cache = cls(16, 4, max_num_seqs=1, state_budget=1, decode_state_interval=4)
        adm = cache.admit(Request("a", [1, 2, 3, 4, 5, 6], NS))
        cache.commit("a", adm.num_scheduled_tokens, [7])  # 6 computed: save point 4 is past
        cache.append("a", 1)
        cache.commit("a", 1)  # 7 computed, 7 reserved
        cache.append("a", 1)  # 8 reserved, within the held blocks: save point 8
        got.append((cache.checkpoint_reservation("a"), cache.snapshot().state_slots))
    assert got[0][0] == StateRef(1, 8)
    assert got[1] == got[0]


def test_the_fused_paths_are_off_only_with_a_store() -> None:
    plain = PrefixCacheManager(16, 4)
    store = CheckpointStore(max_num_seqs=1, state_budget=0)
    hybrid = PrefixCacheManager(16, 4, checkpoints=store)
    assert plain._fused_inline and not hybrid._fused_inline
    assert hybrid.stats().num_state_slots == 1  # the hooks are the store's


def test_a_store_serves_one_cache() -> None:
    from prefixkv.errors import InvalidConfig

    store = CheckpointStore(max_num_seqs=1, state_budget=0)
    PrefixCacheManager(16, 4, checkpoints=store)
    with pytest.raises(InvalidConfig, match="serves a cache already"):
        PrefixCacheManager(16, 4, checkpoints=store)
