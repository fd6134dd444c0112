"""``prefixkv bench-kernels``: clean refusal without CUDA, and every code path at toy sizes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from prefixkv.kernels import bench

from prefixkv.benchmarks.kernels import write_outputs
from prefixkv.commands.bench_kernels import EXIT_NO_CUDA


def _run(*args: str, interpret: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "prefixkv", "bench-kernels", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_exits_nonzero_with_message() -> None:
    r = _run(interpret=False)
    assert r.returncode == EXIT_NO_CUDA
    assert "no CUDA device" in r.stderr
    assert "Traceback" not in r.stderr


def test_dry_run_exercises_every_path(tmp_path: Path) -> None:
    r = _run("--dry-run", "--json", "--out", str(tmp_path), interpret=True)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["dry_run"] is True
    assert {"copy_gbps", "bf16_matmul_tflops"} <= set(result["ceilings"])
    kernels = {m["kernel"] for m in result["movement"]}
    assert {"write_kv", "gather_kv", "copy_blocks"} <= kernels
    backends = {p["backend"] for p in result["prefill"]}
    assert backends == {"prefixkv (paged)", "sdpa flash + gather", "sdpa cudnn + gather"}
    assert {p["cached_frac"] for p in result["prefill"]} == {0.0, 0.5, 0.9}
    assert all(p["tflops"] for p in result["prefill"] if p["backend"] == "prefixkv (paged)")
    assert result["decode"]
    folder = tmp_path / "bench"
    for name in ("kernels.json", "kernels.md", "kernels_prefill.png", "kernels_bandwidth.png"):
        assert (folder / name).stat().st_size > 0, name
    assert "cpu (interpreter)" in (folder / "kernels.md").read_text()


def test_causal_flops() -> None:
    # 2 new tokens over 3 cached: query 0 sees 4 keys, query 1 sees 5 -> 9 pairs
    assert bench.causal_prefill_flops(5, 3, heads=1, head_dim=1) == 4 * 9
    # no prefix: the usual causal triangle L (L + 1) / 2
    assert bench.causal_prefill_flops(4, 0, heads=2, head_dim=8) == 4 * 8 * 2 * 10


@pytest.mark.gpu
def test_bench_code_paths_on_gpu(tmp_path: Path) -> None:
    """The real timing path (do_bench, SDPA backends) at toy sizes, bf16."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sizes = dataclasses.replace(
        bench.DRY_SIZES,
        dtype_name="bfloat16",
        head_dim=64,
        page_size=16,
        prefill_contexts=(256, 512),
        prefill_tokens=512,
        decode_contexts=(256, 1024),
        decode_max_tokens=4096,
    )
    result = bench.run(torch.device("cuda"), sizes)
    paths = write_outputs(result, tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)
    assert result["ceilings"]["copy_gbps"] > 0
