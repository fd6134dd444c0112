"""Run one kernel under the Triton interpreter on tensors past 2^31 elements, for real.

The tensors live in a sparse anonymous mapping (``MAP_NORESERVE``): gigabytes of address
space, of which only the pages a kernel touches ever get memory (a few MB per case). So the
kernels run their real pointer arithmetic at offsets past 2^31 on a CPU, and an offset that
wraps in int32 lands elsewhere: a wrong result or a segfault. That is why each case runs in
its own process (``python -m huge_offsets CASE`` from ``tests/kernels``, see
``test_huge_offsets.py``); it exits 0 when the kernel's result is exact.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable

if __name__ == "__main__":  # before triton is imported; importing this module changes nothing
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from prefixkv.kernels import copy_blocks, decode_attention, gather_kv, write_kv
from prefixkv.kernels.metadata import BlockTable

#: A cache of (2^17 + 1) pages of 16 tokens, 8 heads of 128: 2^31 + 2^14 fp16 elements, 4 GB
#: of address space. Its last page starts at offset 2^31.
PAGES, PAGE, HEADS, DIM = 2**17 + 1, 16, 8, 128
LAST = PAGES - 1

#: Linux's value (x86-64 and arm64); Python's mmap module names it only from 3.13 on.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)

_maps: list[mmap.mmap] = []


def sparse(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor backed by address space only: memory is taken page by page on touch."""
    n = 1
    for s in shape:
        n *= s
    size = n * torch.empty((), dtype=dtype).element_size()
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
    buf = mmap.mmap(-1, size, flags=flags)
    _maps.append(buf)
    return torch.frombuffer(buf, dtype=dtype, count=n).view(*shape)


def huge_cache() -> torch.Tensor:
    return sparse(PAGES, PAGE, HEADS, DIM, dtype=torch.float16)


def rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HEADS, DIM, generator=g).to(torch.float16)


def write(slot_dtype: torch.dtype) -> bool:
    """Write two tokens into the last page (slots past 2^31 elements) and one into page 0."""
    cache = huge_cache()
    k, v = rows(3, 0), rows(3, 1)
    slots = torch.tensor([LAST * PAGE + 3, 5, LAST * PAGE + PAGE - 1], dtype=slot_dtype)
    vcache = huge_cache()
    write_kv(k, v, cache, vcache, slots, debug=False)
    got = torch.stack([cache[LAST, 3], cache[0, 5], cache[LAST, PAGE - 1]])
    gotv = torch.stack([vcache[LAST, 3], vcache[0, 5], vcache[LAST, PAGE - 1]])
    return torch.equal(got, k) and torch.equal(gotv, v)


def gather_from_huge_cache() -> bool:
    cache = huge_cache()
    cache[LAST] = rows(PAGE, 2)
    cache[1] = rows(PAGE, 3)
    table = BlockTable(torch.tensor([[LAST, 1]], dtype=torch.int32), PAGE)
    k, v = gather_kv(
        cache, cache, table, torch.tensor([2 * PAGE], dtype=torch.int32),
        max_seq_len=2 * PAGE, total_tokens=2 * PAGE, debug=False,
    )  # fmt: skip
    want = torch.cat([cache[LAST], cache[1]])
    return torch.equal(k, want) and torch.equal(v, want)


def gather_with_huge_table() -> bool:
    """A block table of 3 rows of 2^30 + 16 entries: row 2 starts past 2^31 entries."""
    cache = torch.zeros(8, PAGE, HEADS, DIM, dtype=torch.float16)
    for page in range(8):
        cache[page] = page + 1
    width = 2**30 + 16
    table = sparse(3, width, dtype=torch.int32)
    table[0, :2] = torch.tensor([1, 2], dtype=torch.int32)
    table[2, :2] = torch.tensor([6, 7], dtype=torch.int32)
    lens = torch.tensor([0, 0, 2 * PAGE], dtype=torch.int32)
    k, _ = gather_kv(
        cache, cache, BlockTable(table, PAGE), lens, max_seq_len=2 * PAGE,
        total_tokens=2 * PAGE, debug=False,
    )  # fmt: skip
    return torch.equal(k, torch.cat([cache[6], cache[7]]))


def copy_into_huge_cache() -> bool:
    cache = huge_cache()
    cache[2] = rows(PAGE, 4)
    copy_blocks([cache], torch.tensor([[2, LAST]], dtype=torch.int64), debug=False)
    return torch.equal(cache[LAST], cache[2])


def decode_over_huge_cache() -> bool:
    """One query over the last page and page 0, against attention on a gathered copy."""
    cache = huge_cache()
    cache[LAST] = rows(PAGE, 5)
    cache[0] = rows(PAGE, 6)
    q = rows(1, 7).float().to(torch.float16)
    table = BlockTable(torch.tensor([[LAST, 0]], dtype=torch.int32), PAGE)
    out = decode_attention(
        q, cache, cache, table, torch.tensor([2 * PAGE], dtype=torch.int32),
        max_seq_len=2 * PAGE, debug=False,
    )  # fmt: skip
    keys = torch.cat([cache[LAST], cache[0]]).float()  # [tokens, heads, dim]
    scores = torch.einsum("hd,thd->ht", q[0].float(), keys) * DIM**-0.5
    want = torch.einsum("ht,thd->hd", scores.softmax(-1), keys)
    return torch.allclose(out[0].float(), want, atol=2e-2, rtol=2e-2)


CASES: dict[str, Callable[[], bool]] = {
    "write_int64_slots": lambda: write(torch.int64),
    "write_int32_slots": lambda: write(torch.int32),
    "gather_from_huge_cache": gather_from_huge_cache,
    "gather_with_huge_table": gather_with_huge_table,
    "copy_into_huge_cache": copy_into_huge_cache,
    "decode_over_huge_cache": decode_over_huge_cache,
}


if __name__ == "__main__":
    ok = CASES[sys.argv[1]]()
    print("exact" if ok else "WRONG")
    sys.exit(0 if ok else 1)
