"""The reference scheduler: its policies on their own, then the scheduler over a real cache
manager with a torch-free fake model whose "KV" is read back through the block tables."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fake_model import FakeRunner, oracle
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import InvalidOperation, InvalidRequest, MultimodalSpan, Namespace, OutOfBlocks
from prefixkv.spec.invariants import check

from prefixkv.engine.generation import GenerationRequest, MultimodalItem, Status
from prefixkv.engine.policy import (
    SchedulerConfig,
    choose_victim,
    fit_decode,
    rotate,
    split_budget,
    verify_greedy,
)
from prefixkv.engine.scheduler import Scheduler
from prefixkv.engine.step import Kind, StepOutput
from prefixkv.errors import InvalidConfig

NS = Namespace("fake@1")

# -- policies ---------------------------------------------------------------------------


def test_split_budget_decode_first_but_leaves_prefill_its_reserve() -> None:
    assert split_budget(64, 10, 0, 16) == (10, 54)
    assert split_budget(64, 100, 0, 16) == (64, 0)  # nothing waits: decode takes it all
    assert split_budget(64, 100, 500, 16) == (48, 16)  # prompts wait: 16 stay for prefill
    assert split_budget(64, 100, 5, 16) == (59, 5)  # reserve never exceeds the demand
    assert split_budget(64, 0, 500, 16) == (0, 64)


def test_rotate_is_round_robin() -> None:
    assert rotate([1, 2, 3], 0) == [1, 2, 3]
    assert rotate([1, 2, 3], 4) == [2, 3, 1]
    assert rotate([], 3) == []


def test_fit_decode_trims_drafts_never_the_pending_token() -> None:
    assert fit_decode(3, 10) == 3
    assert fit_decode(3, 2) == 1
    assert fit_decode(3, 1) == 0
    assert fit_decode(0, 0) == -1


def test_choose_victim_newest_unprotected() -> None:
    a, b, c = object(), object(), object()
    assert choose_victim([a, b, c], []) is c
    assert choose_victim([a, b, c], [c]) is b
    assert choose_victim([a], [a]) is None


def test_verify_greedy() -> None:
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == (3, [5, 6, 7, 8])
    assert verify_greedy([5, 6, 7], [5, 9, 7, 8]) == (1, [5, 9])
    assert verify_greedy([], [4]) == (0, [4])
    with pytest.raises(InvalidRequest):
        verify_greedy([1], [1])


def test_config_is_validated() -> None:
    with pytest.raises(InvalidConfig):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(InvalidConfig):
        SchedulerConfig(max_num_batched_tokens=16, min_prefill_tokens=16)
    with pytest.raises(InvalidConfig):
        SchedulerConfig(max_num_batched_tokens=True)
    with pytest.raises(ValueError):
        GenerationRequest("r", [], 4, NS)


# -- the scheduler over a cache, with the fake model ---------------------------------------


class NgramLike:
    """Proposes the tokens that followed the last occurrence of the last token."""

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        last = tokens[-1]
        for i in range(len(tokens) - 2, -1, -1):
            if tokens[i] == last:
                return list(tokens[i + 1 : i + 1 + max_tokens])
        return [(last + 1) % 61] * max_tokens


def run(
    requests: list[GenerationRequest],
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    cache_enabled: bool = True,
    config: SchedulerConfig | None = None,
    drafter: NgramLike | None = None,
    check_every_step: bool = True,
    stagger: int = 0,
) -> tuple[Scheduler, FakeRunner, PrefixCacheManager]:
    """Run ``requests`` to completion; with ``stagger`` request i arrives at step i*stagger."""
    cache = PrefixCacheManager(num_blocks, block_size)
    sched = Scheduler(cache, config, cache_enabled=cache_enabled, drafter=drafter)
    runner = FakeRunner(block_size)
    pending = list(requests)
    for step in range(10_000):
        while pending and step >= stagger * (len(requests) - len(pending)):
            sched.add(pending.pop(0))
        if not sched.has_unfinished and not pending:
            break
        plan = sched.schedule()
        sched.commit_step(runner.forward(plan))
        if check_every_step:
            check(cache.snapshot())
            assert_settled(sched, cache)
    assert not sched.has_unfinished
    return sched, runner, cache


def assert_settled(sched: Scheduler, cache: PrefixCacheManager) -> None:
    """After a commit (or a cancel) nothing stays reserved: every live sequence holds
    exactly the blocks its computed tokens need, and the scheduler agrees with the cache."""
    for view in cache.snapshot().sequences:
        assert view.num_reserved == view.num_computed, view.seq_id
        assert len(view.block_ids) == -(-view.num_computed // cache.block_size)
        assert sched.generation(str(view.seq_id)).num_computed == view.num_computed


def shared_prefix_requests(n: int = 6, **kw: object) -> list[GenerationRequest]:
    system = list(range(100, 130))
    return [
        GenerationRequest(f"r{i}", [*system, 7 * i + 1, 7 * i + 2, 7 * i + 3], 6, NS, **kw)  # type: ignore[arg-type]
        for i in range(n)
    ]


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_tokens_equal_the_oracle(cache_enabled: bool) -> None:
    reqs = shared_prefix_requests()
    sched, _runner, cache = run(reqs, cache_enabled=cache_enabled, stagger=2)
    for r in reqs:
        assert list(sched.generation(r.request_id).output) == oracle(r)
    stats = cache.stats()
    assert (stats.prefill_tokens_skipped > 0) == cache_enabled


def test_cache_saves_prefill_work() -> None:
    reqs = shared_prefix_requests()
    cfg = SchedulerConfig(max_num_batched_tokens=40, min_prefill_tokens=8)
    _, on, _ = run(reqs, config=cfg, stagger=3)
    _, off, _ = run(reqs, cache_enabled=False, config=cfg, stagger=3)
    assert on.tokens_computed < off.tokens_computed


def test_chunked_prefill_resumes_after_a_hit() -> None:
    long = list(range(200, 260))
    first = GenerationRequest("a", long, 3, NS, kv_token_limit=8)
    sched, runner, _cache = run([first])
    assert sched.stats.prefill_chunks >= 6
    second = GenerationRequest("b", [*long, 1, 2, 3, 4, 5], 3, NS, kv_token_limit=8)
    sched.add(second)
    plan = sched.schedule()
    (entry,) = plan.seqs
    assert entry.kind is Kind.PREFILL and entry.start == 60 and entry.num_tokens == 5
    sched.commit_step(runner.forward(plan))
    while sched.has_unfinished:
        sched.commit_step(runner.forward(sched.schedule()))
    assert list(sched.generation("b").output) == oracle(second)


def test_chunks_interleave_with_decode() -> None:
    short = GenerationRequest("s", [1, 2, 3], 20, NS)
    long = GenerationRequest("l", list(range(300, 400)), 2, NS, kv_token_limit=8)
    cfg = SchedulerConfig(max_num_batched_tokens=12, min_prefill_tokens=4)
    cache = PrefixCacheManager(64, 4)
    sched = Scheduler(cache, cfg)
    runner = FakeRunner(4)
    sched.add(short)
    sched.commit_step(runner.forward(sched.schedule()))  # s prefilled, now decoding
    sched.add(long)
    mixed = 0
    while sched.has_unfinished:
        plan = sched.schedule()
        kinds = {s.kind for s in plan.seqs}
        mixed += kinds == {Kind.PREFILL, Kind.DECODE}
        assert plan.num_tokens <= cfg.max_num_batched_tokens
        sched.commit_step(runner.forward(plan))
    assert mixed >= 5  # both kinds progressed in the same steps
    assert list(sched.generation("s").output) == oracle(short)
    assert list(sched.generation("l").output) == oracle(long)


def test_preemption_under_a_small_pool_keeps_tokens_exact() -> None:
    reqs = [GenerationRequest(f"p{i}", [i + 1] * 9 + [i + 2, i + 3], 16, NS) for i in range(5)]
    for enabled in (True, False):
        sched, _, _ = run(reqs, num_blocks=14, cache_enabled=enabled)
        assert sched.stats.preemptions > 0
        for r in reqs:
            assert list(sched.generation(r.request_id).output) == oracle(r)


def test_same_prompt_twice_in_one_step() -> None:
    prompt = list(range(40, 57))
    reqs = [GenerationRequest("x", prompt, 5, NS), GenerationRequest("y", prompt, 5, NS)]
    cache = PrefixCacheManager(64, 4)
    sched = Scheduler(cache)
    runner = FakeRunner(4)
    for r in reqs:
        sched.add(r)
    plan = sched.schedule()
    assert [s.seq_id for s in plan.seqs] == ["x", "y"] and all(s.start == 0 for s in plan.seqs)
    sched.commit_step(runner.forward(plan))
    while sched.has_unfinished:
        sched.commit_step(runner.forward(sched.schedule()))
    assert sched.generation("x").output == sched.generation("y").output == tuple(oracle(reqs[0]))


def test_speculative_decoding_rolls_back_rejected_drafts() -> None:
    reqs = shared_prefix_requests(3, recompute_blocks=1)
    cfg = SchedulerConfig(num_draft_tokens=3)
    sched, _, cache = run(reqs, config=cfg, drafter=NgramLike(), stagger=2)
    assert sched.stats.drafts_proposed > sched.stats.drafts_accepted
    for r in reqs:
        assert list(sched.generation(r.request_id).output) == oracle(r)
    assert cache.stats().lost_window > 0


def test_multimodal_items_reach_the_plan() -> None:
    span = MultimodalSpan(4, 12, "image", b"cat")
    req = GenerationRequest(
        "m",
        [1, 2, 3, 4] + [9] * 8 + [5, 6],
        2,
        NS,
        multimodal=[MultimodalItem(span, b"cat")],
        kv_token_limit=8,
    )
    cache = PrefixCacheManager(32, 4)
    sched = Scheduler(cache)
    sched.add(req)
    plan = sched.schedule()
    (entry,) = plan.seqs
    # the first chunk may not split the image: it stops at the image's start
    assert entry.end == 4 and entry.multimodal == ()
    sched.commit_step(StepOutput(((),)))
    (entry,) = sched.schedule().seqs
    assert (entry.start, entry.end) == (4, 12) and entry.multimodal == req.multimodal


def test_idle_step_leaves_the_cache_untouched() -> None:
    sched, _, cache = run(shared_prefix_requests(2))
    before = cache.snapshot()
    plan = sched.schedule()
    assert plan.is_idle
    sched.commit_step(StepOutput(()))
    assert cache.snapshot() == before
    assert sched.stats.idle_steps == 1


def test_cancel_step_gives_everything_back() -> None:
    cache = PrefixCacheManager(64, 4)
    sched = Scheduler(cache)
    runner = FakeRunner(4)
    reqs = shared_prefix_requests(3)
    sched.add(reqs[0])
    sched.commit_step(runner.forward(sched.schedule()))
    for r in reqs[1:]:
        sched.add(r)
    plan = sched.schedule()
    assert len(plan.seqs) == 3
    with pytest.raises(InvalidOperation):
        sched.schedule()  # the previous step must be committed or cancelled first
    sched.cancel_step()
    assert cache.seq_ids() == ("r0",) and cache.num_computed_tokens("r0") == 33
    assert_settled(sched, cache)  # r0's decode slot was given back too
    assert [g.status for g in sched.generations] == [Status.DECODE, Status.WAITING, Status.WAITING]
    while sched.has_unfinished:
        sched.commit_step(runner.forward(sched.schedule()))
    for r in reqs:
        assert list(sched.generation(r.request_id).output) == oracle(r)


def test_bad_output_and_impossible_requests_are_typed_errors() -> None:
    cache = PrefixCacheManager(4, 4)
    sched = Scheduler(cache)
    sched.add(GenerationRequest("big", list(range(40)), 2, NS))
    with pytest.raises(OutOfBlocks):
        sched.schedule()
    cache2 = PrefixCacheManager(16, 4)
    sched2 = Scheduler(cache2)
    sched2.add(GenerationRequest("a", [1, 2, 3], 2, NS))
    sched2.schedule()
    with pytest.raises(InvalidOperation):
        sched2.commit_step(StepOutput(((1, 2),)))
    with pytest.raises(ValueError):
        sched2.add(GenerationRequest("a", [1, 2, 3], 2, NS))
