"""Paged prefix-prefill and split-K decode attention against fp64 references.

Tolerance rule (``kernel_testlib.assert_attention_close``): the kernel's max abs error
against the fp64 reference must be at most twice the error of a naive implementation
computed entirely in the input precision, plus a small per-dtype floor.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testlib import (
    SENTINEL,
    assert_attention_close,
    assert_guards,
    draw_batch,
    examples,
    kv_caches,
    make_gen,
    randn,
    sizes_for,
)
from prefixkv.kernels import (
    build_batch_metadata,
    decode_attention,
    prefill_attention,
    to_kernel_pages,
    write_kv,
)
from prefixkv.kernels import reference as R
from prefixkv.kernels.index_math import Layout

# bf16 tl.dot is wrong in the CPU interpreter: bf16 attention runs on the GPU only.
DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.gpu),
]


def _skip_unsupported(device: torch.device, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and device.type != "cuda":
        pytest.skip("bf16 tl.dot is wrong under the CPU interpreter; bf16 runs on the GPU")


def _heads(data: st.DataObject, device: torch.device) -> tuple[int, int, int]:
    sz = sizes_for(device)
    kv = data.draw(st.sampled_from(sz.kv_heads), label="kv_heads")
    ratio = data.draw(st.sampled_from(sz.gqa_ratios), label="gqa ratio")
    dim = data.draw(st.sampled_from(sz.attn_head_dims), label="head_dim")
    return kv * ratio, kv, dim


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_prefill_attention(
    device: torch.device, dtype: torch.dtype, layout: Layout, data: st.DataObject
) -> None:
    _skip_unsupported(device, dtype)
    b = draw_batch(data, sizes_for(device), device, min_new=0)
    hq, hkv, dim = _heads(data, device)
    gen = make_gen(data)
    kc, vc = kv_caches(
        layout,
        b.num_pages,
        b.block_size,
        hkv,
        dim,
        dtype,
        device,
        strided=data.draw(st.booleans(), label="strided cache"),
    )
    # The cached prefix: fill each sequence's cached positions; every other slot keeps the
    # sentinel, so a read outside a sequence's keys blows up the output.
    m = b.meta
    prefix = build_batch_metadata(
        [0] * len(b.cached), b.cached, b.block_ids, b.block_size, device=device
    )
    pk = randn(gen, (prefix.num_tokens, hkv, dim), dtype, device)
    write_kv(pk, randn(gen, pk.shape, dtype, device), kc, vc, prefix.slot_mapping, layout=layout)
    # The new tokens: K/V written into the cache first, as the kernel's contract says.
    new_k = randn(gen, (m.num_tokens, hkv, dim), dtype, device)
    write_kv(new_k, randn(gen, new_k.shape, dtype, device), kc, vc, m.slot_mapping, layout=layout)
    pad = data.draw(st.integers(0, 2), label="padding rows")
    qkv = randn(gen, (m.num_tokens + pad, hq + 1, dim), dtype, device)
    q = qkv[:, :hq]  # strided view: a slice of a fused projection
    out = torch.full((m.num_tokens + pad, hq, dim), SENTINEL, dtype=dtype, device=device)
    kc0, vc0 = kc.clone(), vc.clone()
    scale = data.draw(st.sampled_from([None, 0.3]), label="scale")
    prefill_attention(
        q,
        kc,
        vc,
        m.block_table,
        m.query_start_loc,
        m.seq_lens,
        max_query_len=m.max_query_len,
        scale=scale,
        out=out,
        layout=layout,
        debug=data.draw(st.booleans(), label="debug"),
    )
    args = (q, kc, vc, m.block_table, m.query_start_loc, m.seq_lens)
    ref = R.attention_ref(*args, scale=scale, layout=layout)
    naive = R.attention_ref(*args, scale=scale, layout=layout, compute_dtype=dtype)
    rows = slice(0, m.num_tokens)
    assert_attention_close(out, ref, naive, dtype, rows)
    assert bool((out[m.num_tokens :] == SENTINEL).all()), "padding rows were written"
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0), "attention wrote the cache"
    assert_guards(kc, vc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_decode_attention(
    device: torch.device, dtype: torch.dtype, layout: Layout, data: st.DataObject
) -> None:
    _skip_unsupported(device, dtype)
    b = draw_batch(data, sizes_for(device), device, decode=True)
    hq, hkv, dim = _heads(data, device)
    gen = make_gen(data)
    kc, vc = kv_caches(
        layout,
        b.num_pages,
        b.block_size,
        hkv,
        dim,
        dtype,
        device,
        strided=data.draw(st.booleans(), label="strided cache"),
        fill=gen,
    )
    m = b.meta
    seq_lens = m.seq_lens.clone()
    if data.draw(st.booleans(), label="padding sequence"):
        seq_lens[-1] = 0  # a CUDA-graph padding slot: output must be zeros
    q = randn(gen, (m.num_seqs, hq, dim), dtype, device)
    splits = data.draw(st.sampled_from([None, 1, 2, 3, 8]), label="num_splits")
    kc0, vc0 = kc.clone(), vc.clone()
    out = decode_attention(
        q,
        kc,
        vc,
        m.block_table,
        seq_lens,
        max_seq_len=m.max_seq_len,
        num_splits=splits,
        layout=layout,
        debug=data.draw(st.booleans(), label="debug"),
    )
    ref = R.decode_attention_ref(q, kc, vc, m.block_table, seq_lens, layout=layout)
    naive = R.decode_attention_ref(
        q, kc, vc, m.block_table, seq_lens, layout=layout, compute_dtype=dtype
    )
    assert_attention_close(out, ref, naive, dtype)
    assert not out[seq_lens == 0].any()
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0), "decode wrote the cache"
    assert_guards(kc, vc)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_zero_prefix_block_edges(device: torch.device, head_dim: int) -> None:
    """Fixed cases the draws might miss: zero prefix, lengths at a page boundary +-1, a
    sequence with no new tokens, GQA 4:1, and the page-ratio conversion (cache in 4-token
    pages, table in 8-token blocks)."""
    gen = torch.Generator().manual_seed(7)
    dtype = torch.float16
    cached, new = [0, 7, 8, 9, 5], [8, 9, 1, 7, 0]
    ids = [[0, 1], [2, 3, 4], [5, 6], [7, 8], [9]]
    m = build_batch_metadata(cached, new, ids, 8, device=device)
    pages = to_kernel_pages(m.block_table, 4)
    kc, vc = kv_caches("NHD", 20, 4, 2, head_dim, dtype, device, strided=False, fill=gen)
    q = randn(gen, (m.num_tokens, 8, head_dim), dtype, device)
    out = prefill_attention(
        q, kc, vc, pages, m.query_start_loc, m.seq_lens, max_query_len=m.max_query_len, debug=True
    )
    ref = R.attention_ref(q, kc, vc, pages, m.query_start_loc, m.seq_lens)
    naive = R.attention_ref(q, kc, vc, pages, m.query_start_loc, m.seq_lens, compute_dtype=dtype)
    assert_attention_close(out, ref, naive, dtype)


def test_decode_splits_agree(device: torch.device) -> None:
    """Every split count gives the same answer up to rounding, long sequence included."""
    gen = torch.Generator().manual_seed(11)
    n = 70 if device.type == "cpu" else 20000
    m = build_batch_metadata(
        [n - 1, 3], [1, 1], [list(range(n // 4 + 1)), [n // 4 + 1]], 4, device=device
    )
    kc, vc = kv_caches("NHD", n // 4 + 2, 4, 1, 64, torch.float32, device, strided=False, fill=gen)
    q = randn(gen, (2, 2, 64), torch.float32, device)
    outs = [
        decode_attention(q, kc, vc, m.block_table, m.seq_lens, max_seq_len=n, num_splits=s)
        for s in (1, 2, 5, 64)
    ]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-5)


def test_attention_rejects_bad_gqa(device: torch.device) -> None:
    kc, vc = kv_caches("NHD", 4, 4, 2, 64, torch.float16, device, strided=False)
    m = build_batch_metadata([0], [2], [[0]], 4, device=device)
    q = torch.zeros(2, 3, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError):
        prefill_attention(q, kc, vc, m.block_table, m.query_start_loc, m.seq_lens, max_query_len=2)
    with pytest.raises(ValueError):  # dtype mismatch between q and the cache
        decode_attention(q[:1, :2].float(), kc, vc, m.block_table, m.seq_lens, max_seq_len=2)
