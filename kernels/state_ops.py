# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
# NOTE: Triton JIT kernels are untyped by nature (pointers and constexprs that only the
# Triton compiler understands); the launchers around them are typed.
"""Recurrent-state kernels: checkpoint save/restore by slot, and the causal-conv state update.

A hybrid model keeps, per sequence, a recurrent state in a slot of a state tensor
``[num_slots, ...]``. Prefix caching saves that state into a checkpoint slot at a block
boundary and restores it on a hit. Both are slot-to-slot copies, planned on the host:

* :func:`plan_state_copy` turns the slot lists the cache manager holds into *runs* of
  consecutive slots (``src, src+1, ...`` -> ``dst, dst+1, ...``). Coalescing is a
  host-side metadata step on Python lists, done when the step is scheduled, ahead of the
  hot path; the launch then reads only the plan's small tensors and never syncs.
* :func:`copy_state_slots` copies the runs, one program row per run, so a long run of
  neighbouring slots becomes one large streaming copy instead of many small ones.

:func:`update_conv_state` is the causal-conv state gather: the conv state
``[num_slots, dim, width - 1]`` keeps the last ``width - 1`` inputs of each sequence, and a
prefill of ``L`` tokens replaces it with the tail of ``concat(old_state, inputs)``; for
``L < width - 1`` the old state's tail shifts left and the ``L`` inputs are appended
(:func:`index_math.conv_state_source`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import torch
import triton
import triton.language as tl

from . import _common as C
from . import debug as D
from . import index_math
from .errors import KernelIndexError, KernelInputError

# ---------------------------------------------------------------------------------------
# (d) slot-run copies: checkpoint save and restore
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateCopyPlan:
    """Runs of consecutive slots to copy: ``dst[d0 + i] <- src[s0 + i]`` for ``i < n``."""

    src_starts: torch.Tensor  # int64 [num_runs]
    dst_starts: torch.Tensor  # int64 [num_runs]
    run_lens: torch.Tensor  # int64 [num_runs]
    runs: tuple[tuple[int, int, int], ...]  # the same runs as host ints (src, dst, n)
    max_run_len: int

    @property
    def num_runs(self) -> int:
        return len(self.runs)

    @property
    def num_slots(self) -> int:
        return sum(n for _, _, n in self.runs)


def coalesce_slot_runs(
    src_slots: Sequence[int], dst_slots: Sequence[int]
) -> list[tuple[int, int, int]]:
    """Group ``(src, dst)`` slot pairs into maximal runs ``(src0, dst0, length)``.

    Pairs are sorted by destination, then a pair extends the current run when both its
    source and destination follow the run's last ones by one. Destinations must be unique
    (two copies into one slot would race) and all slots non-negative.
    """
    if len(src_slots) != len(dst_slots):
        raise KernelInputError("src_slots and dst_slots must have equal lengths")
    pairs = sorted(
        zip((int(s) for s in src_slots), (int(d) for d in dst_slots), strict=True),
        key=lambda p: p[1],
    )
    runs: list[tuple[int, int, int]] = []
    for s, d in pairs:
        if s < 0 or d < 0:
            raise KernelIndexError(f"negative slot in state copy pair ({s} -> {d})")
        if runs:
            s0, d0, n = runs[-1]
            if d == d0 + n - 1:
                raise KernelIndexError(f"slot {d} is the destination of two copies (race)")
            if s == s0 + n and d == d0 + n:
                runs[-1] = (s0, d0, n + 1)
                continue
        runs.append((s, d, 1))
    return runs


def plan_state_copy(
    src_slots: Sequence[int], dst_slots: Sequence[int], *, device: torch.device | str = "cpu"
) -> StateCopyPlan:
    """Host-side plan for copying state slot ``src_slots[i]`` to ``dst_slots[i]``."""
    runs = coalesce_slot_runs(src_slots, dst_slots)

    def col(i: int) -> torch.Tensor:
        return torch.tensor([r[i] for r in runs], dtype=torch.int64, device=device)

    return StateCopyPlan(
        col(0), col(1), col(2), tuple(runs), max((n for _, _, n in runs), default=0)
    )


@triton.jit
def _copy_slot_runs_kernel(
    src_ptr,  # [num_src_slots, slot_numel] (inner dims flattened, contiguous per slot)
    dst_ptr,  # [num_dst_slots, slot_numel]
    src_starts_ptr,  # int64 [num_runs]
    dst_starts_ptr,  # int64 [num_runs]
    run_lens_ptr,  # int64 [num_runs]
    stride_src_slot,
    stride_dst_slot,
    slot_numel,
    NUM_TILE_PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    run = tl.program_id(0)
    first_tile = tl.program_id(1)
    src0 = tl.load(src_starts_ptr + run)
    dst0 = tl.load(dst_starts_ptr + run)
    n_elems = tl.load(run_lens_ptr + run) * slot_numel
    offs = tl.arange(0, BLOCK)
    # Grid-stride loop over the run's tiles: the grid is fixed by the longest run, a short
    # run's surplus programs fall through the loop at once.
    num_tiles = tl.cdiv(n_elems, BLOCK).to(tl.int32)
    for tile in range(first_tile, num_tiles, NUM_TILE_PROGRAMS):
        e = tl.cast(tile, tl.int64) * BLOCK + offs
        mask = e < n_elems
        # index_math.run_element
        slot_off = e // slot_numel
        inner = e % slot_numel
        x = tl.load(src_ptr + (src0 + slot_off) * stride_src_slot + inner, mask=mask)
        tl.store(
            dst_ptr + (dst0 + slot_off) * stride_dst_slot + inner,
            x.to(dst_ptr.dtype.element_ty),
            mask=mask,
        )


def _slot_view_stride(t: torch.Tensor, name: str) -> tuple[int, int]:
    """(slot stride, slot numel); the dims after the first must be contiguous."""
    if t.dim() < 1:
        raise KernelInputError(f"{name} must be [num_slots, ...]")
    inner = t.shape[1:]
    expect = 1
    for size, stride in zip(reversed(inner), reversed(t.stride()[1:]), strict=True):
        if size != 1 and stride != expect:
            raise KernelInputError(f"{name}: dims after the slot dim must be contiguous")
        expect *= size
    return t.stride(0), prod(inner)


def copy_state_slots(
    src_state: torch.Tensor,
    dst_state: torch.Tensor,
    plan: StateCopyPlan,
    *,
    debug: bool | None = None,
) -> None:
    """Copy slots of ``src_state`` into slots of ``dst_state`` as ``plan`` says.

    Save a checkpoint with ``src_state=state, dst_state=checkpoints`` and restore with the
    two swapped; they may be the same tensor if the runs do not overlap. Shapes past the
    slot dimension must match. In place, no sync.
    """
    C.check_dtype(src_state, "src_state")
    C.check_dtype(dst_state, "dst_state")
    if src_state.shape[1:] != dst_state.shape[1:]:
        raise KernelInputError(
            f"state shapes differ past the slot dim: {tuple(src_state.shape)} vs "
            f"{tuple(dst_state.shape)}"
        )
    s_stride, numel = _slot_view_stride(src_state, "src_state")
    d_stride, _ = _slot_view_stride(dst_state, "dst_state")
    C.check_device(src_state, dst_state, plan.src_starts, plan.dst_starts, plan.run_lens)
    if C.debug_enabled(debug):
        src_runs = [(s, n) for s, _, n in plan.runs]
        dst_runs = [(d, n) for _, d, n in plan.runs]
        D.check_slots(src_runs, src_state.shape[0], "source")
        D.check_slots(dst_runs, dst_state.shape[0], "destination")
        if src_state.untyped_storage().data_ptr() == dst_state.untyped_storage().data_ptr():
            D.check_disjoint(src_runs, dst_runs, "state copy within one tensor")
    if plan.num_runs == 0 or numel == 0:
        return
    block = 1024 if not C.interpreting() else 256
    tiles = C.cdiv(plan.max_run_len * numel, block)
    programs = max(1, min(tiles, 1024))
    _copy_slot_runs_kernel[(plan.num_runs, programs)](
        src_state,
        dst_state,
        plan.src_starts,
        plan.dst_starts,
        plan.run_lens,
        s_stride,
        d_stride,
        numel,
        NUM_TILE_PROGRAMS=programs,
        BLOCK=block,
        num_warps=4,
    )


def save_state_checkpoints(
    state: torch.Tensor,
    checkpoints: torch.Tensor,
    state_slots: Sequence[int],
    checkpoint_slots: Sequence[int],
    *,
    debug: bool | None = None,
) -> StateCopyPlan:
    """Copy ``state[state_slots[i]]`` into ``checkpoints[checkpoint_slots[i]]``.

    Builds the plan from the host lists (the coalescing step) and returns it."""
    plan = plan_state_copy(state_slots, checkpoint_slots, device=state.device)
    copy_state_slots(state, checkpoints, plan, debug=debug)
    return plan


def restore_state_checkpoints(
    checkpoints: torch.Tensor,
    state: torch.Tensor,
    checkpoint_slots: Sequence[int],
    state_slots: Sequence[int],
    *,
    debug: bool | None = None,
) -> StateCopyPlan:
    """Copy ``checkpoints[checkpoint_slots[i]]`` into ``state[state_slots[i]]``."""
    plan = plan_state_copy(checkpoint_slots, state_slots, device=state.device)
    copy_state_slots(checkpoints, state, plan, debug=debug)
    return plan


# ---------------------------------------------------------------------------------------
# (d') causal-conv state update
# ---------------------------------------------------------------------------------------


@triton.jit
def _conv_state_update_kernel(
    src_state_ptr,  # [num_src_slots, dim, KEEP]: states before the step
    dst_state_ptr,  # [num_dst_slots, dim, KEEP]: states after the step (may alias src)
    x_ptr,  # [num_tokens, dim]: conv inputs of the new tokens, varlen
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    src_slots_ptr,  # int32/int64 [num_seqs]; negative = no initial state (zeros)
    dst_slots_ptr,  # int32/int64 [num_seqs]; negative = skip the sequence
    stride_src_slot,
    stride_src_dim,
    stride_src_k,
    stride_dst_slot,
    stride_dst_dim,
    stride_dst_k,
    stride_x_tok,
    stride_x_dim,
    dim,
    KEEP: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    seq = tl.program_id(0)
    ch_block = tl.program_id(1)
    dst_slot = tl.load(dst_slots_ptr + seq).to(tl.int64)
    if dst_slot < 0:
        return
    src_slot = tl.load(src_slots_ptr + seq).to(tl.int64)
    q_start = tl.load(query_start_loc_ptr + seq)
    new_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    ch = ch_block * BLOCK_C + tl.arange(0, BLOCK_C)
    j = tl.arange(0, BLOCK_K)
    ch_ok = ch < dim
    j_ok = j < KEEP
    # index_math.conv_state_source
    c = new_len + j
    from_old = c < KEEP
    old_idx = tl.where(from_old, c, 0)
    new_idx = tl.where(from_old, 0, c - KEEP)
    m_old = ch_ok[:, None] & (j_ok & from_old & (src_slot >= 0))[None, :]
    m_new = ch_ok[:, None] & (j_ok & (c >= KEEP))[None, :]
    safe_src = tl.maximum(src_slot, 0)
    old = tl.load(
        src_state_ptr
        + safe_src * stride_src_slot
        + ch[:, None] * stride_src_dim
        + old_idx[None, :] * stride_src_k,
        mask=m_old,
        other=0.0,
    )
    new = tl.load(
        x_ptr
        + (q_start + new_idx[None, :]).to(tl.int64) * stride_x_tok
        + ch[:, None] * stride_x_dim,
        mask=m_new,
        other=0.0,
    )
    out = tl.where(from_old[None, :], old.to(tl.float32), new.to(tl.float32))
    # The whole tile is loaded before it is stored, so an in-place update (src == dst
    # slot) is safe: programs own disjoint channels.
    tl.store(
        dst_state_ptr
        + dst_slot * stride_dst_slot
        + ch[:, None] * stride_dst_dim
        + j[None, :] * stride_dst_k,
        out.to(dst_state_ptr.dtype.element_ty),
        mask=ch_ok[:, None] & j_ok[None, :],
    )


def update_conv_state(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    query_start_loc: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor | None = None,
    *,
    out_state: torch.Tensor | None = None,
    debug: bool | None = None,
) -> None:
    """Update causal-conv states from the new inputs of a varlen batch.

    ``conv_state`` is ``[num_slots, dim, width - 1]``; ``x`` is ``[num_tokens, dim]`` with
    sequence ``i`` in rows ``query_start_loc[i]:query_start_loc[i+1]``. The state of
    sequence ``i`` is read from slot ``src_slots[i]`` (negative: no initial state, zeros)
    and written to slot ``dst_slots[i]`` of ``out_state`` (defaults: the same slot, the
    same tensor; negative: skip). Reading a checkpoint slot and writing the running slot
    restores and advances in one pass. Correct for any length, including 0 and lengths
    shorter than the window. No sync.
    """
    if dst_slots is None:
        dst_slots = src_slots
    if out_state is None:
        out_state = conv_state
    for name, t in (("conv_state", conv_state), ("out_state", out_state), ("x", x)):
        C.check_dtype(t, name)
    if conv_state.dim() != 3 or out_state.shape[1:] != conv_state.shape[1:]:
        raise KernelInputError("conv states must be [num_slots, dim, width - 1] and agree")
    _, dim, keep = conv_state.shape
    if x.dim() != 2 or x.shape[1] != dim:
        raise KernelInputError(f"x must be [num_tokens, {dim}], got {tuple(x.shape)}")
    index_math.check_size("conv_width", keep + 1)
    C.check_index_tensor(query_start_loc, "query_start_loc", 1, (torch.int32,))
    C.check_index_tensor(src_slots, "src_slots", 1)
    C.check_index_tensor(dst_slots, "dst_slots", 1)
    num_seqs = int(src_slots.shape[0])
    if dst_slots.shape[0] != num_seqs or query_start_loc.shape[0] != num_seqs + 1:
        raise KernelInputError("query_start_loc, src_slots and dst_slots disagree on num_seqs")
    C.check_device(conv_state, out_state, x, query_start_loc, src_slots, dst_slots)
    if C.debug_enabled(debug):
        srcs, dsts = D._host(src_slots), D._host(dst_slots)
        D.check_slots([(s, 1) for s in srcs if s >= 0], conv_state.shape[0], "conv source")
        D.check_slots([(d, 1) for d in dsts if d >= 0], out_state.shape[0], "conv destination")
        live = [(s, d) for s, d in zip(srcs, dsts, strict=True) if d >= 0]
        if len({d for _, d in live}) != len(live):
            raise KernelIndexError("two sequences write the same conv-state slot (race)")
        if out_state.untyped_storage().data_ptr() == conv_state.untyped_storage().data_ptr():
            for i, (s, _) in enumerate(live):
                if any(s == d for k, (_, d) in enumerate(live) if k != i):
                    raise KernelIndexError(
                        f"conv slot {s} is read by one sequence and written by another (race)"
                    )
        qsl = D._host(query_start_loc)
        if qsl[0] != 0 or any(b < a for a, b in itertools.pairwise(qsl)) or qsl[-1] > x.shape[0]:
            raise KernelIndexError("query_start_loc must rise from 0 to at most num_tokens")
    if num_seqs == 0 or dim == 0:
        return
    block_k = C.next_pow2(keep)
    block_c = min(C.next_pow2(dim), max(1, 2048 // block_k), 64 if C.interpreting() else 256)
    _conv_state_update_kernel[(num_seqs, C.cdiv(dim, block_c))](
        conv_state,
        out_state,
        x,
        query_start_loc,
        src_slots,
        dst_slots,
        *conv_state.stride(),
        *out_state.stride(),
        *x.stride(),
        dim,
        KEEP=keep,
        BLOCK_C=block_c,
        BLOCK_K=block_k,
        num_warps=4,
    )
