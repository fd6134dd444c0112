"""Metadata: builders, CSR conversion, tagged block tables, debug checks, no host syncs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testlib import CPU_SIZES, SENTINEL, draw_batch, examples, kv_caches, sizes_for
from prefixkv.kernels import (
    BlockTable,
    BlockTableAlreadyConvertedError,
    KernelIndexError,
    PageSizeError,
    attention,
    build_batch_metadata,
    cache_ops,
    compute_slot_mapping,
    copy_blocks,
    decode_attention,
    gather_kv,
    plan_state_copy,
    prefill_attention,
    state_ops,
    to_flashinfer_csr,
    to_kernel_pages,
    update_conv_state,
    write_kv,
)
from prefixkv.kernels import reference as R


def test_build_batch_metadata_by_hand() -> None:
    m = build_batch_metadata([3, 0], [2, 5], [[7, 2], [4, 1]], 4)
    assert m.query_start_loc.tolist() == [0, 2, 7]
    assert m.seq_lens.tolist() == [5, 5]
    assert m.block_table.table.tolist() == [[7, 2], [4, 1]]
    assert m.block_table.page_size == 4 and not m.block_table.in_kernel_pages
    # seq 0: positions 3, 4 -> block 7 off 3, block 2 off 0; seq 1: 0..4
    assert m.slot_mapping.tolist() == [31, 8, 16, 17, 18, 19, 4]
    assert (m.max_query_len, m.max_seq_len, m.num_tokens) == (5, 5, 7)
    padded = build_batch_metadata([0], [1], [[3]], 4, pad_tokens_to=3)
    assert padded.slot_mapping.tolist() == [12, -1, -1]


def test_build_batch_metadata_rejects_short_block_list() -> None:
    with pytest.raises(ValueError):
        build_batch_metadata([4], [1], [[0]], 4)


@settings(deadline=None, max_examples=examples(30))
@given(data=st.data())
def test_compute_slot_mapping_matches_builder(data: st.DataObject) -> None:
    b = draw_batch(data, CPU_SIZES, torch.device("cpu"), min_new=0)
    m = b.meta
    pad = data.draw(st.integers(0, 3))
    got = compute_slot_mapping(m.query_start_loc, m.seq_lens, m.block_table, m.num_tokens + pad)
    assert got.dtype == torch.int64
    assert got.tolist() == m.slot_mapping.tolist() + [-1] * pad


def test_drawn_lengths_hit_block_boundaries() -> None:
    """The batch generator every kernel test uses really draws lengths one short of, at and
    one past a block boundary, zero-length cached prefixes and decode lengths at the edges;
    otherwise the kernel tests would pass without ever trying those cases."""
    seen: set[tuple[str, int]] = set()

    def edge(n: int, bs: int) -> int:
        """-1, 0 or +1 for a length next to a boundary of a block size > 2, else 9."""
        return {0: 0, 1: 1, bs - 1: -1}.get(n % bs, 9) if bs > 2 and n > 0 else 9

    @settings(max_examples=150, derandomize=True, database=None)
    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        decode = data.draw(st.booleans(), label="decode")
        b = draw_batch(data, CPU_SIZES, torch.device("cpu"), min_new=0, decode=decode)
        for c, q in zip(b.cached, b.new, strict=True):
            if decode:
                seen.add(("decode", edge(c + q, b.block_size)))
                continue
            seen.add(("cached", edge(c, b.block_size)))
            seen.add(("new", edge(q, b.block_size)))
            seen.add(("total", edge(c + q, b.block_size)))
            if c == 0:
                seen.add(("zero prefix", 0))

    collect()
    for kind in ("cached", "new", "total", "decode"):
        for delta in (-1, 0, 1):
            assert (kind, delta) in seen, (kind, delta)
    assert ("zero prefix", 0) in seen


def _csr_reference(
    lens: list[int], ids: list[list[int]], ratio: int, page: int
) -> tuple[list[int], list[int], list[int]]:
    indptr, indices, last = [0], [], []
    for n, blocks in zip(lens, ids, strict=True):
        pages = [b * ratio + j for b in blocks for j in range(ratio)][: -(-n // page)]
        indices += pages
        indptr.append(len(indices))
        last.append(0 if n == 0 else n - (len(pages) - 1) * page)
    return indptr, indices, last


@settings(deadline=None, max_examples=examples(30))
@given(data=st.data())
def test_flashinfer_csr_against_reference(data: st.DataObject) -> None:
    ratio = data.draw(st.sampled_from([1, 2, 4]))
    page = data.draw(st.sampled_from([1, 2, 4]))
    b = draw_batch(data, CPU_SIZES, torch.device("cpu"), block_size=page * ratio, min_new=0)
    lens = b.meta.seq_lens.tolist()
    indptr, indices, last = _csr_reference(lens, b.block_ids, ratio, page)
    hint = data.draw(st.booleans())
    csr = to_flashinfer_csr(
        b.meta.seq_lens, b.meta.block_table, page, num_total_pages=indptr[-1] if hint else None
    )
    assert csr.kv_indptr.tolist() == indptr
    assert csr.kv_indices.tolist() == indices
    assert csr.kv_last_page_len.tolist() == last
    assert csr.page_size == page
    # the same through an explicit conversion, then a plain flatten
    pages = to_kernel_pages(b.meta.block_table, page)
    again = to_flashinfer_csr(b.meta.seq_lens, pages)
    assert again.kv_indices.tolist() == indices


def test_double_conversion_raises() -> None:
    bt = BlockTable(torch.tensor([[3, 1]], dtype=torch.int32), 16)
    pages = to_kernel_pages(bt, 4)
    assert pages.page_size == 4 and pages.converted_from == 16
    assert pages.table.tolist() == [[12, 13, 14, 15, 4, 5, 6, 7]]
    with pytest.raises(BlockTableAlreadyConvertedError):
        to_kernel_pages(pages, 4)
    with pytest.raises(BlockTableAlreadyConvertedError):
        to_kernel_pages(to_kernel_pages(bt, 16), 16)  # ratio 1 still counts as converted
    with pytest.raises(BlockTableAlreadyConvertedError):
        to_flashinfer_csr(torch.tensor([5], dtype=torch.int32), pages, 2)
    with pytest.raises(ValueError):  # typed error subclasses ValueError
        to_kernel_pages(pages, 2)
    with pytest.raises(PageSizeError):
        to_kernel_pages(bt, 5)


def test_kernel_refuses_table_in_wrong_units(device: torch.device) -> None:
    """A table of 8-token blocks over a cache of 4-token pages must be converted first."""
    kc, vc = kv_caches("NHD", 8, 4, 1, 8, torch.float32, device, strided=False)
    m = build_batch_metadata([0], [6], [[1]], 8, device=device)
    with pytest.raises(PageSizeError):
        gather_kv(kc, vc, m.block_table, m.seq_lens, max_seq_len=6, total_tokens=6)
    pages = to_kernel_pages(m.block_table, 4)
    k, _ = gather_kv(kc, vc, pages, m.seq_lens, max_seq_len=6, total_tokens=6)
    assert k.shape == (6, 1, 8)


# ---------------------------------------------------------------------------------------
# debug mode
# ---------------------------------------------------------------------------------------


def _small(device: torch.device) -> tuple[Any, ...]:
    kc, vc = kv_caches("NHD", 4, 4, 1, 8, torch.float32, device, strided=False)
    m = build_batch_metadata([2], [3], [[1, 3]], 4, device=device)
    kv = torch.randn(m.num_tokens, 1, 8, device=device)
    return kc, vc, m, kv


def test_debug_range_checks_raise(device: torch.device) -> None:
    kc, vc, m, kv = _small(device)
    bad_slots = m.slot_mapping.clone()
    bad_slots[1] = 16  # pool has 4 pages x 4 = 16 slots
    with pytest.raises(KernelIndexError):
        write_kv(kv, kv, kc, vc, bad_slots, debug=True)
    with pytest.raises(IndexError):  # the typed error is also an IndexError
        write_kv(kv, kv, kc, vc, bad_slots, debug=True)
    bad_table = BlockTable(torch.tensor([[1, 4]], dtype=torch.int32, device=device), 4)
    with pytest.raises(KernelIndexError):
        gather_kv(kc, vc, bad_table, m.seq_lens, max_seq_len=5, total_tokens=5, debug=True)
    q = torch.randn(m.num_tokens, 2, 8, device=device)
    with pytest.raises(KernelIndexError):
        prefill_attention(
            q, kc, vc, bad_table, m.query_start_loc, m.seq_lens, max_query_len=3, debug=True
        )
    with pytest.raises(KernelIndexError):  # max_query_len hint too small
        prefill_attention(
            q, kc, vc, m.block_table, m.query_start_loc, m.seq_lens, max_query_len=2, debug=True
        )
    with pytest.raises(KernelIndexError):
        decode_attention(q[:1], kc, vc, bad_table, m.seq_lens, max_seq_len=5, debug=True)
    with pytest.raises(KernelIndexError):
        copy_blocks([kc], torch.tensor([[0, 4]], device=device), debug=True)
    with pytest.raises(KernelIndexError):  # destination also a source: race
        copy_blocks([kc], torch.tensor([[0, 1], [1, 2]], device=device), debug=True)
    state = torch.zeros(4, 3, device=device)
    with pytest.raises(KernelIndexError):
        state_ops.copy_state_slots(
            state, state, plan_state_copy([3], [4], device=device), debug=True
        )
    with pytest.raises(KernelIndexError):  # a run overlapping itself within one tensor
        state_ops.copy_state_slots(
            state, state, plan_state_copy([0, 1], [1, 2], device=device), debug=True
        )
    conv = torch.zeros(2, 3, 2, device=device)
    with pytest.raises(KernelIndexError):
        update_conv_state(
            conv,
            torch.zeros(3, 3, device=device),
            m.query_start_loc,
            torch.tensor([2], device=device),
            debug=True,
        )


@settings(deadline=None, max_examples=examples(20))
@given(data=st.data())
def test_debug_rejects_out_of_pool_index_before_launch(
    device: torch.device, data: st.DataObject
) -> None:
    """Drawn batches (lengths at block boundaries +-1): the valid metadata passes debug mode;
    one index pushed just outside the pool (the first id past the end, or -1 for a page)
    raises ``KernelIndexError`` before anything launches, so the caches and output buffers
    still hold exactly what they held. Table entries no sequence reads are not checked."""
    sz = sizes_for(device)
    b = draw_batch(data, sz, device, min_new=1)
    m = b.meta
    heads, dim = 2, 16
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    kc, vc = kv_caches(
        "NHD",
        b.num_pages,
        b.block_size,
        heads,
        dim,
        torch.float16,
        device,
        strided=data.draw(st.booleans(), label="strided"),
        fill=gen,
    )
    kc0, vc0 = kc.clone(), vc.clone()
    kv = torch.randn(m.num_tokens, heads, dim, generator=gen).half().to(device)
    num_slots = b.num_pages * b.block_size
    lens = [c + q for c, q in zip(b.cached, b.new, strict=True)]
    total = sum(lens)
    out = (
        torch.full((total, heads, dim), SENTINEL, dtype=torch.float16, device=device),
        torch.full((total, heads, dim), SENTINEL, dtype=torch.float16, device=device),
    )

    def unchanged() -> bool:
        return (
            torch.equal(kc, kc0)
            and torch.equal(vc, vc0)
            and bool((out[0] == SENTINEL).all())
            and bool((out[1] == SENTINEL).all())
        )

    # the slot mapping: one slot at or past the end of the pool
    bad_slots = m.slot_mapping.clone()
    t = data.draw(st.integers(0, m.num_tokens - 1), label="bad token")
    bad_slots[t] = num_slots + data.draw(st.integers(0, 2), label="slots past the end")
    with pytest.raises(KernelIndexError, match="outside the pool"):
        write_kv(kv, kv, kc, vc, bad_slots, debug=True)
    assert unchanged()

    # the block table: an entry a sequence reads, outside [0, num_pages)
    seqs = [i for i, n in enumerate(lens) if n > 0]
    i = data.draw(st.sampled_from(seqs), label="bad seq")
    j = data.draw(st.integers(0, len(b.block_ids[i]) - 1), label="bad column")
    table = m.block_table.table.clone()
    table[i, j] = data.draw(st.sampled_from([b.num_pages, b.num_pages + 1, -1]), label="page")
    bad = BlockTable(table, b.block_size)
    with pytest.raises(KernelIndexError, match="outside the pool"):
        gather_kv(kc, vc, bad, m.seq_lens, max_seq_len=m.max_seq_len, out=out, debug=True)
    q = torch.randn(m.num_tokens, 2 * heads, dim, generator=gen).half().to(device)
    with pytest.raises(KernelIndexError):
        prefill_attention(
            q, kc, vc, bad, m.query_start_loc, m.seq_lens, max_query_len=m.max_query_len, debug=True
        )
    with pytest.raises(IndexError):  # the typed error is an IndexError too
        decode_attention(
            q[: m.num_seqs].contiguous(),
            kc,
            vc,
            bad,
            m.seq_lens,
            max_seq_len=m.max_seq_len,
            debug=True,
        )
    assert unchanged()

    # a copy pair with an id at or past the end of the pool
    src, dst = (
        data.draw(st.permutations(range(b.num_pages)), label="pages")[:2]
        if b.num_pages > 1
        else (0, 0)
    )
    pair = [src, b.num_pages] if data.draw(st.booleans(), label="bad dst") else [b.num_pages, dst]
    with pytest.raises(KernelIndexError):
        copy_blocks([kc, vc], torch.tensor([pair], device=device), debug=True)
    assert unchanged()

    # valid metadata passes, even with garbage in table columns no sequence reads
    table = m.block_table.table.clone()
    for i, ids in enumerate(b.block_ids):
        table[i, len(ids) :] = 10**6
    padded = BlockTable(table, b.block_size)
    write_kv(kv, kv, kc, vc, m.slot_mapping, debug=True)
    gather_kv(kc, vc, padded, m.seq_lens, max_seq_len=m.max_seq_len, out=out, debug=True)
    want = R.gather_kv_ref(kc, vc, m.block_table, m.seq_lens)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def test_debug_env_var_enables_checks(device: torch.device) -> None:
    kc, vc, m, kv = _small(device)
    bad = m.slot_mapping.clone()
    bad[0] = 99
    os.environ["PREFIXKV_KERNEL_DEBUG"] = "1"
    try:
        with pytest.raises(KernelIndexError):
            write_kv(kv, kv, kc, vc, bad)
        write_kv(kv, kv, kc, vc, m.slot_mapping)  # valid input passes the checks
    finally:
        del os.environ["PREFIXKV_KERNEL_DEBUG"]


# ---------------------------------------------------------------------------------------
# no host sync in the hot path
# ---------------------------------------------------------------------------------------

_SYNCING = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def _forbid_host_sync() -> Iterator[None]:
    """Make every Tensor -> host conversion raise while the block runs."""
    saved = {name: getattr(torch.Tensor, name) for name in _SYNCING}

    def trap(name: str) -> Callable[..., Any]:
        def raiser(*_a: Any, **_k: Any) -> Any:
            raise AssertionError(f"host sync: Tensor.{name} called in the launch path")

        return raiser

    try:
        for name in _SYNCING:
            setattr(torch.Tensor, name, trap(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


class _Recorder:
    """Stands in for a Triton kernel: records launches instead of running them (the CPU
    interpreter itself reads tensors back, so the real kernels cannot run under the trap)."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*_args: Any, **_kwargs: Any) -> None:
            self.grids.append(grid)

        return launch


