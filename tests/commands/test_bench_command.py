"""``prefixkv bench --quick``: every code path, well-formed, positive, finite output and
the files it writes. No speed is asserted: the figures come from the command itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from prefixkv import cli
from prefixkv.benchmarks.cache_report import BEGIN, END
from prefixkv.benchmarks.lifecycle import VARIANTS


def _positive_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_bench_quick_json_and_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["bench", "--quick", "--out", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)  # stdout is one JSON document
    assert code == 0 and report["ok"] is True and report["quick"] is True
    life = report["lifecycle"]
    assert "percall" in life["variants"]
    assert set(life["variants"]) | set(life["variants_missing"]) == set(VARIANTS)
    sizes = {r["num_blocks"] for r in life["rows"]}
    assert len(sizes) == 2 and len(life["rows"]) == 2 * len(life["variants"])
    for row in life["rows"]:
        for key in ("median_us", "q1_us", "q3_us", "min_us", "max_us"):
            assert _positive_finite(row[key]), (key, row)
        assert row["q1_us"] <= row["median_us"] <= row["q3_us"]
        assert row["values"] == len(row["values_us"]) >= 2 and row["processes"] >= 1
        assert 0 < row["hit_rate"] < 1 and row["blocks_touched"] > 0
    for ratio in life["ratios"]:
        assert all(_positive_finite(v) for v in ratio.values())
    batch = report["continuous_batch"]
    assert batch["running"] > 1 and batch["variants"] == life["variants"]
    assert len(batch["rows"]) == len(batch["variants"])
    for row in batch["rows"]:
        assert _positive_finite(row["median_us"]) and 0 < row["hit_rate"] < 1
    for ratio in batch["ratios"]:
        assert all(_positive_finite(v) for v in ratio.values())
    spec = report["spec_beside_impl"]
    assert _positive_finite(spec["spec"]["median_us"]) and _positive_finite(spec["spec_over_impl"])
    for row in report["memory"]:
        assert row["cached_blocks"] > 0
        assert math.isfinite(row["rss_bytes_per_block"])
        assert _positive_finite(row["tracemalloc_bytes_per_block"])
    lookups = report["lookups"]
    assert lookups and all(_positive_finite(r["ratio"]) for r in lookups)
    assert all(r["largest_bucket"] >= 1 for r in lookups)
    assert report["machine"]["python"] and report["machine"]["cpu"]
    saved = json.loads((tmp_path / "bench" / "cache.json").read_text())
    assert saved["lifecycle"] == life
    assert (tmp_path / "bench" / "cache_per_block.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks") and BEGIN in md and END in md
