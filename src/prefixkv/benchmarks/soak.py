"""A long run of the hybrid manager with the resident set size sampled: does memory creep?

Run as ``python -m prefixkv.benchmarks.soak --ops N``. It drives one
:class:`~prefixkv.impl.HybridPrefixCacheManager` (recurrent-state checkpoints and routed
experts on) through its public API with a fixed seed, the way an engine does: requests
arrive (most share one of a few system prompts, under a few namespaces), their restores
are issued, their prefills are committed with routed-expert data, they decode token by
token (each commit keeps the runtime state), some roll a draft back, and they finish;
now and then blocks are evicted by hand, and, rarely, every sequence finishes and the
cache is reset.
With ``--events`` it records KV events and drains them every step.

Every ``--every`` operations it prints the operation count, the resident set size and
the cache's occupancy; the last line says how far the RSS moved after warm-up (the first
``--warmup`` operations). Each mutating call of the public API is one operation. The
RSS is read from ``/proc/self/statm`` (Linux), else the peak from ``resource``.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence

import attrs

from prefixkv.errors import PrefixKVError
from prefixkv.impl import HybridPrefixCacheManager
from prefixkv.spec import Namespace, Request

__all__ = ["SoakSample", "drift_after", "main", "rss_bytes", "soak"]

#: Token ids are drawn from this vocabulary (system prompts and suffixes alike).
VOCAB = 32_000
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """The process's resident set size in bytes.

    Returns:
        The current RSS from ``/proc/self/statm``; where that file does not exist, the
        peak RSS ``resource.getrusage`` reports (an upper bound, never below the current).
    """
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


@attrs.frozen
class SoakSample:
    """The process and the cache after ``ops`` operations."""

    ops: int
    rss: int
    """Resident set size, bytes."""
    seconds: float
    sequences: int
    published: int
    slots_used: int
    """Recurrent-state slots in use (runtime and checkpoints)."""


class _Driver:
    """The engine-shaped workload: one random step at a time (see the module doc)."""

    def __init__(self, seed: int, *, num_blocks: int, block_size: int, events: bool) -> None:
        self.rng = random.Random(seed)
        self.bs = block_size
        self.cache = HybridPrefixCacheManager(
            num_blocks,
            block_size,
            max_num_seqs=16,
            state_budget=32,
            decode_state_interval=2 * block_size,
            record_events=events,
        )
        self.events = events
        self.namespaces = [
            Namespace("soak@1"),
            Namespace("soak@1", adapter="lora-a"),
            Namespace("soak@1", salt=b"tenant-b"),
        ]
        rng = self.rng
        self.systems = [
            [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6) * block_size)]
            for _ in range(6)
        ]
        self.live: list[int] = []
        self.next_id = 0
        self.ops = 0

    def step(self) -> None:
        """One random engine step: an arrival, a decode step, a rollback, a finish, an
        eviction or a reset."""
        rng, cache = self.rng, self.cache
        roll = rng.random()
        if not self.live or (roll < 0.25 and len(self.live) < cache.max_num_seqs):
            self._arrive()
        elif roll < 0.80:
            self._decode(rng.choice(self.live))
        elif roll < 0.83:
            self._rollback(rng.choice(self.live))
        elif roll < 0.98:
            seq = self.live.pop(rng.randrange(len(self.live)))
            cache.free((seq,))
            self.ops += 1
        elif roll < 0.9995:
            cache.evict(rng.randrange(1, 8))
            self.ops += 1
        else:  # every sequence finishes, and the cache is cleared
            cache.free(self.live)
            self.live.clear()
            cache.reset(preserve_cache=False)
            self.ops += 2
        if self.events:
            cache.take_events()

    def _arrive(self) -> None:
        rng, cache, bs = self.rng, self.cache, self.bs
        prompt = list(rng.choice(self.systems)) if rng.random() < 0.8 else []
        prompt += [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 3 * bs))]
        seq = self.next_id
        self.next_id += 1
        req = Request(seq, prompt, rng.choice(self.namespaces))
        if not cache.can_admit(req):
            return
        adm = cache.admit(req)
        self.ops += 1
        if adm.restore_slot is not None:
            cache.restore_issued(seq)
            self.ops += 1
        self.live.append(seq)
        self._commit(seq, adm.num_scheduled_tokens)

    def _commit(self, seq: int, n: int) -> None:
        cache, bs = self.cache, self.bs
        before = cache.num_computed_tokens(seq)
        completed = (before + n) // bs - before // bs
        experts = [bytes([seq & 0xFF]) * 8] * completed
        cache.commit(seq, n, [self.rng.randrange(VOCAB)], routed_experts=experts)
        cache.keep_state(seq, before + n)
        self.ops += 2

    def _decode(self, seq: int) -> None:
        cache = self.cache
        if not cache.can_append(seq, 1):
            self.live.remove(seq)
            cache.free((seq,))
            self.ops += 1
            return
        cache.append(seq, 1)
        self.ops += 1
        self._commit(seq, 1)

    def _rollback(self, seq: int) -> None:
        # A draft of two tokens, one accepted: the rejected slot is rolled back.
        cache = self.cache
        if not cache.can_append(seq, 2):
            return
        cache.append(seq, 2)
        self.ops += 1
        self._commit(seq, 1)
        cache.rollback(seq, 1)
        self.ops += 1


def soak(
    ops: int,
    *,
    every: int,
    seed: int = 0,
    num_blocks: int = 1024,
    block_size: int = 16,
    events: bool = False,
    on_sample: Callable[[SoakSample], None] | None = None,
) -> list[SoakSample]:
    """Run the workload for at least ``ops`` operations, sampling every ``every``.

    Args:
        ops: operations to run (each mutating call of the public API is one).
        every: operations between two samples.
        seed: the workload's seed.
        num_blocks: the pool's size.
        block_size: tokens per block.
        events: record KV events (drained every step).
        on_sample: called with each sample as it is taken.

    Returns:
        One sample before the first operation, then one about every ``every`` operations,
        and one at the end.
    """
    if ops < 1 or every < 1:
        raise PrefixKVError(f"--ops and --every must be positive, got {ops} and {every}")
    driver = _Driver(seed, num_blocks=num_blocks, block_size=block_size, events=events)
    start = time.perf_counter()
    samples: list[SoakSample] = []

    def take() -> None:
        samples.append(_sample(driver, start))
        if on_sample is not None:
            on_sample(samples[-1])

    take()
    due = every
    while driver.ops < ops:
        driver.step()
        if driver.ops >= due:
            take()
            due += every
    if samples[-1].ops != driver.ops:
        take()
    return samples


def _sample(driver: _Driver, start: float) -> SoakSample:
    st = driver.cache.stats()
    return SoakSample(
        ops=driver.ops,
        rss=rss_bytes(),
        seconds=time.perf_counter() - start,
        sequences=st.num_sequences,
        published=st.num_published_blocks,
        slots_used=st.num_state_slots_used,
    )


def drift_after(samples: Sequence[SoakSample], warmup: int) -> tuple[int, int]:
    """The lowest and highest RSS (bytes) over the samples taken after ``warmup`` ops.

    Args:
        samples: what :func:`soak` returned.
        warmup: operations that do not count.

    Returns:
        ``(low, high)``; ``(0, 0)`` when no sample was taken after warm-up.
    """
    after = [s.rss for s in samples if s.ops >= warmup]
    return (min(after), max(after)) if after else (0, 0)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module doc).

    Args:
        argv: the arguments, ``sys.argv[1:]`` by default.

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m prefixkv.benchmarks.soak")
    parser.add_argument("--ops", type=int, default=100_000, help="operations to run")
    parser.add_argument("--every", type=int, default=None, help="operations between samples")
    parser.add_argument("--warmup", type=int, default=None, help="operations before RSS counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--events", action="store_true", help="record and drain KV events")
    args = parser.parse_args(argv)
    if args.ops < 1:
        parser.error("--ops must be positive")
    every = args.every if args.every is not None else max(1, args.ops // 20)
    warmup = args.warmup if args.warmup is not None else args.ops // 10
    print(f"{'ops':>12} {'rss MB':>9} {'seconds':>9} {'seqs':>5} {'published':>9} {'slots':>5}")

    def show(s: SoakSample) -> None:
        print(
            f"{s.ops:>12} {s.rss / 1e6:>9.2f} {s.seconds:>9.1f} {s.sequences:>5} "
            f"{s.published:>9} {s.slots_used:>5}",
            flush=True,
        )

    samples = soak(
        args.ops,
        every=every,
        seed=args.seed,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        events=args.events,
        on_sample=show,
    )
    low, high = drift_after(samples, warmup)
    print(
        f"RSS after {warmup} ops: {low / 1e6:.2f} to {high / 1e6:.2f} MB "
        f"(spread {(high - low) / 1e6:.3f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
