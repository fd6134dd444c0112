"""Kernel benchmarks against the machine's own ceilings and torch SDPA.

The measurements behind ``prefixkv bench-kernels [--json] [--out docs/] [--dry-run]``
(:mod:`prefixkv.commands.bench_kernels`; :mod:`prefixkv.benchmarks.kernels` writes the
report). On a CUDA machine :func:`run` measures, in one run:

* the ceilings: device-to-device copy bandwidth (``Tensor.copy_`` of a large buffer,
  bytes read + written) and dense bf16 matmul TFLOP/s;
* the data-movement kernels (write, gather, block copy, state-slot copy) in GB/s and as a
  fraction of the copy ceiling;
* prefix-prefill attention in TFLOP/s (causal FLOPs actually computed) against torch SDPA
  with the flash and cuDNN backends on gathered contiguous KV (the naive path: gather the
  paged KV, then run dense attention), with the gather time included; cached fractions
  0 / 50 / 90 %, contexts 1k to 32k;
* split-K decode attention in GB/s (K/V bytes read) and as a fraction of copy bandwidth.

Neither path counts writing the new tokens' K/V into the cache: both must do it.
:data:`DRY_SIZES` on the CPU under the Triton interpreter (``TRITON_INTERPRET=1``, set
before triton is imported) runs every code path at toy sizes, timings meaningless, so the
benchmark cannot rot unnoticed on machines without a GPU.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DRY_SIZES", "GPU_SIZES", "BenchSizes", "causal_prefill_flops", "run"]


@dataclass(frozen=True)
class BenchSizes:
    """Every size the benchmark uses; :data:`GPU_SIZES` for real runs, :data:`DRY_SIZES` toy."""

    dtype_name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    copy_bytes: int
    matmul_n: int
    move_tokens: int
    copy_pairs: int
    state_slots: int
    state_numel: int
    prefill_contexts: tuple[int, ...]
    prefill_tokens: int  # KV tokens per batch: batch = max(1, prefill_tokens // context)
    cached_fracs: tuple[float, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_max_tokens: int


GPU_SIZES = BenchSizes(
    dtype_name="bfloat16",
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    page_size=16,
    copy_bytes=1 << 30,
    matmul_n=8192,
    move_tokens=65536,
    copy_pairs=4096,
    state_slots=256,
    state_numel=32 * 64 * 128,
    prefill_contexts=(1024, 2048, 4096, 8192, 16384, 32768),
    prefill_tokens=32768,
    cached_fracs=(0.0, 0.5, 0.9),
    decode_batches=(1, 16, 64),
    decode_contexts=(1024, 4096, 16384, 32768),
    decode_max_tokens=1 << 21,
)

DRY_SIZES = BenchSizes(
    dtype_name="float16",
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    page_size=4,
    copy_bytes=1 << 16,
    matmul_n=64,
    move_tokens=24,
    copy_pairs=3,
    state_slots=8,
    state_numel=64,
    prefill_contexts=(16, 32),
    prefill_tokens=32,
    cached_fracs=(0.0, 0.5, 0.9),
    decode_batches=(1, 2),
    decode_contexts=(16, 40),
    decode_max_tokens=80,
)


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def _timer(device: Any) -> Callable[[Callable[[], object]], float]:
    """Milliseconds per call: ``triton.testing.do_bench`` (median) on a GPU, else wall."""
    if device.type == "cuda":
        import triton.testing

        def gpu(fn: Callable[[], object]) -> float:
            return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

        return gpu

    def wall(fn: Callable[[], object]) -> float:
        fn()
        samples = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    return wall


# ---------------------------------------------------------------------------------------
# The measurements
# ---------------------------------------------------------------------------------------


def run(device: Any, sz: BenchSizes, *, dry_run: bool = False) -> dict[str, Any]:
    """Every measurement at the sizes ``sz`` on ``device``, as one JSON-ready dict."""
    import torch
    import triton

    torch.manual_seed(0)
    timer = _timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    ceilings = measure_ceilings(device, sz, timer)
    return {
        "device": name,
        "dry_run": dry_run,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": sz.dtype_name,
        "heads": {
            "q": sz.num_q_heads,
            "kv": sz.num_kv_heads,
            "head_dim": sz.head_dim,
            "page_size": sz.page_size,
        },
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "ceilings": ceilings,
        "movement": measure_movement(device, sz, timer, ceilings["copy_gbps"]),
        "prefill": measure_prefill(device, sz, timer, ceilings["bf16_matmul_tflops"]),
        "decode": measure_decode(device, sz, timer, ceilings["copy_gbps"]),
    }


def measure_ceilings(device: Any, sz: BenchSizes, timer: Callable[..., float]) -> dict[str, float]:
    import torch

    n = sz.copy_bytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    copy_gbps = 2 * sz.copy_bytes / ms / 1e6  # read + write
    m = sz.matmul_n
    a = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    ms = timer(lambda: a @ b)
    return {"copy_gbps": copy_gbps, "bf16_matmul_tflops": 2 * m**3 / ms / 1e9}


def _paged_cache(device: Any, sz: BenchSizes, num_tokens: int, *, slack: int = 1) -> Any:
    import torch

    dtype = getattr(torch, sz.dtype_name)
    pages = -(-num_tokens // sz.page_size) * slack + 1
    shape = (pages, sz.page_size, sz.num_kv_heads, sz.head_dim)
    kv = torch.randn((pages, 2, *shape[1:]), dtype=dtype, device=device)
    key_cache, value_cache = kv.unbind(1)  # strided views, as engines allocate them
    return key_cache, value_cache


def _batch(device: Any, sz: BenchSizes, cached: list[int], new: list[int], num_pages: int) -> Any:
    """Batch metadata with each sequence's pages drawn at random from the pool."""
    import torch

    from .metadata import build_batch_metadata

    perm = torch.randperm(num_pages).tolist()
    ids, at = [], 0
    for c, q in zip(cached, new, strict=True):
        n = -(-(c + q) // sz.page_size)
        ids.append(perm[at : at + n])
        at += n
    return build_batch_metadata(cached, new, ids, sz.page_size, device=device)


def _row(kernel: str, shape: str, nbytes: float, ms: float, ceiling: float) -> dict[str, Any]:
    gbps = nbytes / ms / 1e6
    return {
        "kernel": kernel,
        "shape": shape,
        "bytes": nbytes,
        "ms": ms,
        "gbps": gbps,
        "frac_of_copy": gbps / ceiling,
    }


def measure_movement(
    device: Any, sz: BenchSizes, timer: Callable[..., float], copy_gbps: float
) -> list[dict[str, Any]]:
    import torch

    from .cache_ops import copy_blocks, gather_kv, write_kv
    from .state_ops import copy_state_slots, plan_state_copy

    dtype = getattr(torch, sz.dtype_name)
    elem = torch.empty((), dtype=dtype).element_size()
    tok_bytes = sz.num_kv_heads * sz.head_dim * elem
    rows: list[dict[str, Any]] = []
    n = sz.move_tokens
    key_cache, value_cache = _paged_cache(device, sz, n)
    k = torch.randn(n, sz.num_kv_heads, sz.head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    slots = torch.randperm(key_cache.shape[0] * sz.page_size, device=device)[:n]
    ms = timer(lambda: write_kv(k, v, key_cache, value_cache, slots))
    rows.append(_row("write_kv", f"{n} tokens", 2 * 2 * n * tok_bytes, ms, copy_gbps))

    seqs = max(1, n // 4096) if device.type == "cuda" else 2
    per = n // seqs
    meta = _batch(device, sz, [per] * seqs, [0] * seqs, key_cache.shape[0])
    total = per * seqs
    out = (
        torch.empty(total, sz.num_kv_heads, sz.head_dim, dtype=dtype, device=device),
        torch.empty(total, sz.num_kv_heads, sz.head_dim, dtype=dtype, device=device),
    )
    ms = timer(
        lambda: gather_kv(
            key_cache,
            value_cache,
            meta.block_table,
            meta.seq_lens,
            max_seq_len=meta.max_seq_len,
            out=out,
        )
    )
    rows.append(_row("gather_kv", f"{seqs}x{per} tokens", 2 * 2 * total * tok_bytes, ms, copy_gbps))

    pairs = min(sz.copy_pairs, key_cache.shape[0] // 2)
    perm = torch.randperm(key_cache.shape[0], device=device)
    mapping = torch.stack([perm[:pairs], perm[pairs : 2 * pairs]], dim=1)
    ms = timer(lambda: copy_blocks([key_cache, value_cache], mapping))
    rows.append(
        _row(
            "copy_blocks",
            f"{pairs} pairs x K,V",
            2 * 2 * pairs * sz.page_size * tok_bytes,
            ms,
            copy_gbps,
        )
    )

    state = torch.randn(sz.state_slots, sz.state_numel, dtype=dtype, device=device)
    ckpt = torch.empty_like(state)
    half = sz.state_slots // 2
    for label, src in (
        ("runs", list(range(half))),
        ("scattered", list(range(0, sz.state_slots, 2))),
    ):
        plan = plan_state_copy(src, list(range(len(src))), device=device)
        ms = timer(lambda plan=plan: copy_state_slots(state, ckpt, plan))
        rows.append(
            _row(
                f"copy_state_slots ({label})",
                f"{len(src)} slots x {sz.state_numel}",
                2 * len(src) * sz.state_numel * elem,
                ms,
                copy_gbps,
            )
        )
    return rows


def causal_prefill_flops(context: int, cached: int, heads: int, head_dim: int) -> int:
    """FLOPs of QK^T and PV over the visible (bottom-right causal) pairs only."""
    new = context - cached
    pairs = new * cached + new * (new + 1) // 2
    return 4 * head_dim * heads * pairs


def _sdpa_runner(
    backend_name: str, q: Any, k: Any, v: Any, q_len: int, kv_len: int
) -> Callable[[], object]:
    """Dense SDPA on gathered KV with one backend; GQA natively or by expanding K/V."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[
        backend_name
    ]
    group = q.shape[1] // k.shape[1]
    mask = None if q_len == kv_len else causal_lower_right(q_len, kv_len)

    def native() -> object:
        with sdpa_kernel(backend):
            if mask is None:
                return sdpa(q, k, v, is_causal=True, enable_gqa=True)
            return sdpa(q, k, v, attn_mask=mask, enable_gqa=True)

    def expanded() -> object:
        ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        with sdpa_kernel(backend):
            if mask is None:
                return sdpa(q, ke, ve, is_causal=True)
            return sdpa(q, ke, ve, attn_mask=mask)

    errors = []
    for fn in (native, expanded):
        try:
            fn()
            if q.device.type == "cuda":
                torch.cuda.synchronize()
            return fn
        except Exception as e:  # a backend that cannot run this shape is reported, not fatal
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    raise RuntimeError("; ".join(errors))


def measure_prefill(
    device: Any, sz: BenchSizes, timer: Callable[..., float], matmul_tflops: float
) -> list[dict[str, Any]]:
    import torch

    from .attention import prefill_attention
    from .cache_ops import gather_kv

    dtype = getattr(torch, sz.dtype_name)
    rows: list[dict[str, Any]] = []
    for ctx in sz.prefill_contexts:
        batch = max(1, sz.prefill_tokens // ctx)
        key_cache, value_cache = _paged_cache(device, sz, batch * ctx, slack=2)
        for frac in sz.cached_fracs:
            cached = int(ctx * frac) // sz.page_size * sz.page_size
            q_len = ctx - cached
            meta = _batch(device, sz, [cached] * batch, [q_len] * batch, key_cache.shape[0])
            q = torch.randn(batch * q_len, sz.num_q_heads, sz.head_dim, dtype=dtype, device=device)
            flops = batch * causal_prefill_flops(ctx, cached, sz.num_q_heads, sz.head_dim)
            base = {
                "context": ctx,
                "cached_frac": frac,
                "cached": cached,
                "batch": batch,
                "q_len": q_len,
                "flops": flops,
            }

            def ours(
                meta: Any = meta, q: Any = q, kc: Any = key_cache, vc: Any = value_cache
            ) -> object:
                return prefill_attention(
                    q,
                    kc,
                    vc,
                    meta.block_table,
                    meta.query_start_loc,
                    meta.seq_lens,
                    max_query_len=meta.max_query_len,
                )

            ms = timer(ours)
            rows.append(
                {
                    **base,
                    "backend": "prefixkv (paged)",
                    "ms": ms,
                    "tflops": flops / ms / 1e9,
                    "frac_of_matmul": flops / ms / 1e9 / matmul_tflops,
                    "error": None,
                }
            )
            gk = torch.empty(batch * ctx, sz.num_kv_heads, sz.head_dim, dtype=dtype, device=device)
            gv = torch.empty_like(gk)
            qd = q.view(batch, q_len, sz.num_q_heads, sz.head_dim).transpose(1, 2)
            kd = gk.view(batch, ctx, sz.num_kv_heads, sz.head_dim).transpose(1, 2)
            vd = gv.view(batch, ctx, sz.num_kv_heads, sz.head_dim).transpose(1, 2)
            for backend in ("flash", "cudnn"):
                label = f"sdpa {backend} + gather"
                try:
                    attend = _sdpa_runner(backend, qd, kd, vd, q_len, ctx)
                except RuntimeError as e:
                    rows.append(
                        {
                            **base,
                            "backend": label,
                            "ms": None,
                            "tflops": None,
                            "frac_of_matmul": None,
                            "error": str(e),
                        }
                    )
                    continue

                def naive(
                    meta: Any = meta,
                    attend: Callable[[], object] = attend,
                    kc: Any = key_cache,
                    vc: Any = value_cache,
                    gk: Any = gk,
                    gv: Any = gv,
                ) -> object:
                    gather_kv(
                        kc,
                        vc,
                        meta.block_table,
                        meta.seq_lens,
                        max_seq_len=meta.max_seq_len,
                        out=(gk, gv),
                    )
                    return attend()

                ms = timer(naive)
                rows.append(
                    {
                        **base,
                        "backend": label,
                        "ms": ms,
                        "tflops": flops / ms / 1e9,
                        "frac_of_matmul": flops / ms / 1e9 / matmul_tflops,
                        "error": None,
                    }
                )
    return rows


def measure_decode(
    device: Any, sz: BenchSizes, timer: Callable[..., float], copy_gbps: float
) -> list[dict[str, Any]]:
    import torch

    from .attention import decode_attention, decode_num_splits

    dtype = getattr(torch, sz.dtype_name)
    elem = torch.empty((), dtype=dtype).element_size()
    rows: list[dict[str, Any]] = []
    for ctx in sz.decode_contexts:
        for batch in sz.decode_batches:
            if batch * ctx > sz.decode_max_tokens:
                continue
            key_cache, value_cache = _paged_cache(device, sz, batch * ctx)
            meta = _batch(device, sz, [ctx - 1] * batch, [1] * batch, key_cache.shape[0])
            q = torch.randn(batch, sz.num_q_heads, sz.head_dim, dtype=dtype, device=device)
            block_n = 16 if device.type != "cuda" else (64 if sz.head_dim > 64 else 128)
            splits = decode_num_splits(batch, sz.num_kv_heads, ctx, block_n, device)
            ms = timer(
                lambda meta=meta, q=q, kc=key_cache, vc=value_cache: decode_attention(
                    q, kc, vc, meta.block_table, meta.seq_lens, max_seq_len=meta.max_seq_len
                )
            )
            nbytes = 2 * batch * ctx * sz.num_kv_heads * sz.head_dim * elem
            gbps = nbytes / ms / 1e6
            rows.append(
                {
                    "batch": batch,
                    "context": ctx,
                    "splits": splits,
                    "bytes": nbytes,
                    "ms": ms,
                    "gbps": gbps,
                    "frac_of_copy": gbps / copy_gbps,
                }
            )
            del key_cache, value_cache
    return rows


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------
