"""Host memory per cached block: fill a pool with distinct prompts, measure what it holds.

Run as ``python -m prefixkv.benchmarks.memory --num-blocks N --probe rss|tracemalloc``; it
prints one JSON object. ``prefixkv bench`` starts one fresh process per pool size and per
probe, because a process's memory never fully returns to where it started: a second
measurement in the same process would inherit the first one's arenas.

The fill: prompts of 64 full blocks plus one token, random ids over a 32k vocabulary (so
no two blocks share an identity), each admitted, prefilled (which publishes its full
blocks) and freed, until the pool holds ``num_blocks - 64`` cached blocks or more would not
fit without eviction. The prompt lists are the engine's data, not the cache's: each is
dropped before the next one is built.

Two probes, each in its own process:

* ``rss``: the resident set size (``psutil``), from before the manager is constructed to
  after the fill. It is what the operating system charges, allocator slack included.
* ``tracemalloc``: the Python heap the manager holds, from before construction to after the
  fill. Tracing inflates the process's RSS, which is why it never shares a process with
  the ``rss`` probe.

Both are divided by the number of cached (published) blocks. Memory a manager allocates up
front for the whole pool is included: it is part of what a cached block costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from collections.abc import Sequence
from typing import Any

from prefixkv.errors import InvalidConfig
from prefixkv.spec import Request

from .errors import BenchmarkFailed
from .lifecycle import NAMESPACE, make_cache

__all__ = ["PROMPT_BLOCKS", "VOCAB", "fill", "main", "measure"]

VOCAB = 32_000
PROMPT_BLOCKS = 64


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def fill(cache: Any, block_size: int, seed: int = 0) -> int:
    """Fill ``cache`` with distinct prompts (module doc); returns the blocks cached."""
    import numpy as np

    rng = np.random.default_rng(seed)
    length = PROMPT_BLOCKS * block_size + 1
    published = 0
    i = 0
    while published + PROMPT_BLOCKS + 1 <= cache.num_blocks:
        sid = i
        prompt = rng.integers(0, VOCAB, size=length).tolist()
        adm = cache.admit(Request(sid, prompt, NAMESPACE))
        del prompt
        cache.commit(sid, adm.num_scheduled_tokens, (0,))
        cache.free((sid,))
        published += PROMPT_BLOCKS
        i += 1
    return published


def measure(
    num_blocks: int, probe: str, *, manager: str = "impl", block_size: int = 16
) -> dict[str, Any]:
    """Bytes per cached block of a fresh ``manager`` filled to ``num_blocks`` (one probe)."""
    if probe not in ("rss", "tracemalloc"):
        raise InvalidConfig(f"unknown probe {probe!r}")
    import numpy  # noqa: F401  (imported before the baseline: it is the fill's, not the cache's)

    gc.collect()
    if probe == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = _rss()
    cache = make_cache(manager, num_blocks, block_size)
    cached = fill(cache, block_size)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if probe == "tracemalloc" else _rss()
    stats = cache.stats()
    if stats.evictions:
        raise BenchmarkFailed("the fill evicted blocks: the per-block figure would be wrong")
    if stats.blocks_published != cached:
        raise BenchmarkFailed(f"expected {cached} published blocks, got {stats.blocks_published}")
    if probe == "tracemalloc":
        tracemalloc.stop()
    return {
        "manager": manager,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "probe": probe,
        "cached_blocks": cached,
        "bytes": after - before,
        "bytes_per_cached_block": (after - before) / cached,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefixkv.benchmarks.memory")
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--probe", choices=("rss", "tracemalloc"), required=True)
    parser.add_argument("--manager", choices=("impl", "spec"), default="impl")
    args = parser.parse_args(argv)
    json.dump(measure(args.num_blocks, args.probe, manager=args.manager), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
