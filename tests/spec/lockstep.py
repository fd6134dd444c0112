"""The spec and the impl in lockstep on a realistic pool: a long, seeded engine workload.

The Hypothesis machines explore tiny pools on purpose. This driver answers the other
question: can the spec keep up with an engine on a pool of realistic size? It plays one
seeded workload against both managers (a serving loop with shared system prompts, up to
``--seqs`` live sequences, long prompts, speculative decode steps with rejected drafts,
preemption when the pool is full, explicit evictions, the odd cache-preserving reset) and,
after every operation, requires equal results (or the same error type) and equal drained
KV events. Every ``--check-every`` steps, and at the end, the two snapshots must be equal and
every invariant must hold on both (``--check-every 1`` checks after every step, as the
differential machines do). ::

    python -m tests.spec.lockstep --blocks 2600 --steps 700
    python -m tests.spec.lockstep --blocks 65536 --steps 10000 --check-every 1000

It prints one line of JSON: the steps, operations, evictions, the wall and CPU seconds, and
the seconds spent inside the spec and inside the impl.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    HASHERS,
    Namespace,
    PrefixCacheError,
    Request,
    SeqId,
    SpecCache,
    invariants,
)

NAMESPACES = (
    Namespace("llm@1"),
    Namespace("llm@1", adapter="lora-a"),
    Namespace("llm@1", salt=b"tenant-1"),
)


class Diverged(AssertionError):
    """The spec and the impl disagreed."""


class Lockstep:
    def __init__(self, num_blocks: int, block_size: int, hasher: str) -> None:
        kwargs: dict[str, Any] = {"hasher": HASHERS[hasher], "record_events": True}
        self.spec = SpecCache(num_blocks, block_size, **kwargs)
        self.impl = PrefixCacheManager(num_blocks, block_size, **kwargs)
        self.ops = 0
        self.spec_seconds = 0.0
        self.impl_seconds = 0.0

    def op(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the method ``name`` on both; the results (or error types) must be equal."""
        self.ops += 1
        results: list[tuple[Any, type[BaseException] | None]] = []
        for cache in (self.spec, self.impl):
            start = time.perf_counter()
            try:
                results.append((getattr(cache, name)(*args, **kwargs), None))
            except PrefixCacheError as exc:
                results.append((None, type(exc)))
            elapsed = time.perf_counter() - start
            if cache is self.spec:
                self.spec_seconds += elapsed
            else:
                self.impl_seconds += elapsed
        (r_spec, e_spec), (r_impl, e_impl) = results
        if e_spec is not e_impl or (r_spec != r_impl and _plain(r_spec) != _plain(r_impl)):
            raise Diverged(f"{name}: spec {r_spec!r} / {e_spec}, impl {r_impl!r} / {e_impl}")
        if e_spec is not None:
            raise e_spec(f"{name} raised {e_spec.__name__} on both")
        return r_spec

    def check_states(self, step: int) -> None:
        snap_s, snap_i = self.spec.snapshot(), self.impl.snapshot()
        invariants.check(snap_s)
        invariants.check(snap_i)
        if snap_s != snap_i:
            raise Diverged(f"snapshots differ after step {step}")


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    bs = args.block_size
    pair = Lockstep(args.blocks, bs, args.hasher)
    # Shared system prompts, as in a chat service: most requests start with one of them.
    systems = [
        tuple(rng.randrange(1, 32_000) for _ in range(rng.randrange(4, 32) * bs)) for _ in range(8)
    ]
    max_suffix = args.max_suffix or max(4 * bs, args.blocks * bs // (4 * args.seqs))
    live: dict[SeqId, tuple[int, ...]] = {}
    next_id = 0
    start_wall, start_cpu = time.perf_counter(), time.process_time()

    def free(ids: list[SeqId]) -> None:
        pair.op("free", ids)
        for seq_id in ids:
            del live[seq_id]

    for step in range(1, args.steps + 1):
        roll = rng.random()
        if (roll < 0.45 and len(live) < args.seqs) or not live:
            system = rng.choice(systems)
            cut = rng.randrange(len(system) + 1)
            suffix = tuple(rng.randrange(1, 32_000) for _ in range(rng.randrange(1, max_suffix)))
            req = Request(next_id, system[:cut] + suffix, rng.choice(NAMESPACES))
            next_id += 1
            pair.op("match", req)
            while not pair.op("can_admit", req) and live:
                free([next(iter(live))])  # preempt the oldest sequence
            try:
                adm = pair.op("admit", req)
            except PrefixCacheError:
                continue  # larger than the whole pool
            live[req.seq_id] = req.token_ids
            sampled = (rng.randrange(1, 32_000),)
            pair.op("commit", req.seq_id, adm.num_scheduled_tokens, sampled)
            live[req.seq_id] += sampled
        elif roll < 0.90:
            seq_id = rng.choice(list(live))
            drafts = rng.randrange(0, 4)
            if not pair.op("can_append", seq_id, 1 + drafts):
                free([seq_id])
                continue
            pair.op("append", seq_id, 1 + drafts)
            accepted = rng.randrange(0, drafts + 1)
            tokens = tuple(rng.randrange(1, 32_000) for _ in range(accepted + 1))
            pair.op("commit", seq_id, 1 + accepted, tokens)
            live[seq_id] += tokens
            if drafts > accepted:
                pair.op("rollback", seq_id, drafts - accepted)
        elif roll < 0.98:
            free(rng.sample(list(live), k=min(len(live), rng.randrange(1, 4))))
        elif roll < 0.999:
            n = rng.randrange(0, 16)
            pair.op("evict", n)
        else:
            pair.op("reset", preserve_cache=True)
            live.clear()
        pair.op("take_events")
        if args.check_every and step % args.check_every == 0:
            pair.check_states(step)
    pair.check_states(args.steps)
    stats = pair.spec.stats()
    return {
        "blocks": args.blocks,
        "block_size": bs,
        "steps": args.steps,
        "operations": pair.ops,
        "evictions": stats.evictions,
        "hits": stats.hits,
        "queries": stats.queries,
        "check_every": args.check_every,
        "wall_s": round(time.perf_counter() - start_wall, 1),
        "cpu_s": round(time.process_time() - start_cpu, 1),
        "spec_s": round(pair.spec_seconds, 1),
        "impl_s": round(pair.impl_seconds, 2),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2600)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--seqs", type=int, default=48, help="most live sequences")
    parser.add_argument("--max-suffix", type=int, default=0, help="0: scale with the pool")
    parser.add_argument("--check-every", type=int, default=50)
    parser.add_argument("--hasher", choices=sorted(HASHERS), default="fast")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(parse(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
