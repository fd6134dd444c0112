"""The engine benchmark at a tiny size: rows per cached fraction, the ideal line, outputs."""

from __future__ import annotations

import json
from pathlib import Path

from prefixkv.benchmarks.engine import (
    FRACTIONS,
    EngineBenchConfig,
    run_engine_bench,
    write_outputs,
)


def test_bench_engine_tiny(tmp_path: Path) -> None:

    cfg = EngineBenchConfig(
        prompt_tokens=128,
        repeats=1,
        block_size=4,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
    )
    result = run_engine_bench(cfg)
    rows = result.rows
    assert [r.fraction for r in rows] == list(FRACTIONS)
    assert [r.cached_tokens for r in rows] == [0, 64, 112, 124]
    assert rows[0].ratio == 1.0 and all(r.median_ms > 0 for r in rows)
    md, js, png = write_outputs(result, tmp_path)
    assert "measured / ideal" in md.read_text()
    saved = json.loads(js.read_text())
    assert saved["rows"][2]["cached_tokens"] == 112 and saved["config"]["prompt_tokens"] == 128
    write_outputs(result, tmp_path)  # the generated section is replaced, not appended
    assert md.read_text().count("BEGIN generated") == 1
    assert png.read_bytes()[:4] == b"\x89PNG"
