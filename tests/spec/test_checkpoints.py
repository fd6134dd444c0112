"""Recurrent-state checkpoints and routed-expert replay (choices 7 and 11), example by example.

Each test runs on the spec and on the impl (the same scenario must give the same answers),
and checks every invariant, INV-CKPT included, after every step.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prefixkv.impl import HybridPrefixCacheManager
from prefixkv.spec import (
    HybridPrefixCache,
    HybridSpecCache,
    InvalidOperation,
    InvalidRequest,
    InvariantViolation,
    Namespace,
    OutOfBlocks,
    OutOfStateSlots,
    PrefixCacheError,
    Request,
    StateSlotPool,
    WrongSlotRole,
    check,
)
from prefixkv.spec.contract import save_point
from prefixkv.spec.hybrid import CHECKPOINT, RUNTIME

NS = Namespace("hybrid-llm@1")
CLASSES = (HybridSpecCache, HybridPrefixCacheManager)


class Checked:
    """Forwards to a cache and checks every invariant after each call."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.cache, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                check(self.cache)

        return call


def make(cls: type[Any], **kwargs: Any) -> Any:
    num_blocks = kwargs.pop("num_blocks", 16)
    args: dict[str, Any] = {"max_num_seqs": 4, "state_budget": 4, "decode_state_interval": 0}
    args.update(kwargs)
    return Checked(cls(num_blocks, 4, **args))


def req(seq_id: Any, n: int, namespace: Namespace = NS, **kwargs: Any) -> Request:
    return Request(seq_id, tuple(range(1, n + 1)), namespace, **kwargs)


def prefill(cache: Any, seq_id: Any, n: int, **kwargs: Any) -> Any:
    adm = cache.admit(req(seq_id, n, **kwargs))
    cache.commit(seq_id, adm.num_scheduled_tokens, [99])
    return adm


@pytest.fixture(params=CLASSES, ids=["spec", "impl"])
def cls(request: pytest.FixtureRequest) -> type[Any]:
    return request.param  # type: ignore[no-any-return]


def test_both_satisfy_the_protocol(cls: type[Any]) -> None:
    assert isinstance(make(cls).cache, HybridPrefixCache)


def test_save_at_last_full_block_then_hit_and_restore(cls: type[Any]) -> None:
    cache = make(cls)
    adm = cache.admit(req("a", 10))
    assert adm.restore_slot is None and adm.state_slot == 0
    # the prompt's last complete block ends at 8: the state is saved there
    assert cache.checkpoint_reservation("a") == (1, 8)
    cache.commit("a", 10, [99])
    assert cache.checkpoint_reservation("a") is None
    b = cache.admit(req("b", 12))
    assert b.num_cached_tokens == 8 and b.restore_slot == 1 and b.state_slot == 2
    restore = cache.pending_restore("b")
    assert restore == (1, 8) and (restore.slot, restore.position) == (1, 8)
    assert cache.runtime_state("b") is None  # the runtime slot holds nothing yet
    with pytest.raises(InvalidOperation):
        cache.keep_state("b", 8)
    # pinned: not Ready, so a third request cannot restore from it meanwhile
    assert cache.match(req("c", 12)).num_cached_tokens == 0
    cache.restore_issued("b")
    assert cache.pending_restore("b") is None
    assert cache.runtime_state("b") == (2, 8)  # the restored state: the forward starts at 8
    assert cache.match(req("c", 12)).restore_slot == 1
    with pytest.raises(InvalidOperation):
        cache.restore_issued("b")
    st = cache.stats()
    assert (st.checkpoints_saved, st.checkpoints_restored) == (1, 1)


def test_no_ready_checkpoint_means_no_hit(cls: type[Any]) -> None:
    # one runtime slot and no budget: the only slot is the running sequence's own
    cache = make(cls, max_num_seqs=1, state_budget=0)
    prefill(cache, "a", 10)
    assert cache.stats().checkpoints_saved == 0
    cache.free(["a"])
    m = cache.match(req("b", 12))
    assert m.num_cached_tokens == 0 and m.lost.checkpoint == 8
    cache.admit(req("b", 12))
    st = cache.stats()
    assert st.lost_checkpoint == 8 and st.hits == 0


def test_budget_zero_borrows_idle_runtime_slots(cls: type[Any]) -> None:
    cache = make(cls, max_num_seqs=2, state_budget=0)
    cache.admit(req("a", 10))
    assert cache.checkpoint_reservation("a") == (1, 8)  # slot 1 is an idle runtime slot
    cache.commit("a", 10, [99])
    # the runtime slot is needed back: slot pressure evicts the unpinned Ready checkpoint
    c = cache.admit(req("c", 5, namespace=Namespace("other")))
    assert c.state_slot == 1 and cache.stats().checkpoints_evicted == 1
    cache.free(["a", "c"])
    assert cache.match(req("b", 12)).num_cached_tokens == 0