def _hot_inputs(device: torch.device) -> dict[str, Any]:
    """Ordinary inputs for every launcher, built (host lists -> device) ahead of time."""
    kc, vc = kv_caches("NHD", 8, 4, 2, 16, torch.float16, device, strided=True)
    m = build_batch_metadata([3, 0], [2, 5], [[0, 1], [2, 3]], 4, device=device)
    return {
        "kc": kc,
        "vc": vc,
        "m": m,
        "kv": torch.randn(m.num_tokens, 2, 16).half().to(device),
        "q": torch.randn(m.num_tokens, 4, 16).half().to(device),
        "state": torch.zeros(6, 4, 3, device=device),
        "plan": plan_state_copy([0, 1, 4], [2, 3, 5], device=device),  # host-side step
        "pairs": torch.tensor([[0, 5]], device=device),
        "conv": torch.zeros(4, 8, 3, device=device),
        "x": torch.zeros(7, 8, device=device),
        "src": torch.tensor([0, -1], device=device),
        "dst": torch.tensor([1, 2], device=device),
    }


def _launch_all(i: dict[str, Any]) -> None:
    """Every launcher with debug off, plus the device-side converters: the hot path."""
    m, kc, vc, q = i["m"], i["kc"], i["vc"], i["q"]
    slots = compute_slot_mapping(m.query_start_loc, m.seq_lens, m.block_table, m.num_tokens)
    write_kv(i["kv"], i["kv"], kc, vc, slots)
    gather_kv(kc, vc, m.block_table, m.seq_lens, max_seq_len=m.max_seq_len, total_tokens=10)
    copy_blocks([kc, vc], i["pairs"])
    prefill_attention(
        q, kc, vc, m.block_table, m.query_start_loc, m.seq_lens, max_query_len=m.max_query_len
    )
    decode_attention(q[:2], kc, vc, m.block_table, m.seq_lens, max_seq_len=m.max_seq_len)
    state_ops.copy_state_slots(i["state"], i["state"], i["plan"])
    update_conv_state(i["conv"], i["x"], m.query_start_loc, i["src"], i["dst"])
    pages = to_kernel_pages(m.block_table, 2)
    to_flashinfer_csr(m.seq_lens, pages, num_total_pages=5)


