"""Every report says what the run exercised: rules fired, refused and skipped (with the
capability that excludes each skipped rule), and operations per kind; a manager that
refuses most of the workload does not look like a plain pass."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from prefixkv.spec import InvalidOperation

from examples.minimal_engine import MinimalEngine
from examples.minimal_engine_adapter import MinimalEngineAdapter, make_manager
from prefixkv.conformance import adapter, run_conformance


def test_a_report_names_what_ran_and_what_did_not(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    report = run_conformance(make_manager, max_examples=20, steps=20, profile="ci", report=out)
    cov = report.coverage
    assert cov.fired["admit"] > 0 and cov.ops["admit"] > 0 and "init" not in cov.fired
    # each rule the capabilities exclude is named with the capability
    assert cov.skipped["rollback"] == "-speculative -rollback"  # it needs both
    assert cov.skipped["evict"] == "-evict" and cov.skipped["reset"] == "-reset"
    assert cov.skipped["continue_prefill"] == "-chunked_prefill"
    assert cov.skipped["match_rich"] == "-multimodal"
    assert not set(cov.skipped) & set(cov.fired)
    data = json.loads(out.read_text())["coverage"]
    assert data["skipped"]["rollback"] == "-speculative -rollback"
    assert data["rules"]["admit"]["fired"] == cov.fired["admit"]
    assert "coverage (rule: fired, refused):" in report.summary()
    assert "rollback               skipped: -speculative -rollback" in report.summary()


class _RefusesDecode(MinimalEngineAdapter):
    """Correct, but refuses every commit past the prompt: most decode work never runs."""

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        s = self.e.seqs.get(seq_id)
        if s is not None and num_computed and s.num_computed_tokens >= s.num_prompt_tokens:
            raise InvalidOperation("this engine does not decode")
        super().commit(seq_id, num_computed, accepted_tokens)


def test_a_manager_that_refuses_the_workload_is_flagged() -> None:
    @adapter(capabilities=make_manager.capabilities)
    def refusing(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        return _RefusesDecode(MinimalEngine(num_blocks, block_size))

    report = run_conformance(refusing, max_examples=20, steps=20, profile="ci", skip_rules="")
    assert report.passed
    assert "advance" in report.coverage.mostly_refused(), report.summary()
    assert "WARNING, mostly refused" in report.summary()


@pytest.mark.parametrize(
    "target",
    [
        "examples.engine_style:make_manager",
        "examples.vllm_style_adapter:make_manager",
        "examples.radix_style_adapter:make_manager",
        "examples.hybrid_style_adapter:make_manager",
        "examples.minimal_engine_adapter:make_manager",
        "examples.mtp_engine_adapter:make_manager",
    ],
)
def test_the_example_managers_are_rarely_refused(target: str) -> None:
    """Rules draw only what the capabilities allow: no rule is refused in more than 10% of
    its firings on a correct example manager."""
    module, _, name = target.partition(":")
    factory = getattr(importlib.import_module(module), name)
    report = run_conformance(factory, max_examples=30, steps=30, profile="ci")
    assert report.passed and not report.coverage.mostly_refused(), report.summary()
