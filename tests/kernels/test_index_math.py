"""index_math: the formulas on ints, against tensors and on Z3 bit-vectors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from prefixkv.kernels import index_math as im
from prefixkv.kernels.metadata import TORCH_OPS


def test_module_imports_nothing_heavy() -> None:
    code = (
        "import sys; import prefixkv.kernels.index_math as m; "
        "heavy = [n for n in ('torch', 'triton', 'z3', 'numpy') if n in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@given(
    st.integers(1, 64),
    st.integers(0, 2000),
    st.lists(st.integers(0, 10**6), min_size=40, max_size=40),
)
def test_slot_roundtrip(block_size: int, pos: int, table: list[int]) -> None:
    pos %= block_size * len(table)
    slot = im.slot_for_position(pos, table.__getitem__, block_size)
    page, off = im.split_slot(slot, block_size)
    assert page == table[pos // block_size] and off == pos % block_size


@given(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([1, 2, 4]),
    st.integers(0, 300),
    st.lists(st.integers(0, 1000), min_size=20, max_size=20),
)
def test_slots_invariant_under_page_conversion(
    page_size: int, ratio: int, pos: int, table: list[int]
) -> None:
    """Slot of a position is the same through block units or kernel-page units."""
    block_size = page_size * ratio
    pos %= block_size * len(table)
    pages = [im.page_table_entry(k, table.__getitem__, ratio) for k in range(len(table) * ratio)]
    assert im.slot_for_position(pos, table.__getitem__, block_size) == im.slot_for_position(
        pos, pages.__getitem__, page_size
    )


def test_page_ratio_rejects_non_divisor() -> None:
    with pytest.raises(ValueError):
        im.page_ratio(16, 3)
    assert im.page_ratio(16, 4) == 4


@pytest.mark.parametrize("width", [2, 3, 4, 5, 8])
def test_conv_state_source_matches_concat_tail(width: int) -> None:
    """Exhaustive over small lengths: the index function equals 'tail of concat'."""
    keep = width - 1
    old = [f"o{i}" for i in range(keep)]
    for new_len in range(0, 2 * width + 2):
        new = [f"x{i}" for i in range(new_len)]
        expect = (old + new)[len(old + new) - keep :]
        got = []
        for j in range(keep):
            from_old, oi, ni = im.conv_state_source(j, new_len, width)
            assert 0 <= oi < keep and (from_old or 0 <= ni < new_len)
            got.append(old[oi] if from_old else new[ni])
        assert got == expect, (width, new_len)


def test_last_page_len_and_num_pages() -> None:
    assert [im.num_pages(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert [im.last_page_len(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 4, 1, 4]


def test_torch_ops_agree_with_python_ops() -> None:
    n = torch.arange(0, 50, dtype=torch.int32)
    assert im.last_page_len(n, 16, TORCH_OPS).tolist() == [
        im.last_page_len(i, 16) for i in range(50)
    ]
    assert im.num_pages(n, 16, TORCH_OPS).tolist() == [im.num_pages(i, 16) for i in range(50)]


def test_layout_strides_and_offsets() -> None:
    nhd = torch.empty(5, 4, 3, 8)
    hnd = torch.empty(5, 3, 4, 8)
    cases: tuple[tuple[torch.Tensor, im.Layout], ...] = ((nhd, "NHD"), (hnd, "HND"))
    for t, layout in cases:
        st4 = im.cache_strides(t.stride(), layout)
        assert im.cache_dims(t.shape, layout) == (5, 4, 3, 8)
        flat = t.reshape(-1)
        flat.copy_(torch.arange(flat.numel(), dtype=flat.dtype))
        idx = (2, 3, 1, 5)
        view = t if layout == "NHD" else t.transpose(1, 2)
        assert int(view[idx]) == im.cache_element_offset(*idx, st4)
    with pytest.raises(ValueError):
        im.cache_strides((1, 2, 3, 4), "NDH")  # type: ignore[arg-type]


def test_offsets_fit_int32() -> None:
    assert im.offsets_fit_int32(((1024, 16, 8, 128), (16384, 1024, 128, 1)))
    big = (2**22, 16, 8, 128)
    assert not im.offsets_fit_int32((big, (16384, 1024, 128, 1)))
    assert im.max_element_offset((0, 4), (4, 1)) == 0
    # boundary: exactly INT32_MAX elements addressable
    assert im.offsets_fit_int32(((im.INT32_MAX,), (1,)))
    assert not im.offsets_fit_int32(((im.INT32_MAX + 1,), (1,)))


def test_supported_ranges_keep_slots_in_int32() -> None:
    r = im.SUPPORTED_RANGES
    assert r["num_blocks"].high * r["block_size"].high <= 2**31
    im.check_size("head_dim", 128)
    with pytest.raises(ValueError):
        im.check_size("head_dim", 512)


@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_z3_slot_in_range_and_no_int32_overflow(block_size: int) -> None:
    """The same function, on 32-bit vectors: with sizes in SUPPORTED_RANGES a slot never
    overflows int32 and stays below num_blocks * block_size. Block size is concrete here so
    the query stays linear and fast; the proofs layer does the general case."""
    z3 = pytest.importorskip("z3")
    pos, blk, nb = z3.BitVecs("pos blk nb", 32)
    ops = im.z3_ops()
    r = im.SUPPORTED_RANGES
    slot = im.slot_for_position(pos, lambda _i: blk, block_size, ops)
    s = z3.Solver()
    s.add(
        z3.ULE(1, nb),
        z3.ULE(nb, r["num_blocks"].high),
        z3.ULT(blk, nb),
        z3.ULT(pos, r["max_seq_len"].high),
    )
    s.add(z3.Not(z3.And(z3.ULT(slot, nb * block_size), z3.ULT(slot, 2**31))))
    assert s.check() == z3.unsat


def test_z3_conv_state_source_in_bounds() -> None:
    z3 = pytest.importorskip("z3")
    j, n, w = z3.BitVecs("j n w", 32)
    ops = im.z3_ops()
    from_old, oi, ni = im.conv_state_source(j, n, w, ops)
    s = z3.Solver()
    s.add(z3.ULE(2, w), z3.ULE(w, 16), z3.ULT(j, w - 1), z3.ULE(n, 2**22))
    s.add(z3.Not(z3.And(z3.ULT(oi, w - 1), z3.Implies(z3.Not(from_old), z3.ULT(ni, n)))))
    assert s.check() == z3.unsat
