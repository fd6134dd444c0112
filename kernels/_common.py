"""Launcher helpers shared by the kernel modules: validation, geometry, config heuristics.

Everything here runs on the host with Python ints taken from tensor shapes and strides.
Nothing reads tensor *values*, so nothing here synchronises with the device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch

from . import index_math
from .errors import KernelDtypeError, KernelInputError, PageSizeError
from .index_math import Layout

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
DEBUG_ENV = "PREFIXKV_KERNEL_DEBUG"


def debug_enabled(debug: bool | None) -> bool:
    """Explicit ``debug`` wins; ``None`` defers to ``PREFIXKV_KERNEL_DEBUG=1``."""
    if debug is not None:
        return debug
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "False")


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``max(n, 1)`` (Triton tile sizes must be powers of two)."""
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return int(index_math.ceil_div(a, b))


def check_device(*tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and that device is one Triton can run on here."""
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise KernelInputError(f"tensors on different devices: {device} and {t.device}")
    if device.type == "cpu" and not interpreting():
        raise KernelInputError(
            "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before importing "
            "triton, or pass CUDA tensors"
        )
    if device.type not in ("cpu", "cuda"):
        raise KernelInputError(f"unsupported device {device}")
    return device


def check_dtype(t: torch.Tensor, name: str) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise KernelDtypeError(f"{name} has dtype {t.dtype}; expected one of {SUPPORTED_DTYPES}")


def check_index_tensor(
    t: torch.Tensor, name: str, ndim: int, dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES
) -> None:
    if t.dtype not in dtypes:
        raise KernelDtypeError(f"{name} has dtype {t.dtype}; expected one of {dtypes}")
    if t.dim() != ndim:
        raise KernelInputError(f"{name} must be {ndim}-d, got shape {tuple(t.shape)}")
    # NOTE: the kernels read 1-d index tensors as ``ptr + i``, without a stride: a strided
    # view (a column of a 2-d tensor) would be read as if it were contiguous.
    if ndim == 1 and t.shape[0] > 1 and t.stride(0) != 1:
        raise KernelInputError(
            f"{name} must be contiguous, got stride {t.stride(0)}; pass {name}.contiguous()"
        )


@dataclass(frozen=True)
class CacheGeometry:
    """A paged cache seen through one layout: sizes and strides in (page, token, head, dim)."""

    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    strides: tuple[int, int, int, int]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size


def cache_geometry(cache: torch.Tensor, layout: Layout, name: str = "cache") -> CacheGeometry:
    if cache.dim() != 4:
        raise KernelInputError(f"{name} must be 4-d ({layout}), got shape {tuple(cache.shape)}")
    check_dtype(cache, name)
    n, p, h, d = index_math.cache_dims(tuple(cache.shape), layout)
    return CacheGeometry(n, p, h, d, index_math.cache_strides(tuple(cache.stride()), layout))


def kv_cache_geometry(
    key_cache: torch.Tensor, value_cache: torch.Tensor, layout: Layout
) -> tuple[CacheGeometry, CacheGeometry]:
    """Geometry of a K/V cache pair; they must agree in shape and dtype (strides may differ)."""
    gk = cache_geometry(key_cache, layout, "key_cache")
    gv = cache_geometry(value_cache, layout, "value_cache")
    if key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype:
        raise KernelInputError(
            f"key/value caches differ: {tuple(key_cache.shape)} {key_cache.dtype} vs "
            f"{tuple(value_cache.shape)} {value_cache.dtype}"
        )
    return gk, gv


def check_page_size(table_page_size: int, geometry: CacheGeometry) -> None:
    """The block table must be in the units of the cache's page dimension."""
    if table_page_size != geometry.page_size:
        raise PageSizeError(
            f"block table is in pages of {table_page_size} tokens but the cache has pages of "
            f"{geometry.page_size}; convert the table with to_kernel_pages() first"
        )


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True when some tensor's offsets overflow int32 (see ``index_math.offsets_fit_int32``)."""
    return not index_math.offsets_fit_int32(*[(tuple(t.shape), tuple(t.stride())) for t in tensors])


@cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a small fixed number under the interpreter."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact IEEE dots (tf32 would lose the comparison with the reference)."""
    return "ieee" if dtype == torch.float32 else "tf32"
