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
    """``--plot PATH`` without a suffix writes PATH.png, and reports the file it wrote."""
    png = tmp_path / "ttft.png"
    code = cli.main([*SMALL, "--json", "--plot", str(tmp_path / "ttft")])
    report = json.loads(capsys.readouterr().out)
    assert report["plot"] == str(png)
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
