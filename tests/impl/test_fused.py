"""The fused steps (``impl/_fused.py``) in front of the manager's semantic core."""

from __future__ import annotations

from prefixkv.impl import PrefixCacheManager
from prefixkv.impl._fused import FusedSteps
from prefixkv.impl.hybrid import HybridPrefixCacheManager


def test_the_fused_steps_come_before_the_core() -> None:
    """``advance``, the batch calls and ``commit`` resolve to the fused layer; ``commit``'s
    fast path falls back to the core's checked commit, next in the method order."""
    mro = PrefixCacheManager.__mro__
    assert mro[1] is FusedSteps
    for name in ("advance", "advance_batch", "advance_columns", "commit"):
        assert getattr(PrefixCacheManager, name) is getattr(FusedSteps, name), name
    assert "commit" in vars(mro[2]) and "advance" not in vars(mro[2])


def test_the_fast_paths_switch_is_an_instance_attribute() -> None:
    """Every fast-path gate reads ``self._fused_inline``, set per manager: on for the
    manager, off for the hybrid one (whose commit, rollback and append do more)."""
    assert "_fused_inline" not in vars(PrefixCacheManager)
    assert "_fused_inline" not in vars(HybridPrefixCacheManager)
    assert PrefixCacheManager(8, 2)._fused_inline is True
    hybrid = HybridPrefixCacheManager(8, 2, max_num_seqs=1, state_budget=1)
    assert hybrid._fused_inline is False
