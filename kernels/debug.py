"""Debug-mode range checks, run before a launch when ``debug=True`` or
``PREFIXKV_KERNEL_DEBUG=1``.

A kernel that reads an index past the pool does not fail: it reads or writes someone else's
memory. These checks read the metadata back to the host (they synchronise, which is why
they are off by default) and raise :class:`KernelIndexError` naming the first bad entry.
"""

from __future__ import annotations

import torch

from . import index_math
from .errors import KernelIndexError
from .metadata import BlockTable


def _host(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.detach().reshape(-1).cpu().tolist()]


def check_slot_mapping(slot_mapping: torch.Tensor, num_slots: int, num_rows: int) -> None:
    """Each slot is negative (skip) or below ``num_slots``; there are enough source rows."""
    if slot_mapping.shape[0] > num_rows:
        raise KernelIndexError(
            f"slot_mapping has {slot_mapping.shape[0]} entries but only {num_rows} K/V rows"
        )
    seen: dict[int, int] = {}
    for i, s in enumerate(_host(slot_mapping)):
        if s >= num_slots:
            raise KernelIndexError(f"slot_mapping[{i}]={s} outside the pool of {num_slots} slots")
        if s >= 0:
            if s in seen:
                raise KernelIndexError(
                    f"slot_mapping[{i}] and [{seen[s]}] both write slot {s} (race)"
                )
            seen[s] = i


def check_seq_lens(seq_lens: torch.Tensor, max_seq_len: int) -> list[int]:
    lens = _host(seq_lens)
    for i, n in enumerate(lens):
        if n < 0 or n > max_seq_len:
            raise KernelIndexError(f"seq_lens[{i}]={n} outside [0, max_seq_len={max_seq_len}]")
    return lens


def check_block_table(block_table: BlockTable, lens: list[int], num_pages: int) -> None:
    """Every entry a sequence of ``lens[i]`` tokens reads is a page id in ``[0, num_pages)``."""
    if block_table.num_seqs < len(lens):
        raise KernelIndexError(
            f"block table has {block_table.num_seqs} rows for {len(lens)} sequences"
        )
    rows = block_table.table.detach().cpu().tolist()
    for i, n in enumerate(lens):
        need = index_math.num_pages(n, block_table.page_size)
        if need > block_table.max_entries:
            raise KernelIndexError(
                f"sequence {i} needs {need} pages but the table has {block_table.max_entries} "
                "columns"
            )
        for j in range(need):
            p = int(rows[i][j])
            if not 0 <= p < num_pages:
                raise KernelIndexError(
                    f"block_table[{i}, {j}]={p} outside the pool of {num_pages} pages"
                )


def check_query_start_loc(
    query_start_loc: torch.Tensor, lens: list[int], max_query_len: int, num_rows: int
) -> None:
    """Monotone from 0, each query fits its sequence, and ``max_query_len`` covers them."""
    qsl = _host(query_start_loc)
    if len(qsl) != len(lens) + 1 or qsl[0] != 0:
        raise KernelIndexError("query_start_loc must be [num_seqs + 1] and start at 0")
    for i in range(len(lens)):
        q = qsl[i + 1] - qsl[i]
        if q < 0 or q > lens[i] or q > max_query_len:
            raise KernelIndexError(
                f"sequence {i}: {q} new tokens with seq_len {lens[i]} and "
                f"max_query_len {max_query_len}"
            )
    if qsl[-1] > num_rows:
        raise KernelIndexError(f"query_start_loc ends at {qsl[-1]} but there are {num_rows} rows")


def check_block_pairs(block_mapping: torch.Tensor, num_pages: int) -> None:
    """Pairs are in range (or skipped with a negative id) and no destination is also read."""
    pairs = block_mapping.detach().cpu().tolist()
    dsts: set[int] = set()
    live = [(int(s), int(d)) for s, d in pairs if s >= 0 and d >= 0]
    srcs = {s for s, _ in live}
    for i, (s, d) in enumerate(live):
        if s >= num_pages or d >= num_pages:
            raise KernelIndexError(f"block pair {i} ({s} -> {d}) outside {num_pages} pages")
        if d in dsts:
            raise KernelIndexError(f"block {d} is the destination of two pairs (race)")
        if d in srcs:
            raise KernelIndexError(f"block {d} is both a source and a destination (race)")
        dsts.add(d)


def check_slots(slots: list[tuple[int, int]], num_slots: int, what: str) -> None:
    """Each ``(start, length)`` run of slots lies inside ``[0, num_slots)``."""
    for start, n in slots:
        if start < 0 or start + n > num_slots:
            raise KernelIndexError(
                f"{what} slots [{start}, {start + n}) outside the {num_slots} slots"
            )


def check_disjoint(a: list[tuple[int, int]], b: list[tuple[int, int]], what: str) -> None:
    """No slot appears in a run of ``a`` and a run of ``b`` (copies within one tensor)."""
    sa = {s for start, n in a for s in range(start, start + n)}
    for start, n in b:
        for s in range(start, start + n):
            if s in sa:
                raise KernelIndexError(f"{what}: slot {s} is both read and written (race)")