def test_restore_owner_aborts(cls: type[Any]) -> None:
    cache = make(cls)
    prefill(cache, "a", 10)
    cache.free(["a"])
    b = cache.admit(req("b", 12))
    assert b.restore_slot is not None
    cache.free(["b"])  # aborted before the restore was issued: the checkpoint is Ready again
    assert cache.match(req("c", 12)).restore_slot == b.restore_slot
    assert cache.stats().checkpoints_restored == 0


def test_evicting_the_node_releases_its_checkpoint(cls: type[Any]) -> None:
    cache = make(cls)
    prefill(cache, "a", 10)
    cache.free(["a"])
    assert cache.evict(16) == 2
    st = cache.stats()
    assert st.checkpoints_released_stale == 1 and st.num_state_slots_used == 0


def test_pinned_checkpoint_is_never_stale(cls: type[Any]) -> None:
    """Eviction cannot reach a pinned checkpoint's node: its restore owner holds it."""
    cache = make(cls, num_blocks=6)
    prefill(cache, "a", 10)
    cache.free(["a"])
    cache.admit(req("b", 9))  # hit 8 tokens, pin, 1 new block
    assert cache.evict(16) == 0
    with pytest.raises(OutOfBlocks):
        cache.admit(req("x", 40, namespace=Namespace("other")))
    assert cache.pending_restore("b") is not None


def test_prefill_chunks_save_at_each_chunk(cls: type[Any]) -> None:
    cache = make(cls)
    cache.admit(req("a", 14, kv_token_limit=6))
    assert cache.checkpoint_reservation("a") == (1, 4)
    cache.commit("a", 6)
    cache.continue_prefill("a")
    assert cache.checkpoint_reservation("a") == (2, 12)  # slot 1 holds the one at 4
    cache.commit("a", 6)
    cache.continue_prefill("a")
    cache.commit("a", 2, [99])
    assert cache.stats().checkpoints_saved == 2
    assert cache.match(req("b", 14)).num_cached_tokens == 12


def test_decode_interval_and_rejected_drafts(cls: type[Any]) -> None:
    cache = make(cls, decode_state_interval=8)
    prefill(cache, "a", 5)  # saved at 4; computed 5, known 6
    assert cache.stats().checkpoints_saved == 1
    cache.append("a", 4)  # tokens 5..8: reaches 8
    slot, pos = cache.checkpoint_reservation("a")
    assert pos == 8
    # only two of the drafts are accepted: 8 is not reached, nothing is published
    cache.commit("a", 2, [7, 7])
    assert cache.checkpoint_reservation("a") == (slot, 8)
    cache.rollback("a", 2)
    assert cache.checkpoint_reservation("a") is None
    st = cache.stats()
    assert (st.checkpoints_saved, st.checkpoints_discarded) == (1, 1)
    cache.append("a", 1)
    cache.commit("a", 1, [7])
    cache.append("a", 1)
    cache.commit("a", 1, [7])  # 8 computed, all accepted: saved
    assert cache.stats().checkpoints_saved == 2
    with pytest.raises(InvalidRequest):
        HybridSpecCache(8, 4, max_num_seqs=1, state_budget=0, decode_state_interval=6)


def test_draft_states_keep_only_the_accepted_one(cls: type[Any]) -> None:
    """With drafts the forward yields a state after every draft token; the engine keeps the
    one after the last accepted token, and a rollback of the rest leaves it consistent."""
    cache = make(cls)
    prefill(cache, "a", 5)  # computed 5, known 6
    assert cache.runtime_state("a") == (0, 0)  # nothing kept yet: the initial state
    cache.keep_state("a", 5)
    cache.append("a", 4)  # the pending token and 3 drafts: states after 6, 7, 8, 9
    with pytest.raises(InvalidOperation):  # not committed yet
        cache.keep_state("a", 9)
    cache.commit("a", 2, [7, 7])  # the pending token and one draft accepted
    cache.rollback("a", 2)
    for bad in (9, 8, 5):  # the rejected drafts' states, and the stale one
        with pytest.raises(InvalidOperation):
            cache.keep_state("a", bad)
    with pytest.raises(InvalidRequest):
        cache.keep_state("a", -1)
    assert cache.runtime_state("a") == (0, 5)  # refusals changed nothing
    cache.keep_state("a", 7)  # the state after draft token 1 of the step
    assert cache.runtime_state("a") == (0, 7)
    snap = cache.snapshot()
    assert snap.state_slots is not None and snap.state_slots.runtime_positions == (("a", 7),)


