"""Batch metadata for the kernels: vLLM-style inputs, tagged block tables, FlashInfer CSR.

The kernels take the vLLM layout:

* ``query_start_loc`` int32 ``[num_seqs + 1]``: cu_seqlens of the new (query) tokens;
* ``seq_lens`` int32 ``[num_seqs]``: cached + new tokens of each sequence;
* ``block_table`` int32 ``[num_seqs, max_blocks]`` wrapped in :class:`BlockTable`, which
  records the page size its entries are in;
* ``slot_mapping`` int64 ``[num_tokens]``: where each new token's K/V goes; negative = skip.

A sequence's cached length is ``seq_lens[i] - (query_start_loc[i+1] - query_start_loc[i])``.

Host-side builders (:func:`build_batch_metadata` and the ``plan_*`` functions) take Python
lists, the form a cache manager holds. The device-side converters (:func:`compute_slot_mapping`,
:func:`to_kernel_pages`, :func:`to_flashinfer_csr` with ``num_total_pages``) use only tensor
ops and never synchronise with the device. All of them evaluate the formulas of
:mod:`prefixkv.kernels.index_math`, on ints (:data:`~index_math.PY_OPS`) or on tensors
(:data:`TORCH_OPS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import index_math
from .errors import BlockTableAlreadyConvertedError, KernelInputError, PageSizeError
from .index_math import PY_OPS, IndexOps


@dataclass(frozen=True)
class _TorchOps:
    """``index_math`` ops over integer tensors (and ints mixed in)."""

    def div(self, a: Any, b: Any) -> Any:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return torch.div(a, b, rounding_mode="floor")
        return a // b

    def mod(self, a: Any, b: Any) -> Any:
        return a % b

    def lt(self, a: Any, b: Any) -> Any:
        return a < b

    def ite(self, cond: Any, a: Any, b: Any) -> Any:
        if isinstance(cond, torch.Tensor):
            return torch.where(cond, a, b)
        return a if cond else b


TORCH_OPS: IndexOps = _TorchOps()
"""Ops for integer tensors: the index formulas evaluated elementwise on the device."""


@dataclass(frozen=True)
class BlockTable:
    """A block table tagged with the number of tokens each entry covers.

    ``table`` is int32 ``[num_seqs, max_entries]``. ``page_size`` is the token count of one
    entry: the cache manager's block size for a table straight from the manager, the
    kernel page size after :func:`to_kernel_pages`. ``converted_from`` is the block size the
    table was converted from, or ``None`` if it was never converted; a converted table
    refuses a second conversion (:class:`BlockTableAlreadyConvertedError`). Entries past a
    sequence's last page are never read by the kernels and may hold anything.
    """

    table: torch.Tensor
    page_size: int
    converted_from: int | None = None

    def __post_init__(self) -> None:
        if self.table.dtype != torch.int32 or self.table.dim() != 2:
            raise KernelInputError(
                f"block table must be int32 [num_seqs, max_blocks], got {self.table.dtype} "
                f"{tuple(self.table.shape)}"
            )
        if self.page_size <= 0:
            raise PageSizeError(f"page_size must be positive, got {self.page_size}")

    @property
    def num_seqs(self) -> int:
        return int(self.table.shape[0])

    @property
    def max_entries(self) -> int:
        return int(self.table.shape[1])

    @property
    def in_kernel_pages(self) -> bool:
        return self.converted_from is not None


def to_kernel_pages(block_table: BlockTable, page_size: int) -> BlockTable:
    """Convert a table of cache blocks into a table of kernel pages of ``page_size`` tokens.

    ``page_size`` must divide the block size; with ratio ``r`` entry ``k`` of the result is
    ``table[k // r] * r + k % r`` (:func:`index_math.page_table_entry`). The result is
    marked converted even when ``r == 1``, so converting it again raises instead of
    multiplying block ids by the ratio twice. Device-side, no sync.
    """
    if block_table.in_kernel_pages:
        raise BlockTableAlreadyConvertedError(
            f"block table is already in kernel pages of {block_table.page_size} tokens "
            f"(converted from blocks of {block_table.converted_from}); converting twice would "
            "scale block ids by the page ratio a second time"
        )
    try:
        ratio = index_math.page_ratio(block_table.page_size, page_size)
    except ValueError as e:
        raise PageSizeError(str(e)) from None
    table = block_table.table
    k = torch.arange(block_table.max_entries * ratio, device=table.device, dtype=torch.int32)
    pages = index_math.page_table_entry(k, lambda idx: table[:, idx], ratio, TORCH_OPS)
    return BlockTable(pages.to(torch.int32).contiguous(), page_size, block_table.page_size)


def cu_seqlens(lens: torch.Tensor) -> torch.Tensor:
    """int32 ``[n + 1]`` exclusive prefix sum with a leading 0. Device-side, no sync."""
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, dim=0, dtype=torch.int32, out=out[1:])
    return out


def _owner_of(rows: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """For each flat row, the index of the segment (given by cu-style ``starts``) holding it."""
    return torch.searchsorted(starts[1:].contiguous(), rows, right=True)


def compute_slot_mapping(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: BlockTable,
    num_tokens: int,
) -> torch.Tensor:
    """Slots of the new tokens, int64 ``[num_tokens]``, computed on the device without sync.

    New token ``t`` of sequence ``s`` sits at position ``cached_len[s] + t - qsl[s]`` and
    goes to :func:`index_math.slot_for_position` of that position. Slots are identical in
    block and in page units, so either kind of table gives the same mapping. Rows past
    ``query_start_loc[-1]`` (padding) get -1.
    """
    device = query_start_loc.device
    rows = torch.arange(num_tokens, device=device, dtype=torch.int32)
    seq = _owner_of(rows, query_start_loc)
    valid = seq < seq_lens.shape[0]
    seq = torch.clamp(seq, max=max(seq_lens.shape[0] - 1, 0))
    q_start = query_start_loc[seq].long()
    q_len = (query_start_loc[seq + 1] - query_start_loc[seq]).long()
    pos = seq_lens[seq].long() - q_len + (rows.long() - q_start)
    table = block_table.table
    max_col = max(block_table.max_entries - 1, 0)
    slots = index_math.slot_for_position(
        pos,
        lambda idx: table[seq, torch.clamp(idx, 0, max_col)].long(),
        block_table.page_size,
        TORCH_OPS,
    )
    return torch.where(valid, slots, torch.full_like(slots, -1))


@dataclass(frozen=True)
class BatchMetadata:
    """Everything a batch's kernels need, in the vLLM layout, plus host-known maxima.

    ``max_query_len`` and ``max_seq_len`` are host ints, known when the batch is scheduled;
    launchers size their fixed grids with them instead of reading tensors back.
    """

    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_table: BlockTable  # int32 [num_seqs, max_blocks], tagged with its page size
    slot_mapping: torch.Tensor  # int64 [num_tokens (+ padding, = -1)]
    max_query_len: int
    max_seq_len: int
    num_tokens: int

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def build_batch_metadata(
    cached_lens: Sequence[int],
    new_lens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    *,
    device: torch.device | str = "cpu",
    max_blocks: int | None = None,
    pad_tokens_to: int | None = None,
) -> BatchMetadata:
    """Build :class:`BatchMetadata` from per-sequence host lists.

    Sequence ``i`` has ``cached_lens[i]`` tokens whose KV is already in the cache and
    ``new_lens[i]`` new tokens; ``block_ids[i]`` lists its cache blocks in order and must
    cover all ``cached + new`` positions. The table is padded with 0 to ``max_blocks``
    columns; ``slot_mapping`` is padded with -1 to ``pad_tokens_to`` rows (the padding the
    write kernel skips). Slots come from :func:`index_math.slot_for_position` on ints.
    """
    n = len(cached_lens)
    if len(new_lens) != n or len(block_ids) != n:
        raise KernelInputError("cached_lens, new_lens and block_ids must have equal lengths")
    if block_size <= 0:
        raise PageSizeError(f"block_size must be positive, got {block_size}")
    width = max([len(b) for b in block_ids] + [max_blocks or 0, 1])
    slots: list[int] = []
    for i in range(n):
        c, q, ids = cached_lens[i], new_lens[i], block_ids[i]
        if c < 0 or q < 0:
            raise KernelInputError(f"sequence {i}: negative length (cached={c}, new={q})")
        need = index_math.num_pages(c + q, block_size)
        if len(ids) < need:
            raise KernelInputError(
                f"sequence {i}: {c + q} tokens need {need} blocks of {block_size}, got {len(ids)}"
            )
        slots += [
            index_math.slot_for_position(pos, ids.__getitem__, block_size, PY_OPS)
            for pos in range(c, c + q)
        ]
    num_tokens = len(slots)
    if pad_tokens_to is not None:
        if pad_tokens_to < num_tokens:
            raise KernelInputError(f"pad_tokens_to={pad_tokens_to} < {num_tokens} new tokens")
        slots += [-1] * (pad_tokens_to - num_tokens)
    rows = [list(b) + [0] * (width - len(b)) for b in block_ids]
    seq_lens = [c + q for c, q in zip(cached_lens, new_lens, strict=True)]
    qsl = [0]
    for q in new_lens:
        qsl.append(qsl[-1] + q)
    return BatchMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=BlockTable(
            torch.tensor(rows, dtype=torch.int32, device=device).reshape(n, width), block_size
        ),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(new_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        num_tokens=num_tokens,
    )


@dataclass(frozen=True)
class FlashInferCsr:
    """Paged KV in the FlashInfer CSR form.

    Sequence ``i`` owns pages ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` of ``page_size``
    tokens; its last page holds ``kv_last_page_len[i]`` tokens (0 for an empty sequence).
    """

    kv_indptr: torch.Tensor  # int32 [num_seqs + 1], in pages
    kv_indices: torch.Tensor  # int32 [total_pages]
    kv_last_page_len: torch.Tensor  # int32 [num_seqs]
    page_size: int


def to_flashinfer_csr(
    seq_lens: torch.Tensor,
    block_table: BlockTable,
    page_size: int | None = None,
    *,
    num_total_pages: int | None = None,
) -> FlashInferCsr:
    """Convert ``(seq_lens, block_table)`` to :class:`FlashInferCsr` with ``page_size`` pages.

    A table of cache blocks is converted with ratio ``block_size // page_size``. A table
    already in kernel pages is only flattened, and only at its own page size; asking for a
    different size raises :class:`BlockTableAlreadyConvertedError`.

    ``kv_indices`` has a data-dependent length. Pass ``num_total_pages`` (a host int the
    scheduler knows) to stay sync-free; without it the total is read back from the device
    once, which is fine outside the hot path.
    """
    if page_size is None:
        page_size = block_table.page_size
    if block_table.in_kernel_pages:
        if page_size != block_table.page_size:
            raise BlockTableAlreadyConvertedError(
                f"block table is already in kernel pages of {block_table.page_size} tokens; "
                f"cannot convert it again to pages of {page_size}"
            )
        ratio = 1
    else:
        try:
            ratio = index_math.page_ratio(block_table.page_size, page_size)
        except ValueError as e:
            raise PageSizeError(str(e)) from None
    if seq_lens.dim() != 1 or seq_lens.shape[0] != block_table.num_seqs:
        raise KernelInputError("seq_lens must be 1-d with one entry per block-table row")
    lens = seq_lens.to(torch.int32)
    pages = index_math.num_pages(lens, page_size, TORCH_OPS)
    indptr = cu_seqlens(pages)
    total = int(indptr[-1]) if num_total_pages is None else num_total_pages
    rows = torch.arange(total, device=lens.device, dtype=torch.int32)
    seq = torch.clamp(_owner_of(rows, indptr), max=max(block_table.num_seqs - 1, 0))
    k = rows - indptr[seq]
    table = block_table.table
    max_col = max(block_table.max_entries - 1, 0)
    indices = index_math.page_table_entry(
        k, lambda idx: table[seq, torch.clamp(idx, 0, max_col)], ratio, TORCH_OPS
    )
    last = index_math.last_page_len(lens, page_size, TORCH_OPS)
    return FlashInferCsr(indptr, indices.to(torch.int32), last.to(torch.int32), page_size)
