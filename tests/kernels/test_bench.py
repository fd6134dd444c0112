"""The kernel benchmark's measurements: the FLOP count, and the timing path on a GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from prefixkv.kernels import bench

from prefixkv.benchmarks.kernels import write_outputs


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
