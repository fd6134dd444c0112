# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
# NOTE: Triton JIT kernels are untyped by nature (pointers and constexprs that only the
# Triton compiler understands); the launchers around them are typed.
"""Paged attention: prefix-prefill (varlen, bottom-right causal) and split-K decode.

Choice: keys and values are read *only* from the paged cache. The new tokens' K/V are
written into the cache by :func:`~prefixkv.kernels.cache_ops.write_kv` before attention
runs, so a sequence's keys are positions ``0 .. seq_len - 1`` of its block table, cached
prefix and new tokens alike. One addressing path serves both, the cached and new parts need
no merge, and a zero-length prefix is just ``cached_len = 0``. The cost is that the new K/V
make one round trip through the cache, which the write kernel pays anyway.

Both kernels use the online softmax of FlashAttention with fp32 accumulators and ``exp2``
(the scale is folded with ``log2(e)``), GQA by mapping query head ``h`` to KV head
``h // (num_q_heads // num_kv_heads)``, and a fixed grid sized from host-known maxima
(``max_query_len``, the number of splits) whose surplus programs exit on the device.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _common as C
from . import debug as D
from .errors import KernelInputError
from .index_math import Layout
from .metadata import BlockTable

LOG2E = math.log2(math.e)
MAX_DECODE_SPLITS = 64


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    k_base,  # key cache pointer already offset to the KV head (page, token, dim remain)
    v_base,  # value cache pointer already offset to the KV head
    bt_row_ptr,  # int32 [max_entries]: this sequence's block-table row
    stride_bt_entry,
    start_n,
    q_pos,
    kv_limit,
    stride_kc_page,
    stride_kc_tok,
    stride_kc_dim,
    stride_vc_page,
    stride_vc_tok,
    stride_vc_dim,
    scale_log2e,
    head_dim,
    CAUSAL_MASK: tl.constexpr,
    BOUND_MASK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One BLOCK_N tile of keys: scores, online-softmax update, P @ V."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < kv_limit
    d_ok = offs_d < head_dim
    # index_math.slot_for_position, split into (page, offset) without forming the slot
    page = tl.load(bt_row_ptr + (offs_n // PAGE_SIZE) * stride_bt_entry, mask=n_ok, other=0)
    if USE_INT64:
        page = page.to(tl.int64)
    off = offs_n % PAGE_SIZE
    k_t = tl.load(
        k_base
        + page[None, :] * stride_kc_page
        + off[None, :] * stride_kc_tok
        + offs_d[:, None] * stride_kc_dim,
        mask=d_ok[:, None] & n_ok[None, :],
        other=0.0,
    )  # [BLOCK_D, BLOCK_N]
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2e
    if CAUSAL_MASK:
        # bottom-right: the query at position q_pos sees keys 0 .. q_pos
        s = tl.where((offs_n[None, :] <= q_pos[:, None]) & n_ok[None, :], s, float("-inf"))
    elif BOUND_MASK:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        v_base
        + page[:, None] * stride_vc_page
        + off[:, None] * stride_vc_tok
        + offs_d[None, :] * stride_vc_dim,
        mask=n_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BLOCK_N, BLOCK_D]
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


# ---------------------------------------------------------------------------------------
# (e) prefix-prefill
# ---------------------------------------------------------------------------------------


@triton.jit
def _prefill_attention_kernel(
    q_ptr,  # [num_tokens, num_q_heads, head_dim]
    key_cache_ptr,  # NHD [num_pages, PAGE_SIZE, num_kv_heads, head_dim] or HND
    value_cache_ptr,  # same shape as key_cache_ptr
    block_table_ptr,  # int32 [num_seqs, max_entries]
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    seq_lens_ptr,  # int32 [num_seqs]: cached + new
    out_ptr,  # [num_tokens, num_q_heads, head_dim]
    scale_log2e,
    stride_q_tok,
    stride_q_head,
    stride_q_dim,
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
    stride_o_tok,
    stride_o_head,
    stride_o_dim,
    head_dim,
    queries_per_kv,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    m_block = tl.program_id(0)
    q_head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:  # grid sized by max_query_len
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    cached = seq_len - q_len
    kv_head = q_head // queries_per_kv

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < head_dim
    rows = q_start + offs_m
    seq_off = seq * stride_bt_seq
    if USE_INT64:
        rows = rows.to(tl.int64)
        seq_off = seq.to(tl.int64) * stride_bt_seq
    q = tl.load(
        q_ptr
        + rows[:, None] * stride_q_tok
        + q_head * stride_q_head
        + offs_d[None, :] * stride_q_dim,
        mask=m_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = cached + offs_m  # new query i sits at position cached_len + i
    bt_row = block_table_ptr + seq_off
    k_base = key_cache_ptr + kv_head * stride_kc_head
    v_base = value_cache_ptr + kv_head * stride_vc_head

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys before the first row's position + 1 are visible to every row of the block:
    # whole tiles of them need no mask. The rest, up to the last valid row, are masked.
    full_end = ((cached + m_block * BLOCK_M + 1) // BLOCK_N) * BLOCK_N
    kv_end = cached + tl.minimum((m_block + 1) * BLOCK_M, q_len)
    for start_n in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            bt_row,
            stride_bt_entry,
            start_n,
            q_pos,
            seq_len,
            stride_kc_page,
            stride_kc_tok,
            stride_kc_dim,
            stride_vc_page,
            stride_vc_tok,
            stride_vc_dim,
            scale_log2e,
            head_dim,
            False,
            False,
            PAGE_SIZE,
            BLOCK_N,
            BLOCK_D,
            USE_INT64,
            DOT_PRECISION,
        )
    for start_n in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            bt_row,
            stride_bt_entry,
            start_n,
            q_pos,
            seq_len,
            stride_kc_page,
            stride_kc_tok,
            stride_kc_dim,
            stride_vc_page,
            stride_vc_tok,
            stride_vc_dim,
            scale_log2e,
            head_dim,
            True,
            True,
            PAGE_SIZE,
            BLOCK_N,
            BLOCK_D,
            USE_INT64,
            DOT_PRECISION,
        )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr
        + rows[:, None] * stride_o_tok
        + q_head * stride_o_head
        + offs_d[None, :] * stride_o_dim,
        out.to(out_ptr.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )


def _check_attention_inputs(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    layout: Layout,
) -> tuple[C.CacheGeometry, C.CacheGeometry, int]:
    gk, gv = C.kv_cache_geometry(key_cache, value_cache, layout)
    C.check_page_size(block_table.page_size, gk)
    C.check_dtype(q, "q")
    if q.dtype != key_cache.dtype:
        raise KernelInputError(f"q is {q.dtype} but the cache is {key_cache.dtype}")
    if q.dim() != 3 or q.shape[2] != gk.head_dim:
        raise KernelInputError(
            f"q must be [tokens, num_q_heads, {gk.head_dim}], got {tuple(q.shape)}"
        )
    num_q_heads = int(q.shape[1])
    if num_q_heads % gk.num_kv_heads != 0:
        raise KernelInputError(
            f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={gk.num_kv_heads}"
        )
    return gk, gv, num_q_heads // gk.num_kv_heads


def _prefill_config(head_dim: int, max_query_len: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages), by heuristic (no multi-config autotune)."""
    if C.interpreting():
        return 16, 16, 4, 1
    if head_dim > 128:  # keep Q, K^T and the accumulator inside registers / shared memory
        return min(64, max(16, C.next_pow2(max_query_len))), 32, 8, 2
    block_m = min(128, max(16, C.next_pow2(max_query_len)))
    block_n = 64
    num_warps = 8 if head_dim > 64 and block_m >= 128 else 4
    return block_m, block_n, num_warps, 3 if head_dim <= 64 else 2