def test_inv_ckpt_catches_a_rolled_back_draft_state(cls: type[Any]) -> None:
    cache = make(cls)
    prefill(cache, "a", 5)
    snap = cache.snapshot()
    slots = snap.state_slots
    assert slots is not None
    bad = attrs.evolve(snap, state_slots=attrs.evolve(slots, runtime_positions=(("a", 9),)))
    with pytest.raises(InvariantViolation, match="rolled-back draft"):
        check(bad)


def test_save_point_rule() -> None:
    assert save_point(0, 10, 10, 4, 0) == 8
    assert save_point(8, 10, 10, 4, 0) == 0
    assert save_point(10, 17, 10, 4, 8) == 16
    assert save_point(16, 17, 10, 4, 8) == 0
    assert save_point(0, 3, 10, 4, 8) == 0


def test_out_of_runtime_slots(cls: type[Any]) -> None:
    cache = make(cls, max_num_seqs=1, state_budget=3)
    cache.admit(req("a", 3))
    second = req("b", 3)
    assert not cache.can_admit(second)
    before = cache.snapshot()
    with pytest.raises(OutOfStateSlots) as err:
        cache.admit(second)
    assert isinstance(err.value, OutOfBlocks)
    assert cache.snapshot() == before


def test_slot_pool_roles() -> None:
    pool = StateSlotPool(2)
    a, b = pool.take(RUNTIME), pool.take(CHECKPOINT)
    with pytest.raises(WrongSlotRole) as err:
        pool.release(a, CHECKPOINT)
    assert isinstance(err.value, ValueError) and isinstance(err.value, PrefixCacheError)
    with pytest.raises(OutOfStateSlots):
        pool.take(RUNTIME)
    pool.release(b, CHECKPOINT)
    with pytest.raises(WrongSlotRole):
        pool.release(b, CHECKPOINT)


def test_routed_experts_replay_and_enrich(cls: type[Any]) -> None:
    cache = make(cls)
    adm = cache.admit(req("a", 10))
    with pytest.raises(InvalidRequest):
        cache.commit("a", adm.num_scheduled_tokens, [99], routed_experts=[b"e0"])
    cache.commit("a", adm.num_scheduled_tokens, [99], routed_experts=[b"e0", b"e1"])
    b = cache.admit(req("b", 12))
    assert b.routed_experts == (b"e0", b"e1")
    cache.free(["a", "b"])
    # a different prompt sharing block 0 only: block 0 carries data, its new block does not
    other = (1, 2, 3, 4, 50, 51, 52, 53, 54)
    adm = cache.admit(Request("c", other, NS))
    cache.commit("c", adm.num_scheduled_tokens, [99])
    assert cache.match(Request("d", (*other, 1), NS)).routed_experts is None
    cache.free(["c"])
    # an equal computation with data enriches the block that lacked it, and never overwrites
    adm = cache.admit(Request("e", (*other, 7), NS, recompute_blocks=2))
    assert adm.num_cached_tokens == 0 and adm.num_window_blocks == 2
    cache.commit("e", adm.num_scheduled_tokens, [99], routed_experts=[b"zz", b"f1"])
    m = cache.match(Request("f", (*other, 1), NS))
    assert m.routed_experts == (b"e0", b"f1")


def test_window_private_span_runs_from_the_checkpoint(cls: type[Any]) -> None:
    cache = make(cls)
    adm = cache.admit(req("a", 13, kv_token_limit=4))
    for _ in range(3):
        cache.commit("a", 4)
        cache.continue_prefill("a")
    cache.commit("a", 1, [99])
    cache.free(["a"])
    # checkpoints at 4, 8, 12; evict by slot pressure down to the oldest only? Instead ask
    # for a window of one block: the KV hit is 12, the hit is 8, the span 8..12 is private
    m = cache.match(req("b", 13, recompute_blocks=1))
    assert (m.num_cached_tokens, m.num_window_blocks) == (8, 1)
    assert adm.state_slot == 0


