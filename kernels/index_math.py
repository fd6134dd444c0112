"""Index arithmetic of the kernel layer, written once for ints, tensors and Z3 bit-vectors.

Every address the kernels touch is a small integer formula: a token position becomes a
cache slot, a slot becomes a (page, offset) pair, a pair becomes an element offset through
the tensor's strides. This module holds those formulas so that three consumers evaluate
the *same* code:

* the torch references and the host-side metadata builders, on Python ints or on integer
  tensors (``prefixkv.kernels.metadata.TORCH_OPS``);
* the launchers, which decide between int32 and int64 offset math with
  :func:`offsets_fit_int32`;
* the proofs layer, which evaluates the functions on Z3 bit-vector expressions and proves
  that indices stay in range and int32 never overflows for the sizes in
  :data:`SUPPORTED_RANGES`.

To make the last point possible the functions use only ``+``, ``-`` and ``*`` directly
(which ints, tensors and bit-vectors all overload) and route floor division, modulo,
comparisons and selection through an ``ops`` object (:class:`IndexOps`). Python ints use
:data:`PY_OPS`; :func:`z3_ops` builds the bit-vector version. Nothing heavy is imported
here: no torch, no triton, and z3 only inside :func:`z3_ops`.

The Triton kernels cannot call Python functions, so each kernel repeats the formula it
needs inline, next to a comment naming the function here. The kernel tests compare every
kernel against a reference that calls these functions, which pins the two together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Layout = Literal["NHD", "HND"]

INT32_MAX = 2**31 - 1
"""Largest offset int32 pointer arithmetic can hold."""


class IndexOps(Protocol):
    """The operations the index functions need beyond ``+ - *``.

    Every operand the kernels see is non-negative when the function is called on valid
    inputs, so floor and truncating division agree; an implementation may use either.
    """

    def div(self, a: Any, b: Any) -> Any:
        """Floor division ``a // b``."""
        ...

    def mod(self, a: Any, b: Any) -> Any:
        """Remainder ``a % b`` matching :meth:`div`."""
        ...

    def lt(self, a: Any, b: Any) -> Any:
        """``a < b`` as the backend's boolean."""
        ...

    def ite(self, cond: Any, a: Any, b: Any) -> Any:
        """``a if cond else b``."""
        ...


