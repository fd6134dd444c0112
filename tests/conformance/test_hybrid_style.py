"""The hybrid-model example manager: its own API first, then the kit's checkpoints capability.

The kit part shows that the correct manager passes under its declared capabilities, that
each classic bug of :data:`examples.hybrid_style.BUGS` is caught by the check named here,
and that prefixkv's own hybrid manager passes the same machines in exact mode.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit_runs import FIND_ONLY, STEPS, first_failure, passes, shortest_failure

from examples.hybrid_style import BUGS, HybridRadixManager, HybridReq
from examples.hybrid_style_adapter import (
    ALIGNED_BUG_FACTORIES,
    BUG_FACTORIES,
    CAPABILITIES,
    make_aligned_manager,
    make_manager,
)
from prefixkv.conformance import Capabilities, ConformanceFailure, adapter, run_conformance
from prefixkv.conformance.reference_adapters import hybrid_impl_adapter
from prefixkv.conformance.runner import required_operations

PS = 2


def _manager(**kwargs: int) -> HybridRadixManager:
    args = {"num_pages": 12, "page_size": PS, "max_running": 2, "extra_slots": 2, "save_every": 0}
    args.update(kwargs)
    return HybridRadixManager(**args)


def _run(m: HybridRadixManager, rid: Any, tokens: list[int]) -> HybridReq:
    """Admit the whole prompt, issue its restore, compute it, keep the state."""
    r = HybridReq(rid, tokens, b"m")
    assert m.admit(r)
    if r.restore is not None:
        m.restore_issued(r)
    m.record_forward(r, len(tokens) - r.num_cached_tokens, [99])
    m.keep_state(r, r.kv_committed_len)
    return r


# -- the manager's own API -------------------------------------------------------------------


def test_a_hit_ends_at_a_saved_state_and_restores_it() -> None:
    m = _manager()
    a = _run(m, "a", [1, 2, 3, 4, 5])  # saves the state after the last full page: 4
    assert a.save is None and m.saved == 1
    m.cache_finished_req(a)
    b = HybridReq("b", [1, 2, 3, 4, 5, 6, 7], b"m")
    assert m.admit(b) and b.num_cached_tokens == 4 and b.restore is not None
    assert b.state_len is None  # nothing in the running slot until the copy
    with pytest.raises(ValueError):
        m.keep_state(b, 4)
    m.restore_issued(b)
    assert b.state_len == 4 and m.restored == 1


def test_no_saved_state_means_no_hit() -> None:
    m = _manager(max_running=1, extra_slots=0)  # the only slot is the running one
    m.cache_finished_req(_run(m, "a", [1, 2, 3, 4, 5]))
    assert m.saved == 0
    assert m.match([1, 2, 3, 4, 5, 6], b"m")[0] == []


def test_evicting_the_pages_drops_the_checkpoint() -> None:
    m = _manager()
    m.cache_finished_req(_run(m, "a", [1, 2, 3, 4, 5]))
    assert m.ckpts and m.evict(12) == 2
    assert not m.ckpts and m.released_stale == 1 and len(m.mamba.free_slots) == 4


def test_an_aligned_manager_saves_at_multiples_of_its_alignment() -> None:
    m = _manager(save_align_pages=2)  # page_size 2: prompt saves at multiples of 4 tokens
    a = HybridReq("a", list(range(1, 8)), b"m")  # 7 tokens: last full page ends at 6
    assert m.admit(a) and a.save is not None and a.save.length == 4
    assert _manager().save_point(a) == 6  # prefixkv's save point: the last full page
    with pytest.raises(ValueError):
        _manager(save_align_pages=0)


def test_only_the_committed_state_is_kept() -> None:
    m = _manager()
    a = _run(m, "a", [1, 2, 3])  # committed 3, known 4
    m.extend(a, 3)  # the pending token and two drafts
    m.record_forward(a, 2, [5, 6])  # one draft accepted
    m.release_tail(a, 1)
    for bad in (6, 4):  # the rejected draft's state, the stale one
        with pytest.raises(ValueError):
            m.keep_state(a, bad)
    m.keep_state(a, 5)
    assert a.state_len == 5


# -- the conformance kit ---------------------------------------------------------------------

#: bug -> the checks that may catch it first.
EXPECTED = {
    "checkpoint_outlives_its_pages": {"INV-CKPT"},
    "slot_reused_under_checkpoint": {"INV-CKPT"},
    "save_mid_page": {"INV-CKPT"},
    "save_past_schedule": {"INV-CKPT"},
    "restore_skips_tail": {"HYBRID-HIT", "INV-CKPT"},
    "draft_state_kept": {"INV-CKPT", "MUST-RAISE(keep_state)"},
}


def test_every_bug_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(BUGS) == set(BUG_FACTORIES) == set(ALIGNED_BUG_FACTORIES)


def test_the_capability_asks_for_the_hybrid_operations() -> None:
    caps = Capabilities.parse("checkpoints,routed-experts")
    assert caps.checkpoints and caps.routed_experts
    assert {"pending_restore", "runtime_state", "keep_state"} <= set(required_operations(caps))
    assert "keep_state" not in required_operations(Capabilities())
    with pytest.raises(ValueError, match="checkpoints"):
        Capabilities(routed_experts=True)


def test_an_adapter_without_the_hybrid_operations_is_refused() -> None:
    def plain(num_blocks: int, block_size: int, **_: Any) -> Any:
        from examples.radix_style import RadixKVManager
        from examples.radix_style_adapter import RadixStyleAdapter

        return RadixStyleAdapter(RadixKVManager(num_blocks, block_size))

    with pytest.raises(TypeError, match="keep_state"):
        run_conformance(plain, CAPABILITIES, max_examples=1, steps=2, profile="ci")


def test_the_correct_manager_passes_the_kit() -> None:
    assert make_manager.capabilities == CAPABILITIES
    passes(make_manager, examples=60)


def test_the_aligned_manager_passes_in_safety_mode() -> None:
    """Saving the prompt's state every 2 pages is not prefixkv's save point, but safe."""
    passes(make_aligned_manager, examples=60)


def test_the_aligned_manager_fails_at_prefixkv_save_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the safety mode's relaxation the same manager fails INV-CKPT: the relaxed
    reservation check is what lets it pass."""
    from prefixkv.conformance import safety

    exact = safety.inv.checkpoint_violations
    monkeypatch.setattr(
        safety.inv,
        "checkpoint_violations",
        lambda state, *, at_save_point=True: exact(state, at_save_point=True),
    )
    failure = first_failure(make_aligned_manager)
    assert failure.check == "INV-CKPT" and "save point" in str(failure), str(failure)