def _block_d(head_dim: int) -> int:
    """Head-dim tile: a power of two, and >= 16 because tl.dot needs K >= 16 on a GPU."""
    return max(16, C.next_pow2(head_dim))


def prefill_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    layout: Layout = "NHD",
    debug: bool | None = None,
) -> torch.Tensor:
    """Attention of each sequence's new tokens over its cached prefix and themselves.

    ``q`` ``[num_tokens, num_q_heads, head_dim]`` holds the new tokens of sequence ``i`` in
    rows ``query_start_loc[i]:query_start_loc[i+1]``; its keys are positions
    ``0 .. seq_lens[i] - 1`` of its block table, already including the new tokens (write
    them with ``write_kv`` first). Query ``j`` of sequence ``i`` sits at position
    ``seq_lens[i] - q_len_i + j`` and sees keys up to that position (bottom-right causal).
    ``max_query_len`` is a host int that sizes the grid. Returns ``out`` (new if ``None``);
    rows past ``query_start_loc[-1]`` are not written. No sync.
    """
    gk, gv, qpk = _check_attention_inputs(q, key_cache, value_cache, block_table, layout)
    C.check_index_tensor(query_start_loc, "query_start_loc", 1, (torch.int32,))
    C.check_index_tensor(seq_lens, "seq_lens", 1, (torch.int32,))
    num_seqs = int(seq_lens.shape[0])
    if query_start_loc.shape[0] != num_seqs + 1:
        raise KernelInputError("query_start_loc must have num_seqs + 1 entries")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype not in C.SUPPORTED_DTYPES:
        raise KernelInputError(f"out must be {tuple(q.shape)}, got {tuple(out.shape)}")
    C.check_device(q, key_cache, value_cache, block_table.table, query_start_loc, seq_lens, out)
    if C.debug_enabled(debug):
        lens = D.check_seq_lens(seq_lens, 2**62)
        D.check_block_table(block_table, lens, gk.num_pages)
        D.check_query_start_loc(query_start_loc, lens, max_query_len, int(q.shape[0]))
    if num_seqs == 0 or max_query_len == 0:
        return out
    block_m, block_n, num_warps, num_stages = _prefill_config(gk.head_dim, max_query_len)
    scale = gk.head_dim**-0.5 if scale is None else scale
    grid = (C.cdiv(max_query_len, block_m), int(q.shape[1]), num_seqs)
    _prefill_attention_kernel[grid](
        q,
        key_cache,
        value_cache,
        block_table.table,
        query_start_loc,
        seq_lens,
        out,
        scale * LOG2E,
        *q.stride(),
        *gk.strides,
        *gv.strides,
        *block_table.table.stride(),
        *out.stride(),
        gk.head_dim,
        qpk,
        PAGE_SIZE=gk.page_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=_block_d(gk.head_dim),
        USE_INT64=C.needs_int64(q, key_cache, value_cache, out, block_table.table),
        DOT_PRECISION=C.dot_precision(q.dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


# ---------------------------------------------------------------------------------------
# (f) decode: split-K over the sequence, then a reduce kernel
# ---------------------------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [num_seqs, num_q_heads, head_dim]
    key_cache_ptr,  # NHD [num_pages, PAGE_SIZE, num_kv_heads, head_dim] or HND
    value_cache_ptr,  # same shape as key_cache_ptr
    block_table_ptr,  # int32 [num_seqs, max_entries]
    seq_lens_ptr,  # int32 [num_seqs]: keys per sequence, the current token included
    part_acc_ptr,  # fp32 [num_seqs, num_q_heads, num_splits, head_dim]: normalised partials
    part_lse_ptr,  # fp32 [num_seqs, num_q_heads, num_splits]: log2-sum-exp2 of each split
    scale_log2e,
    stride_q_seq,
    stride_q_head,
    stride_q_dim,
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
    stride_pa_seq,
    stride_pa_head,
    stride_pa_split,
    stride_pa_dim,
    stride_pl_seq,
    stride_pl_head,
    stride_pl_split,
    head_dim,
    queries_per_kv,
    num_splits,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Each split takes a whole number of tiles; late splits of short sequences are empty
    # and record lse = -inf, which the reduce ignores.
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = g < queries_per_kv
    d_ok = offs_d < head_dim
    heads = kv_head * queries_per_kv + g  # the query heads sharing this KV head (GQA)
    if USE_INT64:
        seq = seq.to(tl.int64)
    seq_off = seq * stride_bt_seq
    q = tl.load(
        q_ptr
        + seq * stride_q_seq
        + heads[:, None] * stride_q_head
        + offs_d[None, :] * stride_q_dim,
        mask=h_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    k_base = key_cache_ptr + kv_head * stride_kc_head
    v_base = value_cache_ptr + kv_head * stride_vc_head
    for start_n in range(start, end, BLOCK_N):
        # decode needs no causal mask (its one query is the last position): q_pos is unused
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            k_base,
            v_base,
            block_table_ptr + seq_off,
            stride_bt_entry,
            start_n,
            m_i,
            end,
            stride_kc_page,
            stride_kc_tok,
            stride_kc_dim,
            stride_vc_page,
            stride_vc_tok,
            stride_vc_dim,
            scale_log2e,
            head_dim,
            False,
            True,
            PAGE_SIZE,
            BLOCK_N,
            BLOCK_D,
            USE_INT64,
            DOT_PRECISION,
        )
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(
        part_acc_ptr
        + seq * stride_pa_seq
        + heads[:, None] * stride_pa_head
        + split * stride_pa_split
        + offs_d[None, :] * stride_pa_dim,
        out,
        mask=h_ok[:, None] & d_ok[None, :],
    )
    tl.store(
        part_lse_ptr + seq * stride_pl_seq + heads * stride_pl_head + split * stride_pl_split,
        lse,
        mask=h_ok,
    )


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr,  # fp32 [num_seqs, num_q_heads, num_splits, head_dim]
    part_lse_ptr,  # fp32 [num_seqs, num_q_heads, num_splits]
    out_ptr,  # [num_seqs, num_q_heads, head_dim]
    stride_pa_seq,
    stride_pa_head,
    stride_pa_split,
    stride_pa_dim,
    stride_pl_seq,
    stride_pl_head,
    stride_pl_split,
    stride_o_seq,
    stride_o_head,
    stride_o_dim,
    head_dim,
    num_splits,
    SPLITS_PAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    if USE_INT64:
        seq = seq.to(tl.int64)
    sp = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    sp_ok = sp < num_splits
    d_ok = offs_d < head_dim
    lse = tl.load(
        part_lse_ptr + seq * stride_pl_seq + head * stride_pl_head + sp * stride_pl_split,
        mask=sp_ok,
        other=float("-inf"),
    )
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: weights 0, output 0
    w = tl.exp2(lse - m)
    part = tl.load(
        part_acc_ptr
        + seq * stride_pa_seq
        + head * stride_pa_head
        + sp[:, None] * stride_pa_split
        + offs_d[None, :] * stride_pa_dim,
        mask=sp_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * part, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d * stride_o_dim,
        out.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )


def decode_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int, device: torch.device
) -> int:
    """Heuristic split count: fill the GPU about twice, but keep >= 4 tiles per split.

    Short contexts or big batches get 1 split (no reduce overhead worth paying); a single
    long sequence on a large GPU gets up to :data:`MAX_DECODE_SPLITS`.
    """
    programs = max(1, num_seqs * num_kv_heads)
    want = C.cdiv(2 * C.num_sms(device), programs)
    useful = max(1, C.cdiv(max_seq_len, 4 * block_n))
    return max(1, min(want, useful, MAX_DECODE_SPLITS))


def decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    seq_lens: torch.Tensor,
    *,
    max_seq_len: int,
    scale: float | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    layout: Layout = "NHD",
    debug: bool | None = None,
) -> torch.Tensor:
    """One query token per sequence over its whole paged KV (flash-decoding).

    ``q`` is ``[num_seqs, num_q_heads, head_dim]``; sequence ``i`` attends to positions
    ``0 .. seq_lens[i] - 1`` (its own token already written by ``write_kv``); a sequence of
    length 0 (padding) gets zeros. The keys are split into ``num_splits`` chunks processed in
    parallel (heuristic :func:`decode_num_splits` if ``None``, from the host int
    ``max_seq_len``), then a reduce kernel merges the partial softmaxes. No sync.
    """
    gk, gv, qpk = _check_attention_inputs(q, key_cache, value_cache, block_table, layout)
    C.check_index_tensor(seq_lens, "seq_lens", 1, (torch.int32,))
    num_seqs, num_q_heads, head_dim = (int(x) for x in q.shape)
    if seq_lens.shape[0] != num_seqs:
        raise KernelInputError("decode takes one query row per sequence")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype not in C.SUPPORTED_DTYPES:
        raise KernelInputError(f"out must be {tuple(q.shape)}, got {tuple(out.shape)}")
    C.check_device(q, key_cache, value_cache, block_table.table, seq_lens, out)
    if C.debug_enabled(debug):
        lens = D.check_seq_lens(seq_lens, max_seq_len)
        D.check_block_table(block_table, lens, gk.num_pages)
    if num_seqs == 0:
        return out
    block_n = 16 if C.interpreting() else (64 if head_dim > 64 else 128)
    block_h = C.next_pow2(qpk) if C.interpreting() else max(16, C.next_pow2(qpk))
    if num_splits is None:
        num_splits = decode_num_splits(num_seqs, gk.num_kv_heads, max_seq_len, block_n, q.device)
    if not 1 <= num_splits <= MAX_DECODE_SPLITS:
        raise KernelInputError(f"num_splits={num_splits} outside [1, {MAX_DECODE_SPLITS}]")
    part_acc = torch.empty(
        num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    scale = head_dim**-0.5 if scale is None else scale
    block_d = _block_d(head_dim)
    _decode_split_kernel[(num_seqs, gk.num_kv_heads, num_splits)](
        q,
        key_cache,
        value_cache,
        block_table.table,
        seq_lens,
        part_acc,
        part_lse,
        scale * LOG2E,
        *q.stride(),
        *gk.strides,
        *gv.strides,
        *block_table.table.stride(),
        *part_acc.stride(),
        *part_lse.stride(),
        head_dim,
        qpk,
        num_splits,
        PAGE_SIZE=gk.page_size,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        USE_INT64=C.needs_int64(q, key_cache, value_cache, block_table.table, part_acc),
        DOT_PRECISION=C.dot_precision(q.dtype),
        num_warps=4,
        num_stages=2,
    )
    _decode_reduce_kernel[(num_seqs, num_q_heads)](
        part_acc,
        part_lse,
        out,
        *part_acc.stride(),
        *part_lse.stride(),
        *out.stride(),
        head_dim,
        num_splits,
        SPLITS_PAD=C.next_pow2(num_splits),
        BLOCK_D=block_d,
        USE_INT64=C.needs_int64(part_acc, out),
        num_warps=1,
    )
    return out
