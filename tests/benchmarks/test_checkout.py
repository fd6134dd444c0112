"""``prefixkv bench --baseline PATH``: another checkout's code, importable in a subprocess.

The "other" checkout here is this one, reached only through the tree ``import_root`` builds,
so the tests need no second copy of the project; what they check is that the subprocess
imports from the checkout it was given, refuses anything else, and times a case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from prefixkv.benchmarks.cache import QUICK, run_cases
from prefixkv.benchmarks.cache_report import render_markdown
from prefixkv.benchmarks.checkout import check_root, import_root
from prefixkv.benchmarks.errors import BenchmarkFailed
from prefixkv.benchmarks.lifecycle import VARIANTS

REPO = Path(__file__).resolve().parents[2]


def test_the_tree_imports_the_checkout_it_was_built_from(tmp_path: Path) -> None:
    root = import_root(REPO, tmp_path / "tree")
    assert (root / "prefixkv" / "impl").resolve() == (REPO / "impl").resolve()
    assert check_root(root, REPO) == VARIANTS


def test_a_tree_of_another_checkout_is_refused(tmp_path: Path) -> None:
    """The subprocess must import the baseline's code: a tree built from one checkout but
    checked against another path is refused (so a run never times one checkout twice)."""
    root = import_root(REPO, tmp_path / "tree")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(BenchmarkFailed, match=r"not .*elsewhere"):
        check_root(root, elsewhere)


def test_a_directory_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'other'\n")
    with pytest.raises(BenchmarkFailed, match="not a prefixkv checkout"):
        import_root(tmp_path, tmp_path / "tree")


def test_a_baseline_case_runs_the_checkouts_code(tmp_path: Path) -> None:
    root = import_root(REPO, tmp_path / "tree")
    case: dict[str, Any] = {
        "kind": "lifecycle",
        "tag": "base",
        "manager": "impl",
        "variant": "columns",
        "num_blocks": 64,
        "trace": {"conversations": 2, "turns": 2, "system_tokens": 32},
        "live": 2,
        "running": 1,
    }
    config = attrs.evolve(QUICK, values=1)
    (timing,) = run_cases([case], config, tmp_path, lambda _: None, baseline_root=root).values()
    assert timing.values_us and all(v > 0 for v in timing.values_us)
    with pytest.raises(ValueError, match="without a baseline"):
        run_cases([case], config, tmp_path, lambda _: None)


def test_the_report_shows_the_baseline_and_its_ratios() -> None:
    saved = json.loads((REPO / "docs" / "bench" / "cache.json").read_text(encoding="utf-8"))
    row = next(r for r in saved["lifecycle"]["rows"] if r["variant"] == "fused")
    summary = {k: row[k] for k in ("median_us", "q1_us", "q3_us")}
    saved["baseline"] = {
        "commit": "abc1234",
        "variants": ["fused"],
        "rows": [
            {
                "num_blocks": row["num_blocks"],
                "variant": "fused",
                "baseline": {**summary, "median_us": 2 * row["median_us"]},
                "this_median_us": row["median_us"],
                "baseline_over_this": 2.0,
            }
        ],
    }
    text = render_markdown(saved)
    assert "Against the baseline (commit abc1234)" in text and "| 2.00x |" in text
    del saved["baseline"]
    assert "Against the baseline" not in render_markdown(saved)
