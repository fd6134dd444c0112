"""Write, gather and block-copy kernels: exact against the references, canaries intact."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testlib import (
    SENTINEL,
    assert_guards,
    draw_batch,
    examples,
    kv_caches,
    make_gen,
    randn,
    sizes_for,
)
from prefixkv.kernels import _common, copy_blocks, gather_kv, write_kv
from prefixkv.kernels import reference as R
from prefixkv.kernels.index_math import Layout

LAYOUTS = ("NHD", "HND")
# Data movement does no arithmetic, so bf16 is exact under the interpreter too.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dims(data: st.DataObject, device: torch.device) -> tuple[int, int]:
    sz = sizes_for(device)
    return (
        data.draw(st.sampled_from(sz.kv_heads), label="kv_heads"),
        data.draw(st.sampled_from(sz.copy_head_dims), label="head_dim"),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_write_kv_exact_with_canaries(
    device: torch.device, layout: Layout, data: st.DataObject
) -> None:
    b = draw_batch(data, sizes_for(device), device, min_new=0)
    heads, dim = _dims(data, device)
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    src_dtype = data.draw(st.sampled_from((dtype, torch.float32)), label="source dtype")
    if device.type == "cpu" and dtype == torch.bfloat16:
        # The interpreter truncates fp32 -> bf16 where torch and the GPU round to nearest
        # even; a cast into bf16 is only checked on the GPU.
        src_dtype = dtype
    gen = make_gen(data)
    kc, vc = kv_caches(
        layout,
        b.num_pages,
        b.block_size,
        heads,
        dim,
        dtype,
        device,
        strided=data.draw(st.booleans(), label="strided cache"),
    )
    slots = b.meta.slot_mapping.clone()
    n = slots.shape[0]
    # skip some tokens and pad the batch: both must leave the cache untouched
    skip = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=3), label="skip") if n else []
    slots[skip] = -1
    pad = data.draw(st.integers(0, 2), label="padding rows")
    slots = torch.cat([slots, torch.full((pad,), -1, dtype=torch.int64, device=device)])
    # K and V as strided views of one fused projection output, with extra rows
    fused = randn(gen, (n + pad + 1, 2, heads, dim), src_dtype, device)
    k, v = fused[:, 0], fused[:, 1]
    want_k, want_v = R.write_kv_ref(k, v, kc, vc, slots, layout=layout)
    write_kv(k, v, kc, vc, slots, layout=layout, debug=data.draw(st.booleans()))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    written = int((slots >= 0).sum())
    assert int((kc != SENTINEL).sum()) == written * heads * dim  # canary: nothing else moved
    assert int((vc != SENTINEL).sum()) == written * heads * dim
    assert_guards(kc, vc)


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_gather_kv_exact_with_canaries(
    device: torch.device, layout: Layout, data: st.DataObject
) -> None:
    b = draw_batch(data, sizes_for(device), device, min_new=0)
    heads, dim = _dims(data, device)
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    gen = make_gen(data)
    kc, vc = kv_caches(
        layout,
        b.num_pages,
        b.block_size,
        heads,
        dim,
        dtype,
        device,
        strided=data.draw(st.booleans()),
        fill=gen,
    )
    kc0, vc0 = kc.clone(), vc.clone()
    total = sum(b.cached) + sum(b.new)
    pad = data.draw(st.integers(0, 3), label="buffer padding")
    out = (
        torch.full((total + pad, heads, dim), SENTINEL, dtype=dtype, device=device),
        torch.full((total + pad, heads, dim), SENTINEL, dtype=dtype, device=device),
    )
    gather_kv(
        kc,
        vc,
        b.meta.block_table,
        b.meta.seq_lens,
        max_seq_len=b.meta.max_seq_len,
        out=out,
        layout=layout,
        debug=data.draw(st.booleans()),
    )
    want_k, want_v = R.gather_kv_ref(kc, vc, b.meta.block_table, b.meta.seq_lens, layout=layout)
    assert torch.equal(out[0][:total], want_k) and torch.equal(out[1][:total], want_v)
    assert bool((out[0][total:] == SENTINEL).all()) and bool((out[1][total:] == SENTINEL).all())
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)  # the source is only read


def test_gather_kv_cached_prefix_only(device: torch.device) -> None:
    """Gathering fewer tokens than a sequence holds (just its cached prefix) works too."""
    from prefixkv.kernels import build_batch_metadata

    kc, vc = kv_caches(
        "NHD",
        6,
        4,
        1,
        8,
        torch.float32,
        device,
        strided=False,
        fill=torch.Generator().manual_seed(1),
    )
    m = build_batch_metadata([5, 2], [3, 1], [[4, 0, 2], [5]], 4, device=device)
    cached = torch.tensor([5, 2], dtype=torch.int32, device=device)
    k, v = gather_kv(kc, vc, m.block_table, cached, max_seq_len=5, total_tokens=7)
    want_k, want_v = R.gather_kv_ref(kc, vc, m.block_table, cached)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_copy_blocks_exact_with_canaries(
    device: torch.device, layout: Layout, data: st.DataObject
) -> None:
    sz = sizes_for(device)
    heads, dim = _dims(data, device)
    page = data.draw(st.sampled_from(sz.block_sizes), label="page size")
    pages = data.draw(st.integers(2, 12), label="pages")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    gen = make_gen(data)
    rnd = data.draw(st.randoms(use_true_random=False))
    ids = rnd.sample(range(pages), pages)
    npairs = data.draw(st.integers(0, pages // 2), label="pairs")
    pairs = [[ids[i], ids[pages // 2 + i]] for i in range(npairs)]  # sources, dests disjoint
    if data.draw(st.booleans(), label="padded mapping"):
        pairs.append([-1, -1])
        pairs.append([ids[0], -1])
    mapping = torch.tensor(pairs, dtype=torch.int64, device=device).reshape(-1, 2)
    if data.draw(st.booleans(), label="int32 mapping"):
        mapping = mapping.to(torch.int32)
    caches = kv_caches(
        layout, pages, page, heads, dim, dtype, device, strided=data.draw(st.booleans()), fill=gen
    )
    want = [R.copy_blocks_ref(c, mapping) for c in caches]
    copy_blocks(list(caches), mapping, layout=layout, debug=data.draw(st.booleans()))
    for got, exp in zip(caches, want, strict=True):
        assert torch.equal(got, exp)  # includes every page that is no destination
    assert_guards(*caches)


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(deadline=None, max_examples=examples(15))
@given(data=st.data())
def test_copy_blocks_cow_fork_at_block_edges(
    device: torch.device, layout: Layout, data: st.DataObject
) -> None:
    """Copy-on-write fork of every sequence's last block, lengths drawn at a block boundary
    and +-1 (a full last block, one token short, one token into a new block).

    After the copy the forked block table must gather exactly the tokens of the original,
    the cache must equal the reference (pages that are no destination unchanged), pages
    nobody owns keep the sentinel and the guard pages around the pool are intact."""
    from prefixkv.kernels import build_batch_metadata

    b = draw_batch(data, sizes_for(device), device, min_new=0)
    heads, dim = _dims(data, device)
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    gen = make_gen(data)
    lens = [c + q for c, q in zip(b.cached, b.new, strict=True)]
    fresh = b.num_pages  # the fork's pages come after the batch's pool
    kc, vc = kv_caches(
        layout,
        b.num_pages + len(lens),
        b.block_size,
        heads,
        dim,
        dtype,
        device,
        strided=data.draw(st.booleans(), label="strided cache"),
    )
    # every token of every sequence written: the partial last blocks keep sentinel tails
    full = build_batch_metadata([0] * len(lens), lens, b.block_ids, b.block_size, device=device)
    src = randn(gen, (full.num_tokens, 2, heads, dim), dtype, device)
    write_kv(src[:, 0], src[:, 1], kc, vc, full.slot_mapping, layout=layout)
    pairs, forked = [], []
    for i, ids in enumerate(b.block_ids):
        if ids:
            pairs.append([ids[-1], fresh + i])
            forked.append([*ids[:-1], fresh + i])
        else:
            forked.append([])
    if data.draw(st.booleans(), label="padded mapping"):
        pairs.append([-1, fresh])  # skipped: must not copy onto page `fresh`
    mapping = torch.tensor(pairs, dtype=torch.int64, device=device).reshape(-1, 2)
    want = [R.copy_blocks_ref(c, mapping) for c in (kc, vc)]
    orig = R.gather_kv_ref(kc, vc, full.block_table, full.seq_lens, layout=layout)
    copy_blocks([kc, vc], mapping, layout=layout, debug=data.draw(st.booleans()))
    assert torch.equal(kc, want[0]) and torch.equal(vc, want[1])
    fork = build_batch_metadata([0] * len(lens), lens, forked, b.block_size, device=device)
    got = gather_kv(
        kc,
        vc,
        fork.block_table,
        fork.seq_lens,
        max_seq_len=fork.max_seq_len,
        total_tokens=sum(lens),
        layout=layout,
    )
    assert torch.equal(got[0], orig[0]) and torch.equal(got[1], orig[1])
    used = {p for ids in b.block_ids for p in ids} | {d for s, d in pairs if s >= 0}
    for page in set(range(b.num_pages + len(lens))) - used:
        assert bool((kc[page] == SENTINEL).all()) and bool((vc[page] == SENTINEL).all())
    assert_guards(kc, vc)


def test_int64_offset_path(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Force USE_INT64 (the launchers' choice for caches past 2**31 elements) and check the
    widened index math gives the same bytes."""
    from prefixkv.kernels import build_batch_metadata

    monkeypatch.setattr(_common, "needs_int64", lambda *ts: True)
    gen = torch.Generator().manual_seed(3)
    kc, vc = kv_caches("HND", 10, 4, 2, 8, torch.float16, device, strided=True)
    m = build_batch_metadata([5, 0], [4, 3], [[9, 2, 7], [0]], 4, device=device)
    k = randn(gen, (m.num_tokens, 2, 8), torch.float16, device)
    want = R.write_kv_ref(k, k, kc, vc, m.slot_mapping, layout="HND")
    write_kv(k, k, kc, vc, m.slot_mapping, layout="HND")
    assert torch.equal(kc, want[0]) and torch.equal(vc, want[1])
    out = gather_kv(kc, vc, m.block_table, m.seq_lens, max_seq_len=9, total_tokens=12, layout="HND")
    ref = R.gather_kv_ref(kc, vc, m.block_table, m.seq_lens, layout="HND")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    mapping = torch.tensor([[9, 4]], device=device)
    want_c = R.copy_blocks_ref(kc, mapping)
    copy_blocks([kc], mapping, layout="HND")
    assert torch.equal(kc, want_c)


def test_bad_shapes_raise(device: torch.device) -> None:
    kc, vc = kv_caches("NHD", 4, 4, 2, 8, torch.float32, device, strided=False)
    with pytest.raises(ValueError):
        write_kv(
            torch.zeros(3, 1, 8, device=device),
            torch.zeros(3, 1, 8, device=device),
            kc,
            vc,
            torch.zeros(3, dtype=torch.int64, device=device),
        )
    with pytest.raises(TypeError):
        write_kv(
            torch.zeros(3, 2, 8, device=device),
            torch.zeros(3, 2, 8, device=device),
            kc,
            vc,
            torch.zeros(3, dtype=torch.float32, device=device),
        )
    with pytest.raises(ValueError):
        copy_blocks([kc], torch.zeros(3, 3, dtype=torch.int64, device=device))
