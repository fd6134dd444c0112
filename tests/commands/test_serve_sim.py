"""``prefixkv serve-sim``: runs, reports, plots, and exits 1 when cache on != cache off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixkv import cli
from prefixkv.engine import Engine

SMALL = ["serve-sim", "--conversations", "4", "--turns", "2", "--system-tokens", "32"]


def test_serve_sim_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "ttft.png"
    code = cli.main([*SMALL, "--json", "--plot", str(png)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["cache_on_equals_cache_off"]
    assert report["prefill_tokens_skipped"] > 0 and 0 < report["hit_rate"] < 1
    assert report["tokens_computed_on"] < report["tokens_computed_off"]
    assert report["requests"] == 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_sim_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SMALL, "--draft-tokens", "2", "--hybrid"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50" in out and "cache on == cache off" in out and "yes" in out
    assert "checkpoint hit rate" in out and "restored of" in out


def test_serve_sim_fails_when_the_cache_serves_wrong_kv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = Engine.run

    def corrupting_run(self: Engine, workload: Any, **kw: Any) -> Any:
        if not self.config.cache_enabled:
            return real_run(self, workload, **kw)

        def on_step(engine: Engine, plan: Any) -> None:
            kw["on_step"](engine, plan)
            for b in engine.cache.snapshot().blocks:
                if b.published and b.depth == 1:
                    engine.pool.corrupt(b.block_id, amount=0.01)

        return real_run(self, workload, on_step=on_step)

    monkeypatch.setattr(Engine, "run", corrupting_run)
    code = cli.main([*SMALL, "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # still exactly one JSON document
    assert "cache on != cache off" in captured.err
    assert code == 1
    assert report["cache_on_equals_cache_off"] is False and report["mismatch"]


def test_bench_engine_tiny(tmp_path: Path) -> None:
    from prefixkv.benchmarks.engine import (
        FRACTIONS,
        EngineBenchConfig,
        run_engine_bench,
        write_outputs,
    )

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
