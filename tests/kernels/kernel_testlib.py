"""Shared helpers for the kernel tests: device-dependent sizes, batch drawing, canaries and
the attention tolerance rule."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from prefixkv.kernels.index_math import Layout
from prefixkv.kernels.metadata import BatchMetadata, build_batch_metadata

SENTINEL = 10000.0
"""Fills memory a kernel must not touch. Exactly representable in fp16/bf16/fp32 and far
outside anything ``randn`` draws, so a stray write or read shows."""

ATOL_FLOOR: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-3,
}
"""Absolute floor of the attention tolerance: where the naive implementation happens to be
(almost) exact, 2x its error would be ~0 and a correct kernel would fail by rounding. For
fp16/bf16 it is about the naive error itself; for fp32 it dominates (naive ~1e-7): a floor
of one output ulp (``eps * max|ref|``) was tried: fp16 passed a ``thorough`` run, fp32
failed by a few ulps (kernel error up to 3.3x naive), so the floors stay as they are."""


def examples(n: int) -> int:
    """``n`` examples under Hypothesis' default budget of 100, scaled with the active
    profile (so a ``thorough`` profile runs more and ``ci`` fewer), at least 3."""
    default = settings.default
    assert default is not None  # Hypothesis always has a default profile loaded
    return max(3, default.max_examples * n // 100)


@dataclass(frozen=True)
class Sizes:
    """Shape bounds for one device: tiny under the CPU interpreter, real on a GPU."""

    max_seqs: int
    max_new: int
    max_cached_blocks: int
    block_sizes: tuple[int, ...]
    kv_heads: tuple[int, ...]
    gqa_ratios: tuple[int, ...]
    copy_head_dims: tuple[int, ...]
    attn_head_dims: tuple[int, ...]
    decode_max_len: int
    state_numel: tuple[int, ...]
    conv_dims: tuple[int, ...]


CPU_SIZES = Sizes(
    max_seqs=3,
    max_new=20,
    max_cached_blocks=4,
    block_sizes=(1, 4, 8, 16),
    kv_heads=(1, 2),
    gqa_ratios=(1, 2, 4),
    copy_head_dims=(8, 20, 32),
    attn_head_dims=(64, 128),
    decode_max_len=70,
    state_numel=(1, 6, 40),
    conv_dims=(3, 16, 70),
)
GPU_SIZES = Sizes(
    max_seqs=8,
    max_new=600,
    max_cached_blocks=48,
    block_sizes=(16, 32, 64),
    kv_heads=(1, 8),
    gqa_ratios=(1, 4, 8),
    copy_head_dims=(64, 80, 128, 256),
    attn_head_dims=(64, 128),
    decode_max_len=33000,
    state_numel=(1, 1000, 32 * 64 * 16),
    conv_dims=(256, 4096),
)


def sizes_for(device: torch.device) -> Sizes:
    return GPU_SIZES if device.type == "cuda" else CPU_SIZES


def boundary_len(data: st.DataObject, block_size: int, max_len: int, min_len: int = 0) -> int:
    """A length, often a multiple of ``block_size`` plus -1, 0 or +1."""
    if data.draw(st.booleans(), label="at block boundary"):
        k = data.draw(st.integers(0, max(0, max_len // block_size)), label="blocks")
        n = k * block_size + data.draw(st.sampled_from((-1, 0, 1)), label="delta")
    else:
        n = data.draw(st.integers(min_len, max_len), label="len")
    return min(max(n, min_len), max_len)


@dataclass(frozen=True)
class DrawnBatch:
    cached: list[int]
    new: list[int]
    block_ids: list[list[int]]
    num_pages: int
    block_size: int
    meta: BatchMetadata


def draw_batch(
    data: st.DataObject,
    sz: Sizes,
    device: torch.device,
    *,
    block_size: int | None = None,
    min_new: int = 1,
    max_new: int | None = None,
    decode: bool = False,
) -> DrawnBatch:
    """Sequences with cached prefixes (zero allowed) and new tokens, pages drawn at random
    from a pool with spare pages left unused (they carry the canary)."""
    bs = block_size or data.draw(st.sampled_from(sz.block_sizes), label="block_size")
    n = data.draw(st.integers(1, sz.max_seqs), label="num_seqs")
    cached, new = [], []
    for _ in range(n):
        if decode:
            total = boundary_len(data, bs, sz.decode_max_len, min_len=1)
            cached.append(total - 1)
            new.append(1)
            continue
        cached.append(
            0
            if data.draw(st.booleans(), label="no prefix")
            else boundary_len(data, bs, sz.max_cached_blocks * bs)
        )
        new.append(boundary_len(data, bs, max_new or sz.max_new, min_len=min_new))
    need = [-(-(c + q) // bs) for c, q in zip(cached, new, strict=True)]
    num_pages = sum(need) + data.draw(st.integers(1, 4), label="spare pages")
    rnd = data.draw(st.randoms(use_true_random=False), label="page order")
    pool = rnd.sample(range(num_pages), sum(need))
    ids, at = [], 0
    for k in need:
        ids.append(pool[at : at + k])
        at += k
    meta = build_batch_metadata(
        cached,
        new,
        ids,
        bs,
        device=device,
        max_blocks=max(need, default=0) + data.draw(st.integers(0, 2)),
    )
    return DrawnBatch(cached, new, ids, num_pages, bs, meta)


def make_gen(data: st.DataObject) -> torch.Generator:
    return torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))


def randn(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def cache_shape(
    layout: Layout, pages: int, page_size: int, heads: int, dim: int
) -> tuple[int, int, int, int]:
    return (pages, page_size, heads, dim) if layout == "NHD" else (pages, heads, page_size, dim)


def kv_caches(
    layout: Layout,
    pages: int,
    page_size: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    strided: bool,
    fill: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches full of :data:`SENTINEL` (or random values with ``fill``).

    ``strided`` makes them the two halves of one ``[pages, 2, ...]`` allocation, the views
    ``unbind(1)`` gives an engine: not contiguous, so wrong stride use shows. Either way a
    guard page of :data:`SENTINEL` sits just before and after the pool (page -1 and page
    ``pages``), so a near out-of-bounds write fails :func:`assert_guards` instead of going
    unnoticed.
    """
    shape = cache_shape(layout, pages + 2, page_size, heads, dim)
    both = (pages + 2, 2, *shape[1:]) if strided else (2, *shape)
    if fill is None:
        t = torch.full(both, SENTINEL, dtype=dtype, device=device)
    else:
        t = randn(fill, both, dtype, device)
    if strided:
        t[0], t[-1] = SENTINEL, SENTINEL
        k, v = t[1:-1].unbind(1)
        guards = [t[0], t[-1]]
    else:
        t[:, 0], t[:, -1] = SENTINEL, SENTINEL
        k, v = t[:, 1:-1].unbind(0)
        guards = [t[:, 0], t[:, -1]]
    k._guards = v._guards = guards  # type: ignore[attr-defined]
    return k, v


def assert_guards(*caches: torch.Tensor) -> None:
    """The guard pages around caches from :func:`kv_caches` still hold the sentinel."""
    for c in caches:
        for g in c._guards:  # type: ignore[attr-defined]
            assert bool((g == SENTINEL).all()), "a kernel wrote outside the cache pool"


def assert_attention_close(
    out: torch.Tensor,
    ref64: torch.Tensor,
    naive: torch.Tensor,
    dtype: torch.dtype,
    rows: torch.Tensor | slice = slice(None),
) -> None:
    """The tolerance rule: kernel error vs fp64 <= 2 x naive low-precision error + floor."""
    assert torch.isfinite(out[rows]).all(), "non-finite attention output"
    if out[rows].numel() == 0:
        return
    err = (out[rows].double() - ref64[rows].double()).abs().max().item()
    naive_err = (naive[rows].double() - ref64[rows].double()).abs().max().item()
    floor = ATOL_FLOOR[dtype]
    bound = 2 * naive_err + floor
    assert err <= bound, f"max abs error {err:.3g} > 2 x naive {naive_err:.3g} + floor {floor:.3g}"


def shuffled(values: list[int], seed: int) -> list[int]:
    out = list(values)
    random.Random(seed).shuffle(out)
    return out
