"""Plain torch references for every kernel: loops over Python ints, obviously correct.

Each function returns new tensors and never modifies its inputs. Addresses come from
:mod:`prefixkv.kernels.index_math` evaluated on Python ints, the same formulas the
launchers and the proofs use. Speed is irrelevant here; readability is the point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import index_math
from .index_math import PY_OPS, Layout
from .metadata import BlockTable


def _ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def _token_view(cache: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The cache as ``[num_pages, page_size, num_kv_heads, head_dim]`` whatever the layout."""
    return cache if layout == "NHD" else cache.transpose(1, 2)


def write_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    layout: Layout = "NHD",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches after storing row ``t`` of key/value at slot ``slot_mapping[t]`` (skip < 0)."""
    kc, vc = key_cache.clone(), value_cache.clone()
    kt, vt = _token_view(kc, layout), _token_view(vc, layout)
    page_size = kt.shape[1]
    for t, slot in enumerate(_ints(slot_mapping)):
        if slot < 0:
            continue
        page, off = index_math.split_slot(slot, page_size, PY_OPS)
        kt[page, off] = key[t].to(kc.dtype)
        vt[page, off] = value[t].to(vc.dtype)
    return kc, vc


def seq_slots(block_table: BlockTable, seq: int, length: int) -> list[int]:
    """Slots of positions ``0 .. length - 1`` of sequence ``seq``."""
    row = _ints(block_table.table[seq])
    return [
        index_math.slot_for_position(pos, row.__getitem__, block_table.page_size, PY_OPS)
        for pos in range(length)
    ]


def gather_seq_ref(
    cache: torch.Tensor, block_table: BlockTable, seq: int, length: int, *, layout: Layout = "NHD"
) -> torch.Tensor:
    """``[length, num_kv_heads, head_dim]``: positions ``0 .. length - 1`` of one sequence."""
    tv = _token_view(cache, layout)
    page_size = tv.shape[1]
    pages, offs = [], []
    for slot in seq_slots(block_table, seq, length):
        page, off = index_math.split_slot(slot, page_size, PY_OPS)
        pages.append(page)
        offs.append(off)
    index = torch.tensor(pages, dtype=torch.long, device=cache.device)
    return tv[index, torch.tensor(offs, dtype=torch.long, device=cache.device)]


def gather_kv_ref(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    seq_lens: torch.Tensor,
    *,
    layout: Layout = "NHD",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The varlen concatenation of every sequence's first ``seq_lens[i]`` tokens."""
    ks, vs = [], []
    for i, n in enumerate(_ints(seq_lens)):
        ks.append(gather_seq_ref(key_cache, block_table, i, n, layout=layout))
        vs.append(gather_seq_ref(value_cache, block_table, i, n, layout=layout))
    return torch.cat(ks), torch.cat(vs)


def copy_blocks_ref(cache: torch.Tensor, block_mapping: torch.Tensor) -> torch.Tensor:
    """Cache after copying page ``src`` onto ``dst`` for each pair (pairs with a negative id
    are skipped). Pages are the first dimension in both layouts."""
    out = cache.clone()
    for src, dst in block_mapping.tolist():
        if src >= 0 and dst >= 0:
            out[dst] = cache[src]
    return out


def copy_state_ref(
    src_state: torch.Tensor,
    dst_state: torch.Tensor,
    src_slots: Sequence[int],
    dst_slots: Sequence[int],
) -> torch.Tensor:
    """``dst_state`` after ``dst[dst_slots[i]] = src[src_slots[i]]`` for every ``i``."""
    out = dst_state.clone()
    for s, d in zip(src_slots, dst_slots, strict=True):
        out[d] = src_state[s].to(out.dtype)
    return out


def update_conv_state_ref(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    query_start_loc: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor | None = None,
    out_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out_state`` after each sequence's state becomes the last ``width - 1`` columns of
    ``concat(old_state, x_seq.T)`` along time (old state zero for a negative source slot)."""
    dst_slots = src_slots if dst_slots is None else dst_slots
    out = (conv_state if out_state is None else out_state).clone()
    keep = conv_state.shape[2]
    qsl = _ints(query_start_loc)
    for i, (s, d) in enumerate(zip(_ints(src_slots), _ints(dst_slots), strict=True)):
        if d < 0:
            continue
        old = conv_state[s] if s >= 0 else torch.zeros_like(conv_state[0])
        window = torch.cat([old.float(), x[qsl[i] : qsl[i + 1]].T.float()], dim=1)
        out[d] = window[:, window.shape[1] - keep :].to(out.dtype)
    return out


def attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    layout: Layout = "NHD",
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Paged attention with bottom-right causal masking, one sequence at a time.

    With the default ``compute_dtype=float64`` this is the accuracy reference. With
    ``compute_dtype`` equal to the input dtype it is the *naive* low-precision
    implementation (scores, softmax and P @ V all rounded to fp16/bf16) whose error sets
    the kernels' tolerance. Decode is the case of one query per sequence. Rows that belong
    to no sequence are returned as zeros.
    """
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else scale
    qpk = q.shape[1] // _token_view(key_cache, layout).shape[2]
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    qsl, lens = _ints(query_start_loc), _ints(seq_lens)
    for i, seq_len in enumerate(lens):
        a, b = qsl[i], qsl[i + 1]
        if a == b:
            continue
        k = gather_seq_ref(key_cache, block_table, i, seq_len, layout=layout)
        v = gather_seq_ref(value_cache, block_table, i, seq_len, layout=layout)
        k = k.to(compute_dtype).repeat_interleave(qpk, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = v.to(compute_dtype).repeat_interleave(qpk, dim=1).transpose(0, 1)
        qs = q[a:b].to(compute_dtype).transpose(0, 1)  # [Hq, L, D]
        cached = seq_len - (b - a)
        q_pos = torch.arange(b - a, device=q.device).unsqueeze(1) + cached  # bottom-right causal
        visible = torch.arange(seq_len, device=q.device).unsqueeze(0) <= q_pos  # [L, S]
        scores = (qs @ k.transpose(1, 2)) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[a:b] = (probs @ v).transpose(0, 1)
    return out


def decode_attention_ref(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: BlockTable,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    layout: Layout = "NHD",
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Decode: one query per sequence, sitting at the last position (zeros if empty)."""
    qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    out = attention_ref(
        q,
        key_cache,
        value_cache,
        block_table,
        qsl,
        torch.clamp(seq_lens, min=1),
        scale=scale,
        layout=layout,
        compute_dtype=compute_dtype,
    )
    out[seq_lens == 0] = 0
    return out
