"""Recurrent-state kernels: slot-run copies (checkpoint save/restore) and conv-state update."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_testlib import SENTINEL, examples, make_gen, randn, sizes_for
from prefixkv.kernels import (
    KernelIndexError,
    copy_state_slots,
    plan_state_copy,
    restore_state_checkpoints,
    save_state_checkpoints,
    update_conv_state,
)
from prefixkv.kernels import reference as R
from prefixkv.kernels.state_ops import coalesce_slot_runs


def test_coalescing_by_hand() -> None:
    assert coalesce_slot_runs([4, 5, 6, 9], [0, 1, 2, 3]) == [(4, 0, 3), (9, 3, 1)]
    # order of the pairs does not matter: sorted by destination first
    assert coalesce_slot_runs([6, 4, 5], [2, 0, 1]) == [(4, 0, 3)]
    assert coalesce_slot_runs([1, 2], [5, 7]) == [(1, 5, 1), (2, 7, 1)]
    assert coalesce_slot_runs([], []) == []
    with pytest.raises(KernelIndexError):
        coalesce_slot_runs([1, 2], [3, 3])
    with pytest.raises(KernelIndexError):
        coalesce_slot_runs([-1], [3])


@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=20, unique_by=lambda p: p[1]
    )
)
def test_coalescing_covers_exactly_the_pairs(pairs: list[tuple[int, int]]) -> None:
    runs = coalesce_slot_runs([s for s, _ in pairs], [d for _, d in pairs])
    expanded = {(s + i, d + i) for s, d, n in runs for i in range(n)}
    assert expanded == set(pairs)
    assert sum(n for _, _, n in runs) == len(pairs)
    # maximal: no two runs could be joined
    ends = {(s + n, d + n) for s, d, n in runs}
    assert not any((s, d) in ends for s, d, _ in runs)


def _state(
    gen: torch.Generator,
    slots: int,
    inner: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    strided: bool,
) -> torch.Tensor:
    """A state tensor; ``strided`` makes it one half of a ``[slots, 2, ...]`` allocation."""
    if strided:
        return randn(gen, (slots, 2, *inner), dtype, device)[:, 1]
    return randn(gen, (slots, *inner), dtype, device)


@settings(deadline=None, max_examples=examples(20))
@given(data=st.data())
def test_copy_state_slots_exact_with_canaries(device: torch.device, data: st.DataObject) -> None:
    sz = sizes_for(device)
    numel = data.draw(st.sampled_from(sz.state_numel), label="slot numel")
    inner = (numel,) if numel % 2 else (2, numel // 2)
    slots = data.draw(st.integers(1, 24), label="slots")
    dtype = data.draw(st.sampled_from((torch.float32, torch.float16, torch.bfloat16)))
    gen = make_gen(data)
    src = _state(gen, slots, inner, dtype, device, data.draw(st.booleans(), label="strided"))
    dst = torch.full((slots + 3, *inner), SENTINEL, dtype=dtype, device=device)
    n = data.draw(st.integers(0, slots), label="copies")
    rnd = data.draw(st.randoms(use_true_random=False))
    if data.draw(st.booleans(), label="consecutive"):
        s0, d0 = rnd.randrange(slots - n + 1), rnd.randrange(slots + 3 - n + 1)
        src_slots, dst_slots = list(range(s0, s0 + n)), list(range(d0, d0 + n))
    else:
        src_slots, dst_slots = rnd.sample(range(slots), n), rnd.sample(range(slots + 3), n)
    plan = plan_state_copy(src_slots, dst_slots, device=device)
    src0 = src.clone()
    want = R.copy_state_ref(src, dst, src_slots, dst_slots)
    copy_state_slots(src, dst, plan, debug=data.draw(st.booleans()))
    assert torch.equal(dst, want)  # untouched destination slots keep the sentinel
    assert torch.equal(src, src0)


def test_save_then_restore_roundtrip(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(5)
    state = randn(gen, (6, 3, 5), torch.float16, device)
    ckpt = torch.full((8, 3, 5), SENTINEL, dtype=torch.float16, device=device)
    plan = save_state_checkpoints(state, ckpt, [1, 2, 3, 5], [4, 5, 6, 0], debug=True)
    assert plan.num_runs == 2 and plan.num_slots == 4
    assert torch.equal(ckpt[4:7], state[1:4]) and torch.equal(ckpt[0], state[5])
    assert bool((ckpt[[1, 2, 3, 7]] == SENTINEL).all())
    fresh = torch.zeros_like(state)
    restore_state_checkpoints(ckpt, fresh, [4, 5, 6, 0], [1, 2, 3, 5], debug=True)
    assert torch.equal(fresh[[1, 2, 3, 5]], state[[1, 2, 3, 5]])
    assert not fresh[[0, 4]].any()


@settings(deadline=None, max_examples=examples(25))
@given(data=st.data())
def test_conv_state_update_matches_reference(device: torch.device, data: st.DataObject) -> None:
    """Lengths 0, shorter than the window, equal and longer; fresh sequences; restore from
    a checkpoint slot into a running slot; skipped sequences keep their state."""
    sz = sizes_for(device)
    width = data.draw(st.integers(2, 6), label="conv width")
    dim = data.draw(st.sampled_from(sz.conv_dims), label="dim")
    num_slots = data.draw(st.integers(1, 8), label="slots")
    seqs = data.draw(st.integers(1, num_slots), label="seqs")
    dtype = data.draw(st.sampled_from((torch.float32, torch.float16)), label="dtype")
    lens = [data.draw(st.integers(0, 2 * width), label="len") for _ in range(seqs)]
    gen = make_gen(data)
    rnd = data.draw(st.randoms(use_true_random=False))
    separate = data.draw(st.booleans(), label="separate output tensor")
    dst = rnd.sample(range(num_slots), seqs)
    if separate:  # restore-and-advance: read any checkpoint slot, write the running slot
        src = [rnd.randrange(num_slots) if rnd.random() < 0.8 else -1 for _ in range(seqs)]
    else:  # in place: each sequence reads its own slot (or starts from zeros)
        src = [d if rnd.random() < 0.8 else -1 for d in dst]
    dst = [d if rnd.random() < 0.9 else -1 for d in dst]  # some sequences skipped
    conv = randn(gen, (num_slots, dim, width - 1), dtype, device)
    out = torch.full_like(conv, SENTINEL) if separate else None
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    x = randn(gen, (qsl[-1] + 1, 2 * dim), dtype, device)[:, ::2]  # strided input view
    qsl_t = torch.tensor(qsl, dtype=torch.int32, device=device)
    src_t = torch.tensor(src, dtype=torch.int64, device=device)
    dst_t = torch.tensor(dst, dtype=torch.int32, device=device)
    want = R.update_conv_state_ref(conv, x, qsl_t, src_t, dst_t, out)
    update_conv_state(conv, x, qsl_t, src_t, dst_t, out_state=out, debug=data.draw(st.booleans()))
    assert torch.equal(conv if out is None else out, want)


def test_conv_state_short_prefill_by_hand(device: torch.device) -> None:
    """width 4 keeps 3 inputs; a prefill of 1 token shifts the old state left by one."""
    conv = torch.tensor([[[1.0, 2.0, 3.0]]], device=device)  # [slots=1, dim=1, 3]
    x = torch.tensor([[9.0]], device=device)
    slots = torch.tensor([0], device=device)
    update_conv_state(conv, x, torch.tensor([0, 1], dtype=torch.int32, device=device), slots)
    assert conv.flatten().tolist() == [2.0, 3.0, 9.0]
    update_conv_state(
        conv,
        torch.zeros(0, 1, device=device),
        torch.tensor([0, 0], dtype=torch.int32, device=device),
        slots,
    )
    assert conv.flatten().tolist() == [2.0, 3.0, 9.0]  # no new tokens: unchanged
    x5 = torch.arange(5.0, device=device).reshape(5, 1)
    update_conv_state(conv, x5, torch.tensor([0, 5], dtype=torch.int32, device=device), slots)
    assert conv.flatten().tolist() == [2.0, 3.0, 4.0]