_KERNELS = (
    (cache_ops, "_write_kv_kernel"),
    (cache_ops, "_gather_kv_kernel"),
    (cache_ops, "_copy_blocks_kernel"),
    (attention, "_prefill_attention_kernel"),
    (attention, "_decode_split_kernel"),
    (attention, "_decode_reduce_kernel"),
    (state_ops, "_copy_slot_runs_kernel"),
    (state_ops, "_conv_state_update_kernel"),
)


def test_no_host_sync_in_launch_path(device: torch.device) -> None:
    inputs = _hot_inputs(device)
    if device.type == "cuda":
        # Real kernels: CUDA reports any synchronising call as an error.
        _launch_all(inputs)  # compile first
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            _launch_all(inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return
    recorders = {name: _Recorder() for _, name in _KERNELS}
    with pytest.MonkeyPatch.context() as mp:
        for module, name in _KERNELS:
            mp.setattr(module, name, recorders[name])
        with _forbid_host_sync():
            _launch_all(inputs)
    for name, rec in recorders.items():
        assert rec.grids, f"{name} was never launched"
        assert all(isinstance(g, int) for grid in rec.grids for g in grid), name


def test_sync_trap_catches_a_sync() -> None:
    """The trap itself works (otherwise the test above could pass vacuously)."""
    t = torch.ones(2)
    with _forbid_host_sync(), pytest.raises(AssertionError, match="host sync"):
        t.sum().item()
    with _forbid_host_sync(), pytest.raises(AssertionError, match="host sync"):
        to_flashinfer_csr(
            torch.tensor([3], dtype=torch.int32),
            BlockTable(torch.zeros(1, 1, dtype=torch.int32), 4),
        )  # no hint


def test_gpu_sizes_are_selected_by_device(device: torch.device) -> None:
    assert sizes_for(device).max_new == (600 if device.type == "cuda" else CPU_SIZES.max_new)
