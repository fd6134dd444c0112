"""``prefixkv bench-kernels``: clean refusal without CUDA, and every code path at toy sizes
(``--dry-run``, the Triton interpreter on the CPU), in a fresh process each: the
interpreter must be chosen before triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_json_is_one_error_object() -> None:
    r = _run("--json", interpret=False)
    assert r.returncode == EXIT_NO_CUDA
    report = json.loads(r.stdout)  # stdout is one JSON document, even on failure
    assert report["ok"] is False and report["exit_code"] == EXIT_NO_CUDA
    assert "no CUDA device" in report["error"]
