# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
# NOTE: Triton JIT kernels are untyped by nature (pointers and constexprs that only the
# Triton compiler understands); the launchers around them are typed.
"""Cache data movement: write new K/V at slots, gather paged KV, copy blocks.

These kernels move bytes and do no arithmetic on them, so they must match their torch
references exactly (``torch.equal``) and leave every element they do not own unchanged.

Caches are ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD) or
``[num_pages, num_kv_heads, page_size, head_dim]`` (HND). The launchers reorder the four
strides to (page, token, head, dim) with :func:`~.index_math.cache_strides`, so one kernel
body serves both layouts and any strided view (e.g. ``kv_cache.unbind(1)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from . import _common as C
from . import debug as D
from .errors import KernelIndexError, KernelInputError
from .index_math import Layout
from .metadata import BlockTable, cu_seqlens

# ---------------------------------------------------------------------------------------
# (a) write new K/V into the paged cache
# ---------------------------------------------------------------------------------------


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # NHD [num_pages, PAGE_SIZE, num_kv_heads, head_dim] or HND
    value_cache_ptr,  # same shape as key_cache_ptr (strides may differ)
    slot_mapping_ptr,  # int64 [num_tokens]; negative = skip
    stride_k_tok,
    stride_k_head,
    stride_k_dim,
    stride_v_tok,
    stride_v_head,
    stride_v_dim,
    stride_kc_page,
    stride_kc_tok,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_page,
    stride_vc_tok,
    stride_vc_head,
    stride_vc_dim,
    num_kv_heads,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    tok = tl.program_id(0)
    head_block = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + tok)
    if slot < 0:  # padding or a token whose KV must not be stored
        return
    if USE_INT64:
        # an int32 slot_mapping would keep page * stride in int32 and wrap past 2^31
        tok = tok.to(tl.int64)
        slot = slot.to(tl.int64)
    else:
        slot = slot.to(tl.int32)
    # index_math.split_slot
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_dim)

    k = tl.load(
        key_ptr
        + tok * stride_k_tok
        + heads[:, None] * stride_k_head
        + dims[None, :] * stride_k_dim,
        mask=mask,
    )
    v = tl.load(
        value_ptr
        + tok * stride_v_tok
        + heads[:, None] * stride_v_head
        + dims[None, :] * stride_v_dim,
        mask=mask,
    )
    # index_math.cache_element_offset
    kc = (
        key_cache_ptr
        + page * stride_kc_page
        + off * stride_kc_tok
        + heads[:, None] * stride_kc_head
        + dims[None, :] * stride_kc_dim
    )
    vc = (
        value_cache_ptr
        + page * stride_vc_page
        + off * stride_vc_tok
        + heads[:, None] * stride_vc_head
        + dims[None, :] * stride_vc_dim
    )
    tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def _write_config(num_kv_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_D, num_warps): a tile of up to 4096 elements per program."""
    block_d = C.next_pow2(head_dim)
    block_h = min(C.next_pow2(num_kv_heads), max(1, 4096 // block_d))
    num_warps = 4 if block_h * block_d >= 1024 else 1
    return block_h, block_d, num_warps


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    layout: Layout = "NHD",
    debug: bool | None = None,
) -> None:
    """Store ``key[t]``/``value[t]`` at cache slot ``slot_mapping[t]`` for every row ``t``.

    ``key``/``value``: ``[>= num_tokens, num_kv_heads, head_dim]``, any strides; the row
    count is ``slot_mapping.shape[0]``, so a padded CUDA-graph batch may carry extra rows.
    A negative slot skips its row. Values are cast to the cache dtype. In place, no sync.
    """
    gk, gv = C.kv_cache_geometry(key_cache, value_cache, layout)
    C.check_device(key, value, key_cache, value_cache, slot_mapping)
    C.check_index_tensor(slot_mapping, "slot_mapping", 1)
    for name, t in (("key", key), ("value", value)):
        C.check_dtype(t, name)
        if t.dim() != 3 or tuple(t.shape[1:]) != (gk.num_kv_heads, gk.head_dim):
            raise KernelInputError(
                f"{name} must be [tokens, {gk.num_kv_heads}, {gk.head_dim}], got {tuple(t.shape)}"
            )
    num_tokens = int(slot_mapping.shape[0])
    if C.debug_enabled(debug):
        D.check_slot_mapping(slot_mapping, gk.num_slots, min(key.shape[0], value.shape[0]))
    if num_tokens == 0:
        return
    block_h, block_d, num_warps = _write_config(gk.num_kv_heads, gk.head_dim)
    grid = (num_tokens, C.cdiv(gk.num_kv_heads, block_h))
    _write_kv_kernel[grid](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *gk.strides,
        *gv.strides,
        gk.num_kv_heads,
        gk.head_dim,
        PAGE_SIZE=gk.page_size,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        USE_INT64=C.needs_int64(key, value, key_cache, value_cache),
        num_warps=num_warps,
    )


# ---------------------------------------------------------------------------------------
# (b) gather paged KV into a contiguous varlen buffer
# ---------------------------------------------------------------------------------------


@triton.jit
def _gather_kv_kernel(
    key_cache_ptr,  # NHD [num_pages, PAGE_SIZE, num_kv_heads, head_dim] or HND
    value_cache_ptr,  # same shape as key_cache_ptr
    block_table_ptr,  # int32 [num_seqs, max_entries]
    seq_lens_ptr,  # int32 [num_seqs]: tokens to gather per sequence
    cu_seqlens_ptr,  # int32 [num_seqs + 1]: first output row of each sequence
    out_k_ptr,  # [total_tokens (+ padding), num_kv_heads, head_dim]
    out_v_ptr,  # [total_tokens (+ padding), num_kv_heads, head_dim]
    stride_kc_page,
    stride_kc_tok,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_page,
    stride_vc_tok,
    stride_vc_head,
    stride_vc_dim,
    stride_bt_seq,
    stride_bt_entry,
    stride_ok_tok,
    stride_ok_head,
    stride_ok_dim,
    stride_ov_tok,
    stride_ov_head,
    stride_ov_dim,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    if tile * BLOCK_N >= seq_len:  # fixed grid sized by max_seq_len: exit past the end
        return
    pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    valid = pos < seq_len
    seq_off = seq * stride_bt_seq
    if USE_INT64:  # the block table itself may be past 2^31 entries
        seq_off = seq.to(tl.int64) * stride_bt_seq
    # index_math.block_index / offset_in_block
    page = tl.load(
        block_table_ptr + seq_off + (pos // PAGE_SIZE) * stride_bt_entry,
        mask=valid,
        other=0,
    )
    off = pos % PAGE_SIZE
    row = tl.load(cu_seqlens_ptr + seq) + pos
    if USE_INT64:
        page = page.to(tl.int64)
        row = row.to(tl.int64)
    mask = valid[:, None] & (dims[None, :] < head_dim)
    src_k = (
        key_cache_ptr
        + page[:, None] * stride_kc_page
        + off[:, None] * stride_kc_tok
        + head * stride_kc_head
        + dims[None, :] * stride_kc_dim
    )
    src_v = (
        value_cache_ptr
        + page[:, None] * stride_vc_page
        + off[:, None] * stride_vc_tok
        + head * stride_vc_head
        + dims[None, :] * stride_vc_dim
    )
    dst_k = (
        out_k_ptr
        + row[:, None] * stride_ok_tok
        + head * stride_ok_head
        + dims[None, :] * stride_ok_dim
    )
    dst_v = (
        out_v_ptr
        + row[:, None] * stride_ov_tok
        + head * stride_ov_head
        + dims[None, :] * stride_ov_dim
    )
    tl.store(dst_k, tl.load(src_k, mask=mask), mask=mask)
    tl.store(dst_v, tl.load(src_v, mask=mask), mask=mask)


def _gather_config(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_D, num_warps): 16 tokens under the interpreter, 64 on a GPU."""
    block_d = C.next_pow2(head_dim)
    block_n = 16 if C.interpreting() else max(16, min(64, 8192 // block_d))
    return block_n, block_d, 4


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    seq_lens: torch.Tensor,
    *,
    max_seq_len: int,
    cu_seqlens_k: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    total_tokens: int | None = None,
    layout: Layout = "NHD",
    debug: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the first ``seq_lens[i]`` cached tokens of each sequence into a varlen buffer.

    Sequence ``i`` lands in rows ``cu_seqlens_k[i] : cu_seqlens_k[i] + seq_lens[i]`` of
    ``out = (k, v)``, each ``[rows, num_kv_heads, head_dim]`` in the cache dtype. Rows no
    sequence owns (padding) are left untouched. Pass ``out`` or ``total_tokens`` (host int)
    so that no size is read back from the device; ``cu_seqlens_k`` defaults to the prefix
    sum of ``seq_lens``. ``max_seq_len`` (host int) sizes the fixed grid.
    """
    gk, gv = C.kv_cache_geometry(key_cache, value_cache, layout)
    C.check_page_size(block_table.page_size, gk)
    C.check_index_tensor(seq_lens, "seq_lens", 1, (torch.int32,))
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens(seq_lens)
    C.check_index_tensor(cu_seqlens_k, "cu_seqlens_k", 1, (torch.int32,))
    if out is None:
        if total_tokens is None:
            raise KernelInputError("pass out=(k, v) or total_tokens: sizes are never read back")
        shape = (total_tokens, gk.num_kv_heads, gk.head_dim)
        out = (key_cache.new_empty(shape), value_cache.new_empty(shape))
    out_k, out_v = out
    for name, t in (("out[0]", out_k), ("out[1]", out_v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != (gk.num_kv_heads, gk.head_dim):
            raise KernelInputError(f"{name} must be [rows, {gk.num_kv_heads}, {gk.head_dim}]")
        C.check_dtype(t, name)
    C.check_device(key_cache, value_cache, block_table.table, seq_lens, cu_seqlens_k, out_k, out_v)
    num_seqs = int(seq_lens.shape[0])
    if C.debug_enabled(debug):
        lens = D.check_seq_lens(seq_lens, max_seq_len)
        D.check_block_table(block_table, lens, gk.num_pages)
        starts = D._host(cu_seqlens_k)
        for i, n in enumerate(lens):
            if starts[i] < 0 or starts[i] + n > min(out_k.shape[0], out_v.shape[0]):
                raise KernelIndexError(f"sequence {i} rows [{starts[i]}, +{n}) outside out")
    if num_seqs == 0 or max_seq_len == 0:
        return out_k, out_v
    block_n, block_d, num_warps = _gather_config(gk.head_dim)
    grid = (C.cdiv(max_seq_len, block_n), num_seqs, gk.num_kv_heads)
    _gather_kv_kernel[grid](
        key_cache,
        value_cache,
        block_table.table,
        seq_lens,
        cu_seqlens_k,
        out_k,
        out_v,
        *gk.strides,
        *gv.strides,
        *block_table.table.stride(),
        *out_k.stride(),
        *out_v.stride(),
        gk.head_dim,
        PAGE_SIZE=gk.page_size,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        USE_INT64=C.needs_int64(key_cache, value_cache, out_k, out_v, block_table.table),
        num_warps=num_warps,
    )
    return out_k, out_v


# ---------------------------------------------------------------------------------------
# (c) copy whole blocks (copy-on-write, private recompute windows)
# ---------------------------------------------------------------------------------------


@triton.jit
def _copy_blocks_kernel(
    cache_ptr,  # NHD [num_pages, PAGE_SIZE, num_kv_heads, head_dim] or HND
    block_mapping_ptr,  # int32/int64 [num_pairs, 2]: (src page, dst page); negative = skip
    stride_page,
    stride_tok,
    stride_head,
    stride_dim,
    stride_map_pair,
    stride_map_col,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    pair = tl.program_id(0)
    head = tl.program_id(1)
    tok_block = tl.program_id(2)
    if USE_INT64:  # a strided block_mapping may itself be past 2^31 elements
        pair = pair.to(tl.int64)
    src = tl.load(block_mapping_ptr + pair * stride_map_pair)
    dst = tl.load(block_mapping_ptr + pair * stride_map_pair + stride_map_col)
    if (src < 0) | (dst < 0):
        return
    if not USE_INT64:
        src = src.to(tl.int32)
        dst = dst.to(tl.int32)
    else:
        src = src.to(tl.int64)
        dst = dst.to(tl.int64)
    toks = tok_block * BLOCK_T + tl.arange(0, BLOCK_T)
    dims = tl.arange(0, BLOCK_D)
    mask = (toks[:, None] < PAGE_SIZE) & (dims[None, :] < head_dim)
    inner = toks[:, None] * stride_tok + head * stride_head + dims[None, :] * stride_dim
    x = tl.load(cache_ptr + src * stride_page + inner, mask=mask)
    tl.store(cache_ptr + dst * stride_page + inner, x, mask=mask)


def copy_blocks(
    caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
    *,
    layout: Layout = "NHD",
    debug: bool | None = None,
) -> None:
    """For every pair ``(src, dst)`` in ``block_mapping``, copy page ``src`` onto ``dst``.

    ``caches`` is any number of 4-d caches in ``layout`` with the same page count (K and V
    of every layer); one launch each. ``block_mapping`` is int ``[num_pairs, 2]``; a pair
    with a negative id is skipped, so a fixed-size mapping can be padded. Pairs run in
    parallel: a destination must not also be a source or appear twice (debug mode checks).
    """
    C.check_index_tensor(block_mapping, "block_mapping", 2)
    if block_mapping.shape[-1] != 2:
        raise KernelInputError(
            f"block_mapping must be [num_pairs, 2], got {tuple(block_mapping.shape)}"
        )
    geoms = [C.cache_geometry(c, layout, f"caches[{i}]") for i, c in enumerate(caches)]
    if not caches:
        return
    C.check_device(block_mapping, *caches)
    if C.debug_enabled(debug):
        D.check_block_pairs(block_mapping, min(g.num_pages for g in geoms))
    num_pairs = int(block_mapping.shape[0])
    if num_pairs == 0:
        return
    for cache, g in zip(caches, geoms, strict=True):
        block_d = C.next_pow2(g.head_dim)
        block_t = min(C.next_pow2(g.page_size), max(1, 4096 // block_d))
        grid = (num_pairs, g.num_kv_heads, C.cdiv(g.page_size, block_t))
        _copy_blocks_kernel[grid](
            cache,
            block_mapping,
            *g.strides,
            *block_mapping.stride(),
            g.head_dim,
            PAGE_SIZE=g.page_size,
            BLOCK_T=block_t,
            BLOCK_D=block_d,
            USE_INT64=C.needs_int64(cache, block_mapping),
            num_warps=4,
        )
