"""Capabilities swap prefixkv's policy checks for safety checks, and missing operations are
never called: correct managers with another policy pass once they declare it, and fail
(on the policy check) when they do not; each seeded safety bug is still caught, with the
root cause named first and a short replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from kit_runs import FIND_ONLY
from policy_variants import (
    AnyOrderEviction,
    LastWinsDuplicates,
    LeaksUnreachable,
    SchedulePublish,
    SchedulePublishKeepsCancelled,
    make,
)

from examples.engine_style import (
    CAPABILITIES,
    CanAdmitIgnoresHits,
    EngineStyleManager,
    StaleHashAfterReuse,
    make_double_free_in_batch,
)
from prefixkv.conformance import Capabilities, ConformanceFailure, adapter, run_conformance
from prefixkv.conformance.runner import required_operations

_EXAMPLES = 100
_STEPS = 30


def _run(factory: Any, examples: int = _EXAMPLES, **kwargs: Any) -> Any:
    kwargs.setdefault("max_failures", 1)
    kwargs.setdefault("profile", "ci")
    return run_conformance(factory, max_examples=examples, steps=_STEPS, **kwargs)


def _fails(factory: Any, **kwargs: Any) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as info:
        _run(factory, **kwargs)
    return info.value


# -- publish=schedule ----------------------------------------------------------------------


def test_schedule_time_publishing_passes_once_declared() -> None:
    assert _run(make(SchedulePublish, publish="schedule")).rules > 100


def test_schedule_time_publishing_undeclared_fails_on_the_policy() -> None:
    failure = _fails(make(SchedulePublish))
    assert failure.check == "INV-PUBLISH", str(failure)  # the root cause, not INV-WRITE


def test_a_cancelled_writers_block_left_findable_is_caught() -> None:
    failure = _fails(make(SchedulePublishKeepsCancelled, publish="schedule"))
    assert failure.check == "INV-PUBLISH", str(failure)
    assert "was cancelled before committing it" in str(failure)
    assert failure.steps <= 8, str(failure)


# -- eviction=any --------------------------------------------------------------------------


def test_any_order_eviction_passes_once_declared() -> None:
    assert _run(make(AnyOrderEviction, eviction="any")).rules > 100


def test_any_order_eviction_undeclared_fails_on_the_policy() -> None:
    assert _fails(make(AnyOrderEviction)).check == "INV-ANCESTOR"


def test_unreachable_blocks_that_never_leave_are_a_leak() -> None:
    failure = _fails(make(LeaksUnreachable, eviction="any"))
    assert failure.check == "EVICT", str(failure)
    assert failure.steps <= 10, str(failure)


# -- duplicates ----------------------------------------------------------------------------


def test_last_wins_duplicates_pass_once_declared() -> None:
    assert _run(make(LastWinsDuplicates, duplicates="last-wins")).rules > 100


def test_last_wins_duplicates_undeclared_fail_on_the_index() -> None:
    assert _fails(make(LastWinsDuplicates)).check == "INV-INDEX"


# -- missing operations --------------------------------------------------------------------


class _Without:
    """The engine-style manager with some operations removed from its surface."""

    def __init__(self, inner: EngineStyleManager, missing: tuple[str, ...]) -> None:
        self._inner, self._missing = inner, missing

    def __getattr__(self, name: str) -> Any:
        if name in self._missing:
            raise AttributeError(name)
        return getattr(self._inner, name)


def _without(*missing: str, **caps: Any) -> Any:
    @adapter(capabilities=attrs.evolve(CAPABILITIES, **caps))
    def factory(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        return _Without(EngineStyleManager(num_blocks, block_size), missing)

    return factory


def test_no_reset_is_honoured_by_every_rule() -> None:
    """reset=False: no rule calls reset, the bad-argument table included."""
    assert _run(_without("reset", reset=False)).rules > 100


def test_no_evict_no_rollback_one_namespace_whole_prompts() -> None:
    factory = _without(
        "evict",
        "rollback",
        evict=False,
        speculative=False,
        namespaces=False,
        partial_admission=False,
    )
    assert _run(factory).rules > 100


def test_drafts_without_a_rollback_keep_their_slots() -> None:
    """rollback=False with speculative drafts (an MTP engine): rollback is never called, the
    rejected drafts' slots stay reserved for the next step, and the run names why the
    rollback rule never fired."""
    report = _run(_without("rollback", rollback=False))
    assert report.rules > 100 and report.coverage.skipped["rollback"] == "-rollback"
    assert report.coverage.fired["append"] > 0
    assert "rollback" not in required_operations(Capabilities(rollback=False))
    assert "rollback" in required_operations(Capabilities())


class _NoCancelBeforeCommit(EngineStyleManager):
    """Correct, but crashes if a sequence is freed with scheduled known tokens it never
    computed: an engine whose scheduled writer always runs its forward pass."""

    def free(self, seq_ids: Any) -> None:
        for s in list(seq_ids) if isinstance(seq_ids, list) else []:
            seq = self.seqs.get(s)
            if seq is not None and min(seq.reserved, len(seq.tokens)) > seq.computed:
                raise RuntimeError(f"{s!r} freed before its forward pass")
        super().free(seq_ids)


def test_a_scheduled_writer_always_runs_its_forward_pass() -> None:
    """cancel_scheduled=False: the kit commits what a sequence has scheduled before it frees
    it (the manager crashes otherwise, as it does when the capability is not declared)."""
    factory = make(_NoCancelBeforeCommit, cancel_scheduled=False)
    assert _run(factory).rules > 100
    assert _fails(make(_NoCancelBeforeCommit)).check == "CRASH(free)"


def test_a_missing_operation_that_is_not_declared_is_named() -> None:
    with pytest.raises(TypeError, match="lacks evict"):
        _run(_without("evict"), examples=1)
    assert "evict" not in required_operations(Capabilities(evict=False))


class _Refuses(EngineStyleManager):
    """A conservative manager: refuses every multi-token append (correct, if unhelpful)."""

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        ok = super().can_append(seq_id, num_tokens)
        return ok and num_tokens == 1

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        if not self.can_append(seq_id, num_tokens):
            from prefixkv.spec import OutOfBlocks

            raise OutOfBlocks("one token at a time")
        return super().append(seq_id, num_tokens)


def test_refusing_can_append_with_room_left_preempts_nothing() -> None:
    from prefixkv.conformance.runner import conformance_machine

    factory = make(_Refuses)
    _run(factory)
    machine = conformance_machine(factory)
    machine.coverage.reset()
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine, settings=settings(max_examples=40, stateful_step_count=_STEPS, database=None)
    )
    variants = machine.coverage.variants
    assert variants["reserve:refused_with_room"] > 0
    assert variants["reserve:preempt"] < variants["reserve:refused_with_room"]


# -- pool shapes ---------------------------------------------------------------------------


def test_pool_shapes_come_from_the_capabilities() -> None:
    seen: set[tuple[int, int]] = set()
    built: list[EngineStyleManager] = []

    @adapter(capabilities=CAPABILITIES)
    def factory(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        seen.add((num_blocks, block_size))
        built.append(EngineStyleManager(num_blocks, block_size))
        return built[-1]

    _run(factory, examples=30, block_sizes=(256, 512), num_blocks=(6, 8))
    assert seen and {bs for _, bs in seen} <= {256, 512}
    assert {n for n, _ in seen} <= {6, 7, 8}
    # prompts are scaled to the block size, so big blocks still fill up and are shared
    assert sum(m.counters["hits"] > 0 for m in built) >= 3


# -- reports -------------------------------------------------------------------------------


class _TwoBugs(StaleHashAfterReuse, CanAdmitIgnoresHits):
    """Two independent bugs: a stale index entry, and a can_admit that ignores hits."""


def test_every_distinct_failed_check_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    # found without shrinking: every failure class of the stale entry would be shrunk too
    failure = _fails(make(_TwoBugs), max_failures=6, report=out, profile=FIND_ONLY)
    report = failure.report
    # the stale entry is found; with each failure set aside, the search goes on and finds more
    assert "INV-INDEX" in report.checks and len(report.fingerprints) >= 2, report.checks
    # the other bug is found too, beside the stale entry's several failure classes
    assert any(fp.startswith("CAN-ADMIT#") for fp in report.fingerprints), report.summary()
    assert len(set(report.fingerprints)) == len(report.fingerprints)
    data = json.loads(out.read_text())
    assert data["passed"] is False and [f["check"] for f in data["failures"]] == report.checks
    for f in data["failures"]:
        assert f["replay"][1].startswith("cache = make(") and f["steps"] >= 1
        assert f["first_seen_s"] >= f["find_s"] >= 0 and f["shrink_s"] >= 0
        assert f["fingerprint"].startswith(f["check"] + "#") and f["operation"]
    assert f"{len(report.checks)} root cause(s) failed" in str(failure)


def test_ignoring_a_check_and_skipping_a_rule() -> None:
    failure = _fails(make(StaleHashAfterReuse), ignore="INV-INDEX")
    assert failure.check != "INV-INDEX" and failure.report.ignored == ("INV-INDEX",)
    # the only batched frees left come from the rules below: skip them and it passes
    report = _run(
        make_double_free_in_batch,
        skip_rules=["free", "parallel_sampling", "reset", "bad_sequence_op"],
        ignore="CRASH",
    )
    assert report.passed and "free" in report.skipped_rules


def test_unknown_rule_names_are_refused() -> None:
    with pytest.raises(ValueError, match="no rule named frees"):
        _run(make(EngineStyleManager), skip_rules="frees", examples=1)
