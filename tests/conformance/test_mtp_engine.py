"""The MTP example engine (draft slots without rollback, block size 16 by default): its
own API first, then the conformance kit on its adapter."""

from __future__ import annotations

import pytest
from kit_runs import every_root_cause, first_failure, passes

from examples.minimal_engine import Sequence
from examples.mtp_engine import BUGS, MTPEngine
from examples.mtp_engine_adapter import BUG_FACTORIES, CAPABILITIES, factory_for, make_manager


def test_drafts_reserve_across_a_block_boundary_and_stay_reserved() -> None:
    e = MTPEngine(4)
    assert e.block_size == 16
    s = Sequence("a", list(range(15)), b"m")
    e.allocate(s)
    e.postprocess(s, 15, [99])  # the prompt is written, token 99 sampled
    assert e.can_append(s, 3) and not e.can_append(s, 3 + 16 * 3)
    e.may_append(s, 3)  # token 99 and two drafts: slots 15..17 cross into a second block
    assert (s.num_slots, len(s.block_table)) == (18, 2)
    e.postprocess(s, 1, [5])  # both drafts rejected: their slots stay reserved
    assert (s.num_computed_tokens, s.num_slots, len(s.token_ids)) == (16, 18, 17)
    assert e.blocks[s.block_table[0]].hash != -1  # 16 tokens written and accepted
    assert e.blocks[s.block_table[1]].hash == -1


def test_the_correct_engine_passes_the_kit() -> None:
    assert CAPABILITIES.speculative and not CAPABILITIES.rollback
    report = passes(make_manager, examples=60)
    assert not report.coverage.mostly_refused(), report.summary()


#: bug -> the check that catches it first.
EXPECTED = {
    "floor_at_boundary": {"INV-LIMIT"},
    "room_for_one_block": {"CAN-APPEND"},
    "publishes_unwritten_tokens": {"INV-PUBLISH"},
}


def test_every_bug_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(BUGS) == set(BUG_FACTORIES)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_bug_is_caught(bug: str) -> None:
    failure = first_failure(BUG_FACTORIES[bug])
    assert failure.check in EXPECTED[bug], str(failure)


def test_every_bug_is_its_own_root_cause_in_one_report() -> None:
    """All three bugs in one engine: one report lists each as a root cause of its own (a
    bug that fires in nearly every run is in every other bug's run too; folding a failure
    into the one its run went past made them all one root cause)."""
    checks = [c for expected in EXPECTED.values() for c in expected]
    assert len(checks) == len(set(checks))  # a failed check names the bug behind it
    report = every_root_cause(BUGS, factory_for, max_failures=6)
    for bug, expected in EXPECTED.items():
        assert any(f.check in expected for f in report.failures), (bug, report.summary())