@dataclass(frozen=True)
class _PyOps:
    """Plain Python integer semantics."""

    def div(self, a: Any, b: Any) -> Any:
        return a // b

    def mod(self, a: Any, b: Any) -> Any:
        return a % b

    def lt(self, a: Any, b: Any) -> Any:
        return a < b

    def ite(self, cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b


PY_OPS: IndexOps = _PyOps()
"""Ops for Python ints."""


@dataclass(frozen=True)
class _Z3Ops:
    """Bit-vector semantics; unsigned, because every index the kernels use is >= 0."""

    z3: Any

    def div(self, a: Any, b: Any) -> Any:
        return self.z3.UDiv(a, b)

    def mod(self, a: Any, b: Any) -> Any:
        return self.z3.URem(a, b)

    def lt(self, a: Any, b: Any) -> Any:
        return self.z3.ULT(a, b)

    def ite(self, cond: Any, a: Any, b: Any) -> Any:
        return self.z3.If(cond, a, b)


def z3_ops() -> IndexOps:
    """Ops over Z3 bit-vectors (unsigned division, remainder and comparison).

    z3 is imported here, not at module top, so the module stays importable without it.
    """
    import z3  # optional dependency: only the proofs need it

    return _Z3Ops(z3)


# ---------------------------------------------------------------------------------------
# Positions, blocks and slots
# ---------------------------------------------------------------------------------------


def ceil_div(a: Any, b: Any, ops: IndexOps = PY_OPS) -> Any:
    """``ceil(a / b)`` for ``a >= 0, b > 0``."""
    return ops.div(a + b - 1, b)


def block_index(pos: Any, block_size: Any, ops: IndexOps = PY_OPS) -> Any:
    """Which entry of a sequence's block table holds token position ``pos``."""
    return ops.div(pos, block_size)


def offset_in_block(pos: Any, block_size: Any, ops: IndexOps = PY_OPS) -> Any:
    """Where inside its block token position ``pos`` sits."""
    return ops.mod(pos, block_size)


def slot_from_block(block_id: Any, offset: Any, block_size: Any) -> Any:
    """Flat cache slot of ``offset`` inside block ``block_id``: ``block_id * bs + offset``."""
    return block_id * block_size + offset


def slot_for_position(
    pos: Any, lookup: Callable[[Any], Any], block_size: Any, ops: IndexOps = PY_OPS
) -> Any:
    """Slot of token position ``pos`` of one sequence.

    ``slot = block_table[pos // block_size] * block_size + pos % block_size``;
    ``lookup(i)`` returns ``block_table[i]`` of that sequence (a list index, a tensor
    gather or a Z3 array select).
    """
    return slot_from_block(
        lookup(block_index(pos, block_size, ops)),
        offset_in_block(pos, block_size, ops),
        block_size,
    )


def split_slot(slot: Any, page_size: Any, ops: IndexOps = PY_OPS) -> tuple[Any, Any]:
    """Inverse of :func:`slot_from_block`: ``(slot // page_size, slot % page_size)``.

    Slots are the same number in cache-block units and in kernel-page units (see
    :func:`page_of_block`), so ``page_size`` may be either.
    """
    return ops.div(slot, page_size), ops.mod(slot, page_size)


# ---------------------------------------------------------------------------------------
# Cache blocks -> kernel pages (page-size ratio)
# ---------------------------------------------------------------------------------------


def page_ratio(block_size: int, page_size: int) -> int:
    """How many kernel pages one cache block holds. ``page_size`` must divide ``block_size``.

    Host-only (Python ints): the ratio is a launch-time constant, never a traced value.
    """
    if page_size <= 0 or block_size <= 0 or block_size % page_size != 0:
        raise ValueError(
            f"kernel page size {page_size} must be positive and divide block size {block_size}"
        )
    return block_size // page_size


def page_of_block(block_id: Any, sub_page: Any, ratio: Any) -> Any:
    """Kernel page id of sub-page ``sub_page`` (``0 <= sub_page < ratio``) of a cache block.

    The cache tensor of ``num_blocks`` blocks of ``block_size`` tokens is the same memory
    as ``num_blocks * ratio`` pages of ``block_size // ratio`` tokens (NHD, contiguous per
    block), and ``page * page_size + off == block * block_size + sub_page * page_size + off``:
    slots do not change under conversion, only block-table entries do.
    """
    return block_id * ratio + sub_page


def page_table_entry(
    logical_page: Any, lookup: Callable[[Any], Any], ratio: Any, ops: IndexOps = PY_OPS
) -> Any:
    """Entry ``logical_page`` of a sequence's table in kernel pages, from its block table."""
    return page_of_block(lookup(ops.div(logical_page, ratio)), ops.mod(logical_page, ratio), ratio)


def num_pages(seq_len: Any, page_size: Any, ops: IndexOps = PY_OPS) -> Any:
    """Pages a sequence of ``seq_len`` tokens occupies (``kv_indptr`` increments)."""
    return ceil_div(seq_len, page_size, ops)


def last_page_len(seq_len: Any, page_size: Any, ops: IndexOps = PY_OPS) -> Any:
    """FlashInfer ``kv_last_page_len``: tokens in the last page, in ``[1, page_size]``.

    An empty sequence has no last page; it gets 0.
    """
    return ops.ite(ops.lt(0, seq_len), ops.mod(seq_len - 1, page_size) + 1, seq_len * 0)


# ---------------------------------------------------------------------------------------
# Element offsets in NHD / HND caches
# ---------------------------------------------------------------------------------------


def cache_strides(strides: Sequence[Any], layout: Layout) -> tuple[Any, Any, Any, Any]:
    """Reorder a 4-d cache's strides to ``(page, token, head, dim)`` whatever the layout.

    NHD is ``[num_pages, page_size, num_kv_heads, head_dim]``; HND swaps the middle two
    dimensions. After this reorder one kernel serves both.
    """
    s_page, s1, s2, s_dim = strides
    if layout == "NHD":
        return s_page, s1, s2, s_dim
    if layout == "HND":
        return s_page, s2, s1, s_dim
    raise ValueError(f"unknown cache layout {layout!r}; expected 'NHD' or 'HND'")


def cache_dims(shape: Sequence[int], layout: Layout) -> tuple[int, int, int, int]:
    """``(num_pages, page_size, num_kv_heads, head_dim)`` of a cache shape in ``layout``."""
    n, a, b, d = shape
    if layout == "NHD":
        return n, a, b, d
    if layout == "HND":
        return n, b, a, d
    raise ValueError(f"unknown cache layout {layout!r}; expected 'NHD' or 'HND'")


def cache_element_offset(
    page: Any, token: Any, head: Any, dim: Any, strides: tuple[Any, Any, Any, Any]
) -> Any:
    """Element offset of ``cache[page, token, head, dim]`` given reordered strides.

    ``strides`` comes from :func:`cache_strides`, so this one formula covers NHD and HND.
    """
    s_page, s_tok, s_head, s_dim = strides
    return page * s_page + token * s_tok + head * s_head + dim * s_dim


def slot_element_offset(
    slot: Any,
    head: Any,
    dim: Any,
    page_size: Any,
    strides: tuple[Any, Any, Any, Any],
    ops: IndexOps = PY_OPS,
) -> Any:
    """Element offset of head ``head``, lane ``dim`` of cache slot ``slot`` (write kernel)."""
    page, token = split_slot(slot, page_size, ops)
    return cache_element_offset(page, token, head, dim, strides)


def max_element_offset(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Largest element offset a strided view can address: ``sum((n - 1) * stride)``.

    Host-only (ints). Empty tensors address nothing and return 0. Negative strides are not
    produced by torch views, so they are not handled.
    """
    if any(n == 0 for n in shape):
        return 0
    return sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def offsets_fit_int32(*views: tuple[Sequence[int], Sequence[int]], limit: int = INT32_MAX) -> bool:
    """Whether int32 offset math is safe for every ``(shape, strides)`` view given.

    The kernels form ``index * stride`` sums for each tensor they touch. When the largest
    such sum (plus one, for the address one past a masked lane) stays at or below ``limit``,
    int32 arithmetic cannot overflow and the launcher picks it; otherwise it passes
    ``USE_INT64=True`` and the kernel widens indices before multiplying.
    """
    return all(max_element_offset(shape, strides) + 1 <= limit for shape, strides in views)


# ---------------------------------------------------------------------------------------
# Recurrent state: slot runs and the causal-conv state update
# ---------------------------------------------------------------------------------------


def run_element(
    run_start: Any, elem: Any, slot_numel: Any, slot_stride: Any, ops: IndexOps = PY_OPS
) -> Any:
    """Offset of element ``elem`` of a run of consecutive slots starting at ``run_start``.

    A run of ``n`` slots is ``n * slot_numel`` elements; element ``e`` lives in slot
    ``run_start + e // slot_numel`` at inner offset ``e % slot_numel``. The slot stride
    may exceed ``slot_numel`` (views from ``unbind``), so runs need not be contiguous.
    """
    return (run_start + ops.div(elem, slot_numel)) * slot_stride + ops.mod(elem, slot_numel)


def conv_state_source(
    j: Any, new_len: Any, width: Any, ops: IndexOps = PY_OPS
) -> tuple[Any, Any, Any]:
    """Where entry ``j`` of the updated causal-conv state comes from.

    The conv state keeps the last ``width - 1`` inputs of a sequence. After ``new_len``
    more inputs it is the tail of ``concat(old_state, new_inputs)``, whose length is
    ``width - 1 + new_len``. Entry ``j`` (``0 <= j < width - 1``) is element
    ``c = new_len + j`` of that concatenation. Returns ``(from_old, old_idx, new_idx)``:
    when ``from_old`` it is ``old_state[old_idx]`` with ``old_idx = c``, else
    ``new_inputs[new_idx]`` with ``new_idx = c - (width - 1)``. When ``new_len`` is shorter
    than the window, the old state's tail is shifted left and the new inputs appended; the
    unused index of the pair is clamped to 0 so that both are always in bounds.
    """
    keep = width - 1
    c = new_len + j
    from_old = ops.lt(c, keep)
    old_idx = ops.ite(from_old, c, c * 0)
    new_idx = ops.ite(from_old, c * 0, c - keep)
    return from_old, old_idx, new_idx


# ---------------------------------------------------------------------------------------
# Supported sizes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SizeRange:
    """Inclusive bounds of one size the kernels support."""

    name: str
    low: int
    high: int
    note: str


SUPPORTED_RANGES: dict[str, SizeRange] = {
    r.name: r
    for r in (
        SizeRange("num_blocks", 1, 2**22, "pages in one cache tensor (kernel page units)"),
        SizeRange("block_size", 1, 256, "tokens per kernel page; any value, powers of 2 fastest"),
        SizeRange("num_kv_heads", 1, 128, "KV heads in one cache tensor"),
        SizeRange("num_q_heads", 1, 1024, "query heads; a multiple of num_kv_heads"),
        SizeRange("head_dim", 1, 256, "copy kernels any; attention tested at 64 and 128"),
        SizeRange("max_blocks_per_seq", 1, 2**20, "columns of the block table"),
        SizeRange("max_seq_len", 0, 2**22, "tokens of one sequence (cached + new)"),
        SizeRange("num_tokens", 0, 2**22, "new tokens in one batch"),
        # NOTE: sequences are a grid y or z dimension (gather, prefill), and CUDA caps those
        # at 65535, not 2^16.
        SizeRange("num_seqs", 0, 2**16 - 1, "sequences in one batch"),
        SizeRange("num_state_slots", 1, 2**20, "slots of a recurrent-state tensor"),
        SizeRange("conv_width", 2, 16, "causal-conv kernel width (state keeps width - 1)"),
    )
}
"""What the kernels support. With these bounds every slot id (``num_blocks * block_size``
<= 2**30), page id and table index fits int32; element offsets may not, which is what
:func:`offsets_fit_int32` decides per launch."""


def check_size(name: str, value: int) -> None:
    """Raise ``ValueError`` if ``value`` is outside ``SUPPORTED_RANGES[name]``."""
    r = SUPPORTED_RANGES[name]
    if not r.low <= value <= r.high:
        raise ValueError(f"{name}={value} outside the supported range [{r.low}, {r.high}]")
