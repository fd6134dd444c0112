"""Differential state machines: SpecCache (the reference) against prefixkv.impl.

Each machine drives both caches with the same operations, bad inputs included, and checks
after every step that results, exceptions and snapshots agree and that every invariant holds
(see prefixkv/conformance/machines/differential.py and docs/testing.md).

Example counts scale with the Hypothesis profile (``dev``, ``ci``, ``thorough``); step counts
are fixed per machine. One machine runs long sequences (many steps per example).
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from prefixkv.spec import SpecCache

from prefixkv.conformance.machines import (
    BAD_ACCEPTED,
    BAD_ARGUMENT_KINDS,
    BAD_COUNTS,
    BAD_FEATURE_KINDS,
    BAD_REQUEST_ARGS,
    BAD_REQUEST_KINDS,
    BAD_SEQUENCE_KINDS,
    BAD_SPAN_ARGS,
    BAD_SPANS,
    NOT_A_REQUEST,
    all_rule_names,
    build_machine,
    candidate_class,
    spec_vs_impl,
)


def _examples(fraction: float, minimum: int = 5) -> int:
    """A fraction of the active profile's ``max_examples`` (ci: 150, thorough: 2000)."""
    return max(minimum, int(settings().max_examples * fraction))


def test_candidate_is_the_impl() -> None:
    """The machines test prefixkv.impl, not a stand-in (the stand-in is for bootstrapping)."""
    assert candidate_class() is not SpecCache
    assert candidate_class().__module__.startswith("prefixkv.impl")


# NOTE: the colliding hashes run first. A bug that only shows under a hash collision (a hit
# trusted without the exact check, or checked against too little) cannot show under
# fast_hash at all; run after the fast machine, it failed only about 45 s into a CI run.

# weak_hash: four buckets, so nearly every lookup collides. The spec keys its index by exact
# identity and does not care; the impl must verify every hit exactly.
SpecVsImplWeak = build_machine("SpecVsImplWeak", spec_vs_impl("weak"))
TestSpecVsImplWeak = SpecVsImplWeak.TestCase
TestSpecVsImplWeak.settings = settings(max_examples=_examples(1.0), stateful_step_count=100)

# tokens only: equal tokens collide exactly, and most buckets hold a single block, so the
# impl's single-candidate fast path must verify the whole identity too.
SpecVsImplTokens = build_machine("SpecVsImplTokens", spec_vs_impl("tokens"))
TestSpecVsImplTokens = SpecVsImplTokens.TestCase
TestSpecVsImplTokens.settings = settings(max_examples=_examples(0.5), stateful_step_count=100)

# fast_hash: the default configuration.
SpecVsImplFast = build_machine("SpecVsImplFast", spec_vs_impl("fast"))
TestSpecVsImplFast = SpecVsImplFast.TestCase
TestSpecVsImplFast.settings = settings(max_examples=_examples(1.0), stateful_step_count=100)

# sha256: the hash for events that leave the process; a short run.
SpecVsImplSha = build_machine("SpecVsImplSha256", spec_vs_impl("sha256"))
TestSpecVsImplSha256 = SpecVsImplSha.TestCase
TestSpecVsImplSha256.settings = settings(max_examples=_examples(0.1), stateful_step_count=50)

# Long runs: many steps per example, on slightly bigger pools, so that long-lived caches
# (deep chains, many evictions, heap compaction, repeated resets) are reached.
SpecVsImplLong = build_machine(
    "SpecVsImplLong", spec_vs_impl("weak", heap_slack=-8), num_blocks=(8, 32), block_sizes=(1, 3)
)
TestSpecVsImplLong = SpecVsImplLong.TestCase
TestSpecVsImplLong.settings = settings(max_examples=_examples(0.15), stateful_step_count=400)

#: Invalid steps (a rule in which some operation raised) must stay below this fraction.
MAX_INVALID_FRACTION = 0.25


def test_rule_coverage() -> None:
    """Every rule fires, invalid steps stay rare; prints the counts and rules per second."""
    machine = build_machine("SpecVsImplCoverage", spec_vs_impl("fast"))
    machine.coverage.reset()
    start = time.perf_counter()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=200, stateful_step_count=50, derandomize=True, database=None
        ),
    )
    report = machine.coverage.report()
    print(f"\n{report.format()}\nwall {time.perf_counter() - start:.1f} s")
    assert not report.never_fired(all_rule_names(machine)), report.format()
    assert report.invalid_fraction < MAX_INVALID_FRACTION, report.format()
    # Every public operation ran, and ran successfully at least once where it can.
    for op in (
        "match", "can_admit", "admit", "can_append", "append", "commit", "rollback", "free",
        "evict", "reset", "block_table", "num_computed_tokens", "seq_ids", "stats",
        "take_events", "can_continue_prefill", "continue_prefill",
    ):  # fmt: skip
        assert report.ops.get(op, 0) > report.op_errors.get(op, 0), f"{op} never succeeded"


def test_every_bad_input_kind() -> None:
    """A scripted run drives every bad-input kind through both caches (deterministically)."""
    machine = build_machine("SpecVsImplScripted", spec_vs_impl("fast"))
    state: Any = machine()
    state.init(num_blocks=8, block_size=2, record_events=True)
    ids = [
        state.engine_step(
            ns=i % 3,
            tokens=(1, 2, 3, 4, 5),
            budget=None,
            steps=[(2, 1)],
            sampled=(3,),
            finish=False,
        )
        for i in range(2)
    ]
    state.free(first=ids[1], more=0)
    seq = ids[0]
    for kind in BAD_SEQUENCE_KINDS:
        state._since_bad = 3
        state.bad_sequence_op(kind=kind, seq=seq, tokens=(1, 2, 3))
    for kind in BAD_ARGUMENT_KINDS:
        for count, accepted in zip(BAD_COUNTS, BAD_ACCEPTED * 2, strict=False):
            state._since_bad = 3
            state.bad_argument(kind=kind, seq=seq, count=count, accepted=accepted)
    for kind in BAD_REQUEST_KINDS:
        for bad, obj in zip(BAD_REQUEST_ARGS, NOT_A_REQUEST * 3, strict=False):
            state._since_bad = 3
            state.bad_request(kind=kind, bad=bad, obj=obj)
    for kind in BAD_FEATURE_KINDS:
        for bad, span in zip(BAD_SPAN_ARGS, BAD_SPANS * 2, strict=False):
            state._since_bad = 3
            state.bad_feature_input(kind=kind, seq=seq, bad=bad, span=span, count=0)
    assert state.ref.seq_ids() == (seq,)
    state.teardown()
