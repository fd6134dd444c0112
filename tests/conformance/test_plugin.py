"""The pytest plugin: ``--prefixkv-adapter`` adds a conformance test, and a failure prints
the replay of adapter calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

_ROOT = Path(__file__).parents[2]  # the examples package lives at the top level
_ARGS = ("-p", "no:cacheprovider", "--prefixkv-profile=ci", "--prefixkv-steps=30")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.syspathinsert(_ROOT)
    return pytester.runpytest_inprocess(*_ARGS, *args)


def test_inert_without_an_adapter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_other():\n    pass\n")
    result = _run(pytester)
    result.assert_outcomes(passed=1)


def test_a_conforming_adapter_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_other():\n    pass\n")
    result = _run(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_manager",
        "--prefixkv-examples=20",
        "--prefixkv-only",
    )
    result.assert_outcomes(passed=1, deselected=1)


def test_a_bug_fails_with_a_replay(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_stale_hash_after_reuse",
        "--prefixkv-max-failures=1",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*examples.engine_style:make_stale_hash_after_reuse failed INV-INDEX",
            "*minimal replay (* steps, * adapter calls; found in * s, shrunk in * s):*",
            "*cache = make(num_blocks=*",
        ]
    )
    # The replay replaces Hypothesis's own report of rule calls.
    assert "state = Conformance()" not in result.stdout.str()


def test_json_report_and_ignored_checks(pytester: pytest.Pytester) -> None:
    """--prefixkv-ignore looks past a check; --prefixkv-report writes what was found."""
    report = pytester.path / "conformance.json"
    result = _run(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_stale_hash_after_reuse",
        "--prefixkv-ignore=INV-INDEX",
        "--prefixkv-max-failures=1",
        f"--prefixkv-report={report}",
    )
    result.assert_outcomes(failed=1)
    data = json.loads(report.read_text())
    assert data["passed"] is False and data["ignored"] == ["INV-INDEX"]
    assert data["failures"][0]["check"] != "INV-INDEX"
    assert data["failures"][0]["replay"][1].startswith("cache = make(")


def test_skipped_rules_and_a_passing_report(pytester: pytest.Pytester) -> None:
    report = pytester.path / "ok.json"
    result = _run(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_manager",
        "--prefixkv-examples=10",
        "--prefixkv-skip-rule=reset,preempt",
        f"--prefixkv-report={report}",
    )
    result.assert_outcomes(passed=1)
    data = json.loads(report.read_text())
    assert data["passed"] and data["skipped_rules"] == ["reset", "preempt"]


def test_capabilities_from_the_command_line(pytester: pytest.Pytester) -> None:
    """The engine-style manager evicts FIFO: declared exact, it must fail."""
    result = _run(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_manager",
        "--prefixkv-capabilities=+exact",
        "--prefixkv-max-failures=1",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*examples.engine_style:make_manager failed *"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--prefixkv-adapter=nowhere:make",), "*No module named 'nowhere'*"),
        (("--prefixkv-adapter=examples.engine_style",), "*expected MODULE:FACTORY*"),
        (
            (
                "--prefixkv-adapter=examples.engine_style:make_manager",
                "--prefixkv-capabilities=-multimodl",
            ),
            "*unknown capability 'multimodl'*",
        ),
    ],
)
def test_bad_options_fail_clearly(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    result = _run(pytester, *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message])


def test_bad_step_count_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--prefixkv-steps=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--prefixkv-steps*at least 1*"])
