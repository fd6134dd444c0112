"""``prefixkv simulate``: the report, its JSON, invariant checks, the hashers, the table."""

from __future__ import annotations

import json

import pytest

from prefixkv import cli

SMALL = ["--conversations", "6", "--turns", "3"]


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = cli.main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)  # the whole of stdout is one JSON document


# -- simulate ------------------------------------------------------------------------------


def test_simulate_json_reports_hits_and_checks_invariants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report = _run_json(
        capsys, "simulate", *SMALL, "--num-blocks", "512", "--check-invariants", "400"
    )
    assert code == 0 and report["ok"] is True and report["cache"] == "impl"
    assert isinstance(report["hit_rate"], float) and report["hit_rate"] > 0
    computed, skipped = report["prefill_tokens_computed"], report["prefill_tokens_skipped"]
    assert isinstance(computed, int) and isinstance(skipped, int)
    assert computed + skipped == report["prefill_tokens"]
    assert isinstance(report["invariant_checks"], int) and report["invariant_checks"] > 1
    assert report["requests"] == 18
    for key in ("evictions", "blocks_published", "peak_utilization", "wall_time_s"):
        assert key in report


def test_simulate_spec_small_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_json(capsys, "simulate", "--spec", "--check-invariants", "25")
    assert code == 0 and report["cache"] == "spec"
    assert report["hit_rate"] > 0  # type: ignore[operator]
    assert report["invariant_checks"] > 1  # type: ignore[operator]


@pytest.mark.parametrize("name", ["multimodal", "speculative"])
def test_feature_workloads_report_their_lost_reuse_split(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The multimodal and speculative workloads run on the spec, invariants checked, and
    their lost-reuse split adds up to the prompt tokens computed."""
    code, report = _run_json(
        capsys, "simulate", "--workload", name, "--spec", "--check-invariants", "40"
    )
    assert code == 0 and report["workload_name"] == name
    lost = sum(
        report[f"lost_{c}"]  # type: ignore[misc]
        for c in ("window", "span", "cap", "evicted", "never_cached")
    )
    assert lost == report["prefill_tokens_computed"]
    assert 0 < report["hit_rate"] < 1  # type: ignore[operator]
    if name == "speculative":
        assert report["lost_window"] > 0 and report["drafts_proposed"] > 0  # type: ignore[operator]
        assert 0 < report["drafts_accepted"] < report["drafts_proposed"]  # type: ignore[operator]
    else:
        assert report["prefill_chunks"] > 0  # type: ignore[operator]
        assert report["workload"]["image_tokens"] > 0  # type: ignore[index]


def test_weak_hash_changes_no_result(capsys: pytest.CaptureFixture[str]) -> None:
    reports = []
    for name in ("fast", "weak", "sha256"):
        code, report = _run_json(capsys, "simulate", *SMALL, "--num-blocks", "300", "--hash", name)
        assert code == 0
        reports.append({k: report[k] for k in ("hit_rate", "evictions", "blocks_published")})
    assert reports[0] == reports[1] == reports[2]


def test_simulate_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "hit rate" in out and "prefill tokens skipped" in out and "wall time" in out
