"""Launcher decisions at sizes CI never allocates: int32/int64 offsets, grids, tile sizes.

``index_math`` is proved, but a launcher can still leave a tensor out of the int64 decision,
pick a grid past the CUDA limits or a tile that is not a power of two. These tests build
the launchers' inputs as ``meta`` tensors (shapes and strides, no storage), so caches of
2^34 elements cost nothing, and replace each Triton kernel object with a recorder that
captures the grid and the arguments of the launch instead of running it.

The rule each launch must follow, for every tensor its kernel indexes: ``USE_INT64`` is set
exactly when some such tensor's largest element offset does not fit int32
(``index_math.offsets_fit_int32``, the exact predicate the proofs use). Each test makes one
indexed tensor large at a time, so a launcher that forgets one tensor fails by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from prefixkv.kernels import _common, attention, cache_ops, index_math, state_ops
from prefixkv.kernels.errors import KernelInputError
from prefixkv.kernels.metadata import BlockTable

META = torch.device("meta")
#: CUDA's grid limits: x up to 2^31 - 1, y and z up to 65535.
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BIG = 2**31  # an element count whose last offset no longer fits int32


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Recorder:
    """Stands in for a ``@triton.jit`` function: ``kernel[grid](*args, **kwargs)`` records."""

    name: str
    launches: list[Launch] = field(default_factory=list)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            g = tuple(grid(kwargs) if callable(grid) else grid)
            self.launches.append(Launch(self.name, g, args, kwargs))

        return launch


KERNELS = (
    (cache_ops, "_write_kv_kernel"),
    (cache_ops, "_gather_kv_kernel"),
    (cache_ops, "_copy_blocks_kernel"),
    (attention, "_prefill_attention_kernel"),
    (attention, "_decode_split_kernel"),
    (attention, "_decode_reduce_kernel"),
    (state_ops, "_copy_slot_runs_kernel"),
    (state_ops, "_conv_state_update_kernel"),
)


@pytest.fixture(params=[True, False], ids=["interpreter", "gpu-config"])
def launches(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[Launch]]:
    """Every launch the launchers make, recorded instead of run; meta tensors accepted.

    Parametrised over the two tile heuristics: the interpreter's and the GPU's.
    """
    recorded: list[Launch] = []
    for module, name in KERNELS:
        recorder = Recorder(name, recorded)
        monkeypatch.setattr(module, name, recorder)
    monkeypatch.setattr(_common, "check_device", lambda *tensors: tensors[0].device)
    monkeypatch.setattr(_common, "interpreting", lambda: request.param)
    yield recorded


def meta(
    *shape: int, dtype: torch.dtype = torch.float16, stride: tuple[int, ...] | None = None
) -> torch.Tensor:
    if stride is None:
        return torch.empty(shape, dtype=dtype, device=META)
    return torch.empty_strided(shape, stride, dtype=dtype, device=META)


def fits(t: torch.Tensor) -> bool:
    return index_math.offsets_fit_int32((tuple(t.shape), tuple(t.stride())))


def check_launch(launch: Launch, indexed: dict[str, torch.Tensor] | None) -> None:
    """The grid is within CUDA's limits, tiles are powers of two, and USE_INT64 is exact.

    ``indexed`` names every tensor the kernel indexes (None: do not check USE_INT64).
    """
    assert len(launch.grid) <= 3 and all(
        1 <= g <= lim for g, lim in zip(launch.grid, GRID_LIMITS, strict=False)
    ), (
        launch.kernel,
        launch.grid,
    )
    for key, value in launch.kwargs.items():
        if key.startswith("BLOCK") or key == "SPLITS_PAD":
            assert value >= 1 and value & (value - 1) == 0, (launch.kernel, key, value)
    if indexed is not None and "USE_INT64" in launch.kwargs:
        big = sorted(name for name, t in indexed.items() if not fits(t))
        assert launch.kwargs["USE_INT64"] == bool(big), (launch.kernel, big)


# ---------------------------------------------------------------------------------------
# write_kv
# ---------------------------------------------------------------------------------------

#: (pages, page_size, kv_heads, head_dim) of a cache with exactly 2^31 elements, and one
#: page fewer (whose last offset, 2^31 - 2^14 - 1, still fits).
HUGE_CACHE = (2**17, 16, 8, 128)
EDGE_CACHE = (2**17 - 1, 16, 8, 128)


def _write(layout: index_math.Layout, huge: str, tokens: int = 4) -> dict[str, torch.Tensor]:
    pages, ps, heads, dim = HUGE_CACHE if huge in ("key_cache", "value_cache") else (64, 16, 8, 128)
    small = (64, ps, heads, dim) if layout == "NHD" else (64, heads, ps, dim)
    big = (pages, ps, heads, dim) if layout == "NHD" else (pages, heads, ps, dim)
    rows = BIG // (heads * dim) + 1 if huge in ("key", "value") else tokens
    return {
        "key": meta(rows if huge == "key" else tokens, heads, dim),
        "value": meta(rows if huge == "value" else tokens, heads, dim),
        "key_cache": meta(*(big if huge == "key_cache" else small)),
        "value_cache": meta(*(big if huge == "value_cache" else small)),
    }


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("huge", ["none", "key", "value", "key_cache", "value_cache"])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_write_kv_decides_int64_for_every_tensor(
    launches: list[Launch], layout: index_math.Layout, huge: str, slot_dtype: torch.dtype
) -> None:
    t = _write(layout, huge)
    if huge in ("key_cache", "value_cache"):  # K and V caches must agree in shape
        t["key_cache"] = t["value_cache"] = t[huge]
    slots = meta(4, dtype=slot_dtype)
    cache_ops.write_kv(
        t["key"], t["value"], t["key_cache"], t["value_cache"], slots, layout=layout, debug=False
    )
    (launch,) = launches
    check_launch(launch, t)
    assert launch.grid[0] == 4  # one program per token row of slot_mapping, not of key


def test_write_kv_int32_edge_is_exact(launches: list[Launch]) -> None:
    """At one page under 2^31 elements int32 is kept; at exactly 2^31 it is not."""
    key = meta(4, 8, 128)
    for shape, want in ((EDGE_CACHE, False), (HUGE_CACHE, True)):
        cache = meta(*shape)
        cache_ops.write_kv(key, key, cache, cache, meta(4, dtype=torch.int64), debug=False)
        assert launches[-1].kwargs["USE_INT64"] is want


def test_write_kv_strided_views_count_their_strides(launches: list[Launch]) -> None:
    """K and V from ``kv.unbind(1)`` of one ``[pages, 2, ...]`` tensor: twice the page stride.

    Each view holds about 2^30 elements, but its last offset is past 2^31.
    """
    pages, ps, heads, dim = 2**16 + 1, 16, 8, 128
    kv = meta(pages, 2, ps, heads, dim)
    k, v = kv.unbind(1)
    assert k.numel() < BIG and not fits(k)
    cache_ops.write_kv(
        meta(4, heads, dim), meta(4, heads, dim), k, v, meta(4, dtype=torch.int64), debug=False
    )
    assert launches[-1].kwargs["USE_INT64"] is True


# ---------------------------------------------------------------------------------------
# gather_kv and copy_blocks
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("huge", ["none", "key_cache", "out_k", "out_v", "block_table"])
def test_gather_kv_decides_int64_for_every_tensor(launches: list[Launch], huge: str) -> None:
    cache = meta(*(HUGE_CACHE if huge == "key_cache" else (64, 16, 8, 128)))
    rows = BIG // (8 * 128) + 1
    out_k = meta(rows if huge == "out_k" else 64, 8, 128)
    out_v = meta(rows if huge == "out_v" else 64, 8, 128)
    # 4 sequences, each row 2^30 entries wide (a table padded to its widest sequence)
    table = meta(4, 2**30 if huge == "block_table" else 8, dtype=torch.int32)
    seq_lens = meta(4, dtype=torch.int32)
    cache_ops.gather_kv(
        cache,
        cache,
        BlockTable(table, 16),
        seq_lens,
        max_seq_len=128,
        out=(out_k, out_v),
        debug=False,
    )
    (launch,) = launches
    check_launch(launch, {"cache": cache, "out_k": out_k, "out_v": out_v, "block_table": table})


@pytest.mark.parametrize("huge", [False, True])
def test_copy_blocks_decides_int64_per_cache(launches: list[Launch], huge: bool) -> None:
    small = meta(64, 16, 8, 128)
    big = meta(*HUGE_CACHE) if huge else small
    mapping = meta(3, 2, dtype=torch.int64)
    cache_ops.copy_blocks([small, big], mapping, debug=False)
    assert [launch.kwargs["USE_INT64"] for launch in launches] == [False, huge]
    for launch, cache in zip(launches, (small, big), strict=True):
        check_launch(launch, {"cache": cache, "block_mapping": mapping})


def test_copy_blocks_counts_a_strided_block_mapping(launches: list[Launch]) -> None:
    """The pairs are read through their strides: a mapping whose rows lie 2^30 apart."""
    small = meta(64, 16, 8, 128)
    mapping = meta(3, 2, dtype=torch.int64, stride=(2**30, 1))
    cache_ops.copy_blocks([small], mapping, debug=False)
    (launch,) = launches
    assert not fits(mapping)
    check_launch(launch, {"cache": small, "block_mapping": mapping})


# ---------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("huge", ["none", "q", "key_cache", "out", "block_table"])
def test_prefill_decides_int64_for_every_tensor(launches: list[Launch], huge: str) -> None:
    heads, dim = 8, 128
    cache = meta(*(HUGE_CACHE if huge == "key_cache" else (64, 16, heads, dim)))
    tokens = BIG // (heads * dim) + 1 if huge in ("q", "out") else 64
    q = meta(tokens, heads, dim)
    out = meta(tokens, heads, dim)
    if huge == "out":  # q small, out a strided view whose rows are far apart
        q = meta(64, heads, dim)
        out = meta(64, heads, dim, stride=(2**25, dim, 1))
    table = meta(4, 2**30 if huge == "block_table" else 8, dtype=torch.int32)
    attention.prefill_attention(
        q,
        cache,
        cache,
        BlockTable(table, 16),
        meta(5, dtype=torch.int32),
        meta(4, dtype=torch.int32),
        max_query_len=16,
        out=out,
        debug=False,
    )
    (launch,) = launches
    check_launch(launch, {"q": q, "cache": cache, "out": out, "block_table": table})


@pytest.mark.parametrize("huge", ["none", "q", "key_cache", "block_table", "part_acc"])
def test_decode_decides_int64_for_every_tensor(launches: list[Launch], huge: str) -> None:
    heads, dim = 8, 128
    cache = meta(*(HUGE_CACHE if huge == "key_cache" else (64, 16, heads, dim)))
    seqs = {"q": BIG // (heads * dim) + 1, "part_acc": 2**16 - 1}.get(huge, 4)
    q = meta(seqs, heads, dim)
    table = meta(seqs, 2**30 if huge == "block_table" else 8, dtype=torch.int32)
    # 64 splits make the fp32 partials 64 times the size of q: past 2^31 while q is not
    splits = 64 if huge == "part_acc" else 1
    attention.decode_attention(
        q,
        cache,
        cache,
        BlockTable(table, 16),
        meta(seqs, dtype=torch.int32),
        max_seq_len=2**20,
        num_splits=splits,
        debug=False,
    )
    split, reduce = launches
    part_acc = meta(seqs, heads, splits, dim, dtype=torch.float32)
    out = meta(seqs, heads, dim)
    check_launch(split, {"q": q, "cache": cache, "block_table": table, "part_acc": part_acc})
    check_launch(reduce, {"part_acc": part_acc, "out": out})


# ---------------------------------------------------------------------------------------
# grids at the largest supported sizes
# ---------------------------------------------------------------------------------------


def test_grids_stay_within_cuda_limits_at_the_supported_maxima(launches: list[Launch]) -> None:
    """Every size at the top of ``SUPPORTED_RANGES`` at once: each grid is launchable."""
    r = index_math.SUPPORTED_RANGES
    seqs, tokens, seq_len = r["num_seqs"].high, r["num_tokens"].high, r["max_seq_len"].high
    heads, q_heads, dim = r["num_kv_heads"].high, r["num_q_heads"].high, r["head_dim"].high
    pages, ps = r["num_blocks"].high, r["block_size"].high
    cache = meta(pages, ps, heads, dim)
    table = meta(seqs, r["max_blocks_per_seq"].high, dtype=torch.int32)
    lens = meta(seqs, dtype=torch.int32)
    qsl = meta(seqs + 1, dtype=torch.int32)
    cache_ops.write_kv(
        meta(tokens, heads, dim),
        meta(tokens, heads, dim),
        cache,
        cache,
        meta(tokens, dtype=torch.int64),
        debug=False,
    )
    bt = BlockTable(table, ps)
    out = (meta(tokens, heads, dim), meta(tokens, heads, dim))
    cache_ops.gather_kv(cache, cache, bt, lens, max_seq_len=seq_len, out=out, debug=False)
    cache_ops.copy_blocks([cache], meta(pages // 2, 2, dtype=torch.int64), debug=False)
    q = meta(tokens, q_heads, dim)
    attention.prefill_attention(
        q, cache, cache, bt, qsl, lens, max_query_len=tokens, out=q, debug=False
    )
    attention.decode_attention(
        meta(seqs, q_heads, dim), cache, cache, bt, lens, max_seq_len=seq_len, debug=False
    )
    slots = r["num_state_slots"].high
    state = meta(slots, 4096, dtype=torch.float32)
    state_ops.copy_state_slots(
        state,
        state,
        state_ops.plan_state_copy(range(slots // 2), range(slots // 2, slots), device=META),
    )
    conv = meta(slots, 8192, r["conv_width"].high - 1)
    state_ops.update_conv_state(
        conv, meta(tokens, 8192), qsl, meta(seqs, dtype=torch.int64), debug=False
    )
    assert {launch.kernel for launch in launches} == {name for _, name in KERNELS}
    for launch in launches:
        check_launch(launch, None)


def test_supported_num_seqs_fits_the_grid_y_and_z_limit() -> None:
    """Sequences are a grid y or z dimension (gather, prefill): at most 65535 of them."""
    assert index_math.SUPPORTED_RANGES["num_seqs"].high <= GRID_LIMITS[1]


# ---------------------------------------------------------------------------------------
# index tensors read without their strides
# ---------------------------------------------------------------------------------------


def test_strided_index_tensors_are_refused(launches: list[Launch]) -> None:
    """The kernels read 1-d index tensors as ``ptr + i``: a strided view would be misread.

    A column of a 2-d tensor (``pairs[:, 0]``) must be refused with a typed error, not read
    as if it were contiguous.
    """
    key = meta(4, 8, 128)
    cache = meta(64, 16, 8, 128)
    pairs = meta(4, 2, dtype=torch.int64)
    with pytest.raises(KernelInputError, match="slot_mapping"):
        cache_ops.write_kv(key, key, cache, cache, pairs[:, 0], debug=False)
    table = BlockTable(meta(4, 8, dtype=torch.int32), 16)
    lens = meta(4, 2, dtype=torch.int32)[:, 1]
    with pytest.raises(KernelInputError, match="seq_lens"):
        attention.decode_attention(key, cache, cache, table, lens, max_seq_len=64, debug=False)
    assert not launches
