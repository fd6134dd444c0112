"""The kit's step model for schedule-time publishers (``publish="schedule"``).

Operations are grouped into steps; at the end of a step its forward pass has written every
block scheduled in it, and a cancel takes effect between steps. So the readers a writer had
when it was cancelled keep its block, and no later step may be served it. These tests drive
the oracle by hand (no Hypothesis) through the vLLM-style example manager.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.spec import Namespace, Request, SeqId

from examples.vllm_style import BUGS, KVCacheManager
from examples.vllm_style_adapter import CAPABILITIES, VllmStyleAdapter
from prefixkv.conformance import adapter, run_conformance
from prefixkv.conformance.failures import CheckFailed
from prefixkv.conformance.lockstep import Lockstep
from prefixkv.conformance.safety import safety_violations

NS = Namespace("tiny-llm@1")


def _oracle(cls: type[KVCacheManager] = KVCacheManager) -> Lockstep:
    oracle = Lockstep(None, VllmStyleAdapter(cls(12, 2)), caps=CAPABILITIES)
    oracle.start()
    return oracle


def _admit(oracle: Lockstep, seq_id: SeqId, tokens: tuple[int, ...]) -> Any:
    out = oracle.op("admit", lambda c: c.admit(Request(seq_id, tokens, NS)))
    assert not out.raised, out.describe()
    return out.value


def _writer_cancelled_with_two_readers(oracle: Lockstep) -> None:
    """A writer schedules two full blocks (published at once); two requests admitted in the
    same step hit them; the writer is freed before it commits them."""
    assert _admit(oracle, 0, (1, 2, 3, 4, 5)).num_cached_tokens == 0
    for reader in (1, 2):  # the same step: they run in the writer's forward pass
        assert _admit(oracle, reader, (1, 2, 3, 4, 9)).num_cached_tokens == 4
    step = oracle.step
    oracle.op("free", lambda c: c.free([0]))
    assert oracle.step == step + 1  # the cancel took effect between steps


def test_readers_of_the_writers_step_keep_its_blocks_after_a_cancel() -> None:
    oracle = _oracle()
    _writer_cancelled_with_two_readers(oracle)
    shared = [b for b in oracle.state.blocks if b.refcount == 2]
    assert len(shared) == 2 and not any(b.published for b in shared)  # unpublished, kept
    # a later step is not served them: the correct manager took them out of the index
    assert _admit(oracle, 3, (1, 2, 3, 4, 7)).num_cached_tokens == 0


def test_a_reader_that_rolls_back_its_tail_keeps_the_block_it_hit() -> None:
    """A reader of the writer's step holds the cancelled writer's block; rolling back its
    own tail later is not a new hit on it (found by the machines on the correct manager)."""
    oracle = _oracle()
    assert _admit(oracle, 0, (7, 7, 7, 1)).num_cached_tokens == 0
    oracle.op("commit", lambda c: c.commit(0, 4, (1,)))
    assert _admit(oracle, 1, (7, 7, 7, 1, 2, 2, 2)).num_cached_tokens == 4  # schedules (2, 2)
    assert _admit(oracle, "r2", (7, 7, 7, 1, 2, 2, 2)).num_cached_tokens == 6  # hits it
    oracle.op("free", lambda c: c.free([1]))
    out = oracle.op("rollback", lambda c: c.rollback("r2", 1))
    assert not out.raised, out.describe()
    assert len(oracle.state.sequences[-1].block_ids) == 3


def test_a_later_step_served_a_cancelled_writers_block_is_inv_publish() -> None:
    oracle = _oracle(BUGS["cancelled_writer_still_findable"])
    _writer_cancelled_with_two_readers(oracle)
    with pytest.raises(CheckFailed) as info:
        _admit(oracle, 3, (1, 2, 3, 4, 7))
    assert info.value.check == "INV-PUBLISH"
    assert "was cancelled before committing it (before step 1)" in str(info.value)


def test_only_the_writers_readers_may_share_its_unpublished_block() -> None:
    oracle = _oracle()
    _writer_cancelled_with_two_readers(oracle)
    assert safety_violations(oracle.state, CAPABILITIES, oracle.ledger) == []
    ledger = oracle.ledger.copy()
    for b, readers in ledger.readers.items():  # as if reader 2 had come after the cancel
        ledger.readers[b] = readers - {2}
    found = safety_violations(oracle.state, CAPABILITIES, ledger)
    assert {v.invariant for v in found} == {"INV-WRITE"}
    assert all("is shared (refcount 2)" in v.message for v in found)


class _StepHook(VllmStyleAdapter):
    """The vLLM-style adapter with the optional ``end_step()`` hook. It checks that a cancel
    arrives only between steps, as the kit promises."""

    def __init__(self, manager: KVCacheManager) -> None:
        super().__init__(manager)
        self.steps = 0
        self.since_step = 0  # calls that change the cache since the last boundary

    def end_step(self) -> None:
        self.steps += 1
        self.since_step = 0

    def _cancel(self) -> None:
        if self.since_step:
            raise AssertionError("a cancel in the middle of a step")

    def admit(self, req: Any, num_new_tokens: int | None = None) -> Any:
        self.since_step += 1
        return super().admit(req, num_new_tokens)

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        self.since_step += 1
        super().commit(seq_id, num_computed, accepted_tokens)

    def free(self, seq_ids: Any) -> None:
        self._cancel()
        super().free(seq_ids)

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        self._cancel()
        super().rollback(seq_id, num_tokens)


def test_the_step_hook_is_called_at_every_boundary_and_shown_in_replays() -> None:
    adapter = _StepHook(KVCacheManager(12, 2))
    oracle = Lockstep(None, adapter, caps=CAPABILITIES)
    oracle.start()
    _writer_cancelled_with_two_readers(oracle)
    assert adapter.steps == 1
    oracle.end_step()
    assert adapter.steps == oracle.step == 2
    assert oracle.log.count("cache.end_step()") == 2
    plain = _oracle()  # without the hook, a boundary is the kit's own count
    _writer_cancelled_with_two_readers(plain)
    assert plain.step == 1 and not any("end_step" in line for line in plain.log)


def test_the_machines_cancel_only_between_steps() -> None:
    calls: list[_StepHook] = []

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> _StepHook:
        calls.append(_StepHook(KVCacheManager(num_blocks, block_size)))
        return calls[-1]

    report = run_conformance(make, max_examples=30, steps=20)
    assert report.rules > 0 and sum(a.steps for a in calls) > len(calls)