def test_inv_ckpt_catches_a_corrupt_state(cls: type[Any]) -> None:
    cache = make(cls)
    prefill(cache, "a", 10)
    cache.free(["a"])
    cache.admit(req("b", 12))
    snap = cache.snapshot()
    slots = snap.state_slots
    assert slots is not None
    pinned = [ck for ck in slots.checkpoints if ck.status == "pinned"]
    assert len(pinned) == 1
    bad = attrs.evolve(
        snap,
        state_slots=attrs.evolve(
            slots,
            checkpoints=tuple(
                attrs.evolve(ck, boundary=4) if ck.status == "pinned" else ck
                for ck in slots.checkpoints
            ),
        ),
    )
    with pytest.raises(InvariantViolation) as err:
        check(bad)
    assert err.value.invariant == "INV-CKPT"
    dup = attrs.evolve(
        snap, state_slots=attrs.evolve(slots, free_slots=(*slots.free_slots, slots.runtime[0][1]))
    )
    with pytest.raises(InvariantViolation, match="INV-CKPT"):
        check(dup)


def test_spec_and_impl_agree_on_a_scenario() -> None:
    caches = [make(c, max_num_seqs=2, state_budget=1, decode_state_interval=4) for c in CLASSES]
    for cache in caches:
        prefill(cache, "a", 9)
        cache.append("a", 3)
        cache.commit("a", 3, [5, 6, 7])
        cache.free(["a"])
        cache.admit(req("b", 11))
        cache.admit(req("c", 6, namespace=Namespace("x")))
    a, b = (c.snapshot() for c in caches)
    assert a == b


# -- the hybrid workload of `prefixkv simulate` -----------------------------------------------


def test_hybrid_workload_spec_and_impl_agree() -> None:
    """The hybrid-model replay (chunks, drafts, restores) saves exactly as much on both."""
    from prefixkv.simulation import WORKLOADS, make_cache, replay
    from prefixkv.workloads import chat_workload

    _, preset = WORKLOADS["hybrid"]
    assert preset.hybrid is not None
    w = chat_workload(attrs.evolve(preset.workload, conversations=4, seed=3))
    results = [
        replay(
            make_cache(kind, 64, 4, hybrid=preset.hybrid),
            w,
            live=2,
            drive=preset.drive,
            check_every=25,
        )
        for kind in ("spec", "impl")
    ]
    spec, impl = (attrs.asdict(r, filter=lambda a, _: a.name != "wall_time_s") for r in results)
    assert spec == impl
    r = results[0]
    assert r.hybrid and r.checkpoints_saved > 0 and r.checkpoints_restored > 0
    assert 0 < r.hit_rate <= r.kv_hit_rate < 1
    # like with like: both rates are prompt tokens over prompt tokens
    assert r.lost_checkpoint == round((r.kv_hit_rate - r.hit_rate) * r.prefill_tokens)
    assert round(r.kv_hit_rate * r.prefill_tokens) == r.prefill_tokens_skipped + r.lost_checkpoint


def test_hit_counters_count_tokens_like_lost_checkpoint(cls: type[Any]) -> None:
    """``hits``/``queries`` count prompt tokens, the unit of ``lost_checkpoint``, so the
    hybrid report may add them; one admission that loses its whole KV hit shows it."""
    cache = make(cls, max_num_seqs=1, state_budget=0)
    prefill(cache, "a", 10)  # no slot for a checkpoint: nothing saved
    cache.free(["a"])
    cache.admit(req("b", 12))
    st = cache.stats()
    assert (st.queries, st.hits, st.lost_checkpoint, st.admissions) == (22, 0, 8, 2)
    assert st.queries == st.prefill_tokens and st.hits == st.prefill_tokens_skipped


def test_simulate_hybrid_cli_reports_both_hit_rates(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from prefixkv import cli

    code = cli.main(
        ["simulate", "--workload", "hybrid", "--json", "--conversations", "20", "--turns", "3"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["hybrid"] and report["hybrid_model"]["state_budget"] == 256
    assert 0 < report["hit_rate"] < report["kv_hit_rate"] <= 1
    kv_tokens = report["prefill_tokens_skipped"] + report["lost_checkpoint"]
    assert round(report["kv_hit_rate"] * report["prefill_tokens"]) == kv_tokens
    assert report["checkpoints_restored"] > 0


def test_runtime_checker_covers_the_hybrid_operations() -> None:
    """prefixkv.spec.checked checks restore_issued and the hybrid queries too."""
    from prefixkv.spec import checked

    cache = checked(HybridPrefixCacheManager(16, 4, max_num_seqs=4, state_budget=2), enabled=True)
    prefill(cache, "a", 10)
    cache.free(["a"])
    cache.admit(req("b", 12))
    before = cache.num_checks
    assert cache.pending_restore("b") is not None and cache.state_slot("b") >= 0
    cache.restore_issued("b")
    assert cache.checkpoint_reservation("b") is not None  # b saves at 12 when it commits
    assert cache.runtime_state("b") == (cache.state_slot("b"), 8)
    cache.commit("b", 4, [99])
    cache.keep_state("b", 12)
    assert cache.num_checks == before + 8
