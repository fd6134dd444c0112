"""End to end: every workload gives the same greedy tokens (and logits within tolerance)
with the prefix cache on and off, and the cache-on run really reused KV. A corrupted
published block must break the equality."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from prefixkv.spec import InvalidOperation

from prefixkv.engine import (
    Engine,
    EngineConfig,
    EqualityMismatch,
    ModelConfig,
    Turn,
    check_equality,
    image_item,
)
from prefixkv.engine.equality import EqualityReport
from prefixkv.engine.policy import SchedulerConfig
from prefixkv.engine.state_io import RecurrentStateIO
from prefixkv.engine.step import StepPlan

CONFIG = EngineConfig(num_blocks=96, block_size=4)
SYSTEM = tuple(range(20, 52))  # 32 tokens = 8 blocks


def reused(report: EqualityReport) -> int:
    """Prompt tokens the cache-on run skipped (the off run must skip none)."""
    assert report.off.cache.prefill_tokens_skipped == 0
    return report.on.cache.prefill_tokens_skipped


def test_multi_turn_chat() -> None:
    turns = []
    for c in range(3):
        turns.append(Turn(f"c{c}t0", [*SYSTEM, 100 + c, 101 + c], 6, arrival_step=c))
        for t in range(1, 3):
            turns.append(Turn(f"c{c}t{t}", [60 + t, 61 + c, 62], 5, follows=f"c{c}t{t - 1}"))
    report = check_equality(turns, CONFIG)
    assert report.tokens_compared == 3 * (6 + 5 + 5)
    # every follow-up turn hit at least its conversation's history minus the tail block
    for c in range(3):
        for t in range(1, 3):
            r = report.on.requests[f"c{c}t{t}"]
            assert r.cached_tokens >= r.prompt_tokens - 8 - 3
    assert reused(report) > 0


def test_many_requests_share_a_system_prompt() -> None:
    turns = [
        Turn(f"r{i}", [*SYSTEM, 3 * i + 1, 3 * i + 2], 6, arrival_step=1 + i // 3) for i in range(9)
    ]
    report = check_equality(turns, CONFIG)
    hits = [report.on.requests[f"r{i}"].cached_tokens for i in range(9)]
    assert hits[0] == 0 and all(h == len(SYSTEM) for h in hits[3:])
    assert reused(report) >= 6 * len(SYSTEM)


def test_same_prompt_twice_in_one_step() -> None:
    prompt = [*SYSTEM, 7, 8, 9]
    turns = [Turn("a", prompt, 6), Turn("b", prompt, 6), Turn("c", prompt, 6, arrival_step=3)]
    report = check_equality(turns, CONFIG)
    a, b, c = (report.on.requests[k] for k in "abc")
    assert a.output == b.output == c.output
    assert a.cached_tokens == b.cached_tokens == 0  # neither saw the other's unpublished KV
    assert c.cached_tokens == len(SYSTEM)  # one twin's blocks were published, the other freed


def test_multimodal_equal_placeholders_different_content() -> None:
    placeholder = [5] * 12  # identical placeholder ids for every image
    prefix = list(range(30, 38))

    def turn(rid: str, content: bytes, step: int) -> Turn:
        return Turn(
            rid,
            [*prefix, *placeholder, 9, 10, 11],
            6,
            arrival_step=step,
            multimodal=[image_item(len(prefix), len(placeholder), content)],
        )

    turns = [turn("cat", b"cat.png", 0), turn("dog", b"dog.png", 2), turn("cat2", b"cat.png", 4)]
    report = check_equality(turns, CONFIG)
    on = report.on.requests
    assert on["dog"].cached_tokens == len(prefix)  # the text prefix only: other content
    assert on["cat2"].cached_tokens == len(prefix) + len(placeholder)  # same image: a hit
    assert on["cat"].output != on["dog"].output  # the content reaches the model


SPEC = attrs.evolve(CONFIG, scheduler=SchedulerConfig(num_draft_tokens=3))


def spec_turns() -> list[Turn]:
    loop = [11, 12, 13, 14, 15, 16] * 4  # repetition gives the n-gram drafter something
    return [Turn(f"s{i}", [*SYSTEM, *loop, i], 16, arrival_step=2 * i) for i in range(4)]


def test_speculative_decoding() -> None:
    report = check_equality(spec_turns(), SPEC)
    sched = report.on.scheduler
    assert 0 < sched.drafts_accepted < sched.drafts_proposed  # some accepted, some rolled back
    assert report.on.cache.lost_window > 0  # the recompute window was used on every hit
    assert reused(report) > 0


def test_speculative_decoding_changes_no_token() -> None:
    plain = Engine(CONFIG).run(spec_turns())
    spec = Engine(SPEC).run(spec_turns())
    assert spec.outputs() == plain.outputs()
    # every accepted draft saved one decode forward of its sequence
    saved = plain.scheduler.decode_steps - spec.scheduler.decode_steps
    assert saved == spec.scheduler.drafts_accepted > 0


HYBRID = attrs.evolve(
    SPEC,
    model=ModelConfig(hybrid=True),
    scheduler=SchedulerConfig(num_draft_tokens=2, max_num_batched_tokens=32, min_prefill_tokens=8),
)


def hybrid_turns() -> list[Turn]:
    return [
        *spec_turns()[:3],
        Turn("h", [5, 6, 7], 6, follows="s0"),
        Turn("k", [*SYSTEM, *range(60, 90)], 4, kv_token_limit=12, arrival_step=3),
    ]


def test_hybrid_model() -> None:
    """KV reused, and the recurrent state restored from checkpoints at the hits."""
    report = check_equality(hybrid_turns(), HYBRID)
    assert reused(report) > 0
    assert report.on.scheduler.drafts_accepted > 0


def test_hybrid_hits_restore_checkpoints() -> None:
    """Every hybrid hit restored a saved checkpoint (no rescan of the cached prefix): the
    cache counted the restores, and the off run computed the skipped tokens instead."""
    engine = Engine(attrs.evolve(HYBRID, decode_state_interval=8))
    on = engine.run(hybrid_turns())
    off = Engine(attrs.evolve(HYBRID, decode_state_interval=8, cache_enabled=False)).run(
        hybrid_turns()
    )
    assert on.outputs() == off.outputs()
    hits = sum(1 for r in on.requests.values() if r.cached_tokens)
    assert on.cache.checkpoints_saved > 0
    assert on.cache.checkpoints_restored >= hits > 0
    assert engine.states is not None and engine.states.restores == on.cache.checkpoints_restored
    assert off.cache.checkpoints_restored == 0
    skipped = on.cache.prefill_tokens_skipped
    assert on.tokens_computed + skipped <= off.tokens_computed
    assert engine.cache.stats().num_state_slots_used >= 1  # Ready checkpoints kept


def test_runtime_states_follow_the_accepted_tokens() -> None:
    """After every step each running sequence's runtime slot holds, by the cache's account,
    the state after its committed tokens (drafts accepted, none rejected), and the pool's
    tag agrees."""
    seen: list[int] = []

    def check_states(engine: Engine, _: StepPlan) -> None:
        hybrid, pool = engine.hybrid, engine.states
        assert hybrid is not None and pool is not None
        for seq_id in hybrid.seq_ids():
            held = hybrid.runtime_state(seq_id)
            if held is None:  # admitted this step with a restore to issue
                continue
            assert held.position == hybrid.num_computed_tokens(seq_id)
            assert pool.positions[held.slot] == held.position
            seen.append(held.position)

    run = Engine(attrs.evolve(HYBRID, decode_state_interval=8)).run(
        hybrid_turns(), on_step=check_states
    )
    assert run.scheduler.drafts_accepted > 0 and seen


def test_keeping_a_rejected_draft_state_is_refused() -> None:
    """An engine that keeps the state after its last draft token, accepted or not, is
    stopped by the cache at the first rejected draft."""

    class KeepsLastDraft(RecurrentStateIO):
        def keep_accepted(self, plan: StepPlan, out: Any) -> None:
            live = set(self.cache.seq_ids())
            for row, s in enumerate(plan.seqs):
                if s.seq_id in live:
                    self.pool.write(self.cache.state_slot(s.seq_id), s.end, out.states[row][s.end])
                    self.cache.keep_state(s.seq_id, s.end)

    engine = Engine(HYBRID)
    assert engine.hybrid is not None and engine.states is not None
    engine.state_io = KeepsLastDraft(engine.hybrid, engine.states)
    with pytest.raises(InvalidOperation, match="committed tokens"):
        engine.run(hybrid_turns())


def test_a_corrupted_checkpoint_breaks_equality() -> None:
    check_equality(hybrid_turns(), HYBRID)  # clean: equal
    corrupted: set[int] = set()

    def corrupt_ready_checkpoints(engine: Engine, _: StepPlan) -> None:
        view = engine.cache.snapshot().state_slots
        assert view is not None and engine.states is not None
        for ck in view.checkpoints:
            if ck.status == "ready" and ck.slot not in corrupted:
                engine.states.corrupt(ck.slot, amount=0.5)
                corrupted.add(ck.slot)

    with pytest.raises(EqualityMismatch):
        check_equality(hybrid_turns(), HYBRID, on_step=corrupt_ready_checkpoints)
    assert corrupted


def test_long_prompts_in_chunks() -> None:
    long = tuple(range(40, 120))  # 80 tokens
    cfg = attrs.evolve(
        CONFIG, scheduler=SchedulerConfig(max_num_batched_tokens=24, min_prefill_tokens=8)
    )
    turns = [
        Turn("l0", long, 5, kv_token_limit=16),
        Turn("s0", [1, 2, 3], 12),
        Turn("l1", [*long, 7, 8, 9], 5, kv_token_limit=16, arrival_step=12),
    ]
    report = check_equality(turns, cfg)
    assert report.on.scheduler.prefill_chunks >= 4
    assert report.on.requests["l1"].cached_tokens == 80  # resumed from the hit


def test_preemption_under_a_small_pool() -> None:
    cfg = attrs.evolve(CONFIG, num_blocks=24)
    turns = [Turn(f"p{i}", [*SYSTEM[:16], 9 * i + 1, 9 * i + 2, 9 * i + 3], 24) for i in range(4)]
    report = check_equality(turns, cfg)
    assert report.on.scheduler.preemptions > 0 and report.off.scheduler.preemptions > 0
    assert reused(report) > 0


def test_a_corrupted_published_block_breaks_equality() -> None:
    turns = [Turn(f"r{i}", [*SYSTEM, i + 1, i + 2], 6, arrival_step=3 * i) for i in range(3)]
    check_equality(turns, CONFIG)  # clean: equal
    corrupted: list[int] = []

    def corrupt_first_published(engine: Engine, _: StepPlan) -> None:
        if corrupted:
            return
        published = [b.block_id for b in engine.cache.snapshot().blocks if b.published]
        if published:
            engine.pool.corrupt(published[0], amount=0.5)
            corrupted.append(published[0])

    with pytest.raises(EqualityMismatch):
        check_equality(turns, CONFIG, on_step=corrupt_first_published)
    assert corrupted


def test_half_precision_within_tolerance() -> None:
    cfg = attrs.evolve(CONFIG, model=ModelConfig(dtype="bfloat16"))
    turns = [Turn(f"r{i}", [*SYSTEM, i + 1], 4, arrival_step=2 * i) for i in range(3)]
    report = check_equality(turns, cfg)
    assert reused(report) > 0


def test_interpreter_backend_matches_torch() -> None:
    """The Triton kernels (under the interpreter) and the torch backend agree end to end."""
    import os

    if os.environ.get("TRITON_INTERPRET", "") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 (set when there is no GPU)")
    turns = [Turn("a", [*SYSTEM[:8], 1, 2], 3), Turn("b", [*SYSTEM[:8], 3], 3, arrival_step=2)]
    base = attrs.evolve(CONFIG, record_logits=True, num_blocks=16, model=ModelConfig(num_layers=1))
    ref = Engine(attrs.evolve(base, backend="torch")).run(turns)
    tri = Engine(attrs.evolve(base, backend="interpreter")).run(turns)
    assert tri.outputs() == ref.outputs()
    for rid, rows in ref.logits.items():
        for x, y in zip(rows, tri.logits[rid], strict=True):
            assert torch.allclose(x, y, atol=1e-3)
    assert tri.cache.prefill_tokens_skipped == 8


@pytest.mark.gpu
def test_fast_backend_on_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg = attrs.evolve(
        CONFIG, backend="fast", device="cuda", scheduler=SchedulerConfig(num_draft_tokens=3)
    )
    report = check_equality(spec_turns(), cfg)
    assert reused(report) > 0