def test_prefixkv_hybrid_manager_passes_in_exact_mode() -> None:
    """The same machines, step for step against HybridSpecCache."""
    report = run_conformance(hybrid_impl_adapter, max_examples=25, steps=STEPS, profile="ci")
    assert report.rules > 300


def test_exact_mode_catches_a_kept_draft_state() -> None:
    """A hybrid manager whose keep_state accepts a draft's position differs from the spec."""
    from prefixkv.impl import CheckpointStore, HybridPrefixCacheManager

    class KeepsDraftStates(CheckpointStore):
        def keep_state(self, seq_id: Any, position: object, num_computed: int) -> None:
            self._positions[seq_id] = position  # type: ignore[assignment]

    class KeepsDrafts(HybridPrefixCacheManager):
        store_type = KeepsDraftStates

    @adapter(capabilities=hybrid_impl_adapter.capabilities)
    def make(num_blocks: int, block_size: int, **kwargs: Any) -> Any:
        return KeepsDrafts(num_blocks, block_size, **kwargs)

    with pytest.raises(ConformanceFailure) as info:
        run_conformance(make, max_examples=200, steps=STEPS, profile=FIND_ONLY, max_failures=1)
    assert info.value.check in {"DIFF-RAISE(keep_state)", "MUST-RAISE(keep_state)"}


def test_a_query_that_disagrees_with_the_snapshot_fails_hybrid_ref() -> None:
    """An adapter whose pending_restore reports a position one token short (the engine
    would start its forward there) is caught, though its snapshot is right."""
    from prefixkv.spec import StateRef

    from examples.hybrid_style_adapter import HybridStyleAdapter

    class OneShort(HybridStyleAdapter):
        def pending_restore(self, seq_id: Any) -> StateRef | None:
            ref = super().pending_restore(seq_id)
            return None if ref is None else StateRef(ref.slot, ref.position - 1)

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, **kwargs: Any) -> OneShort:
        return OneShort(
            HybridRadixManager(
                num_blocks,
                block_size,
                kwargs["max_num_seqs"],
                kwargs["state_budget"],
                kwargs["decode_state_interval"],
            )
        )

    assert first_failure(make).check == "HYBRID-REF"


@pytest.mark.parametrize("aligned", [False, True], ids=["last-page", "every-2-pages"])
@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_bug_is_caught(bug: str, aligned: bool) -> None:
    """Found without shrinking (the shortest replays are in docs/conformance.md), whichever
    save points the manager chose."""
    factories = ALIGNED_BUG_FACTORIES if aligned else BUG_FACTORIES
    failure = first_failure(factories[bug])
    assert failure.check in EXPECTED[bug], str(failure)


def test_a_bug_shrinks_to_a_short_replay() -> None:
    failure = shortest_failure(BUG_FACTORIES["save_mid_page"])
    assert failure.check == "INV-CKPT" and failure.steps <= 3, failure.format()
    assert "max_num_seqs=" in failure.calls[1]
