"""Hybrid-model differential machines: checkpoints and routed experts, spec against impl.

The whole differential rule set plus the hybrid rules (prefixkv/conformance/machines/
hybrid.py) on small state-slot pools, with INV-CKPT checked after every step. The coverage
test shows that every rule fires and every checkpoint transition, fate and interleaving the
design names is reached.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from prefixkv.conformance.machines import (
    BAD_HYBRID_KINDS,
    all_rule_names,
    build_hybrid_machine,
    hybrid_spec_vs_impl,
)
from prefixkv.conformance.machines.step_calls import StepCallRules


def _examples(fraction: float, minimum: int = 5) -> int:
    return max(minimum, int(settings().max_examples * fraction))


SpecVsImplHybrid = build_hybrid_machine("SpecVsImplHybrid", hybrid_spec_vs_impl("fast"))
TestSpecVsImplHybrid = SpecVsImplHybrid.TestCase
TestSpecVsImplHybrid.settings = settings(max_examples=_examples(0.25), stateful_step_count=60)

# The weaker variant: a four-bucket hash (every lookup collides) and pools of one or two
# runtime slots with no budget, so checkpoints live only in borrowed runtime slots.
SpecVsImplHybridWeak = build_hybrid_machine(
    "SpecVsImplHybridWeak",
    hybrid_spec_vs_impl("weak"),
    max_num_seqs=(1, 2),
    state_budgets=(0, 0),
)
TestSpecVsImplHybridWeak = SpecVsImplHybridWeak.TestCase
TestSpecVsImplHybridWeak.settings = settings(max_examples=_examples(0.15), stateful_step_count=60)

#: What the hybrid runs must reach (see HybridMachine's counters).
MUST_REACH = (
    "ckpt:free->reserved",
    "ckpt:reserved->ready",
    "ckpt:reserved->free",
    "ckpt:ready->pinned",
    "ckpt:pinned->ready",
    "ckpt:ready->free",
    "fate:saved@commit",
    "fate:discarded@rollback",
    "fate:discarded@free",
    "fate:restored@restore_issued",
    "fate:released_stale@evict",
    "fate:evicted@admit",
    "decode_save",
    "borrowed_runtime_slot",
    "evict_while_pinned",
    "state_budget=0",
    "decode_state_interval=on",
    "keep_state",
)


def test_hybrid_rule_and_lifecycle_coverage() -> None:
    """Every rule fires; every lifecycle transition and fate is reached; invalid steps
    stay rare."""
    machine = build_hybrid_machine("SpecVsImplHybridCoverage", hybrid_spec_vs_impl("fast"))
    machine.coverage.reset()
    start = time.perf_counter()
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=50, stateful_step_count=50, derandomize=True, database=None),
    )
    report = machine.coverage.report()
    print(f"\n{report.format()}\nwall {time.perf_counter() - start:.1f} s")
    assert not report.never_fired(all_rule_names(machine)), report.format()
    assert report.invalid_fraction < 0.3, report.format()
    missing = [key for key in MUST_REACH if not machine.coverage.variants.get(key)]
    assert not missing, f"never reached: {missing}\n{report.format()}"
    for op in (
        "restore_issued",
        "pending_restore",
        "state_slot",
        "checkpoint_reservation",
        "runtime_state",
        "keep_state",
    ):
        assert report.ops.get(op, 0) > report.op_errors.get(op, 0), f"{op} never succeeded"


def test_every_bad_hybrid_input_kind() -> None:
    """A scripted run drives every bad hybrid input through both caches."""
    state: Any = SpecVsImplHybrid()
    state.init(
        num_blocks=8,
        block_size=2,
        record_events=True,
        seqs_max=3,
        budget=1,
        interval=1,
        experts=True,
        keeps=True,
    )
    seq = state.next_turn(pick=0, extra=(1, 2), budget=None)
    for kind in BAD_HYBRID_KINDS:
        state._since_bad = 3
        state.bad_hybrid_input(kind=kind, seq=seq)
    for kind in BAD_HYBRID_KINDS:
        assert SpecVsImplHybrid.coverage.variants[f"bad_hybrid_input:{kind}"] >= 1
    state.teardown()


# The engine-shaped calls (advance, advance_batch) on the hybrid caches: the impl's hybrid
# advance checks every part up front and then runs its own commit, rollback and append,
# which move checkpoints, so the machine holds it to the spec's definition step by step.
SpecVsImplHybridSteps: Any = type(
    "SpecVsImplHybridSteps",
    (StepCallRules, build_hybrid_machine("SpecVsImplHybridSteps", hybrid_spec_vs_impl("fast"))),
    {},
)
TestSpecVsImplHybridSteps = SpecVsImplHybridSteps.TestCase
TestSpecVsImplHybridSteps.settings = settings(max_examples=_examples(1.0), stateful_step_count=60)
