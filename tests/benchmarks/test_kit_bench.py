"""The conformance kit's throughput benchmark: its code paths, not its speed.

No test here asserts a speed (the figures come from ``python -m prefixkv.benchmarks.kit``).
These check that the pyperf case times checked operations, that both sides of a run import
their own tree, that every seeded bug is listed, and that a bug's first failure is timed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from examples import minimal_engine_adapter
from prefixkv.benchmarks import kit
from prefixkv.benchmarks.errors import BenchmarkFailed
from prefixkv.benchmarks.timing import Timing
from prefixkv.benchmarks.worker import case_name, prepare


def test_the_kit_case_times_one_checked_operation() -> None:
    case = {
        "kind": "kit",
        "side": "this",
        "label": "minimal",
        "target": kit.TARGETS["minimal_engine"],
        "examples": 2,
        "steps": 10,
    }
    func, units = prepare(case)
    per_op = func(1)
    assert units == 1 and case_name(case) == "kit-minimal-this"
    assert 0 < per_op < 1 and math.isfinite(per_op)


def test_every_target_and_bug_module_exists() -> None:
    tree = kit.this_tree()
    assert all(kit._has_target(tree, t) for t in kit.TARGETS.values())
    assert not kit._has_target(tree, "examples.no_such_adapter:make")


def test_a_side_imports_its_own_tree(tmp_path: Path) -> None:
    kit._check_side(kit.this_tree(), tmp_path)
    (tmp_path / "src").mkdir()
    with pytest.raises(BenchmarkFailed):  # nothing to import there: not silently this tree
        kit._check_side(tmp_path, tmp_path)


def test_every_seeded_bug_is_listed() -> None:
    bugs = kit.seeded_bugs()
    names = {bug for module, bug in bugs.values() if module == "examples.minimal_engine_adapter"}
    assert names == set(minimal_engine_adapter.BUG_FACTORIES)
    assert len({module for module, _ in bugs.values()}) == len(kit.BUG_MODULES)


def test_a_first_failure_is_timed_and_named() -> None:
    found = kit.first_failure(
        "examples.minimal_engine_adapter", "decode_off_by_one", max_shrink_s=2.0
    )
    assert found.bug == "minimal_engine_adapter.decode_off_by_one"
    assert found.check in {"INV-LIMIT", "INV-SEQ"}
    assert found.first_s > 0 and found.shrink_s >= 0 and found.steps >= 1
    assert found.first_cpu_s > 0 and found.shrink_cpu_s >= 0
    assert found.calls >= 1


def test_the_report_gives_medians_spreads_and_ratios() -> None:
    timing = Timing((1000.0, 2000.0, 4000.0), 3).summary()  # µs per checked operation
    faster = Timing((500.0, 1000.0, 2000.0), 3).summary()
    result = kit.KitBenchResult(
        machine=kit.machine_info(),
        examples=1,
        steps=1,
        processes=3,
        baseline=True,
        throughput=(
            kit.Throughput("m", "baseline", timing),
            kit.Throughput("m", "this", faster),
        ),
        bugs=(kit.FirstFailure("m.bug", "INV-REF", 0.5, 3.0, False, 2, 0.25, 1.5, 5),),
    )
    assert result.throughput[0].ops_per_s == 500
    assert result.throughput[0].spread == (250, 1000)
    assert result.ratio("m") == 2 and result.ratio("other") is None
    text = kit.render_markdown(result)
    assert "| m | this tree | 1,000 | 500 - 2,000 | 2.00x |" in text
    assert "| m.bug | INV-REF | 0.50 | 3.0 | 1.5 | 2 | 5 |" in text
