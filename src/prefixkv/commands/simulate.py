"""``prefixkv simulate``: replay a multi-turn chat workload through a cache, report reuse.

The driver and its presets are :mod:`prefixkv.simulation`'s; this command turns the flags
into a :class:`~prefixkv.simulation.SimulationSetup`, shows progress on stderr, and prints
what the cache saved: a table, or one JSON object under ``--json``.
"""

from __future__ import annotations

import argparse

from prefixkv.cli import EXIT_USAGE, CommandError, Runner, emit_json
from prefixkv.outputs import to_json
from prefixkv.simulation import (
    IMPL_PRESET,
    SPEC_PRESET,
    WORKLOADS,
    SimulationResult,
    SimulationSetup,
    resolve,
    simulate,
)
from prefixkv.spec import HASHERS

from .support import check_workload_size, int_at_least, int_in, progress

__all__ = ["setup"]

# The flags' upper bounds (each a usage error past it): the workload and the pool are
# built whole before the first request.
MAX_NUM_BLOCKS = 2**24
MAX_BLOCK_SIZE = 2**12
#: Token slots of the pool (num_blocks x block_size): 2**28 are 1 GiB of token ids.
MAX_POOL_TOKENS = 2**28
MAX_SPEC_BLOCKS = 2**16
MAX_CONVERSATIONS = 10**6
MAX_TURNS = 1_000
MAX_LIVE = 2**20


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``simulate`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    d, s = IMPL_PRESET, SPEC_PRESET
    non_negative = int_at_least(0)
    parser.add_argument(
        "--spec",
        action="store_true",
        help="drive the executable spec (slow: O(pool) per operation) on a toy workload "
        f"({s.workload.conversations} conversations, {s.num_blocks} blocks of "
        f"{s.block_size}) instead of the optimized cache manager",
    )
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="chat",
        help="chat (default): the benchmark's multi-turn chat; multimodal: images in half "
        "the user turns, shared across conversations, prefilled in chunks of 512 tokens; "
        "speculative: 3 draft tokens a step and a one-block recompute window; hybrid: a "
        "hybrid (attention + recurrent) model that hits only at saved state checkpoints",
    )
    parser.add_argument(
        "--hash",
        choices=sorted(HASHERS),
        default="fast",
        help="block hash (default: fast); 'weak' collides on purpose and must not change "
        "any result, only the time",
    )
    parser.add_argument(
        "--num-blocks",
        type=int_in(1, MAX_NUM_BLOCKS),
        metavar="N",
        help=f"pool size (default: {d.num_blocks}; spec {s.num_blocks})",
    )
    parser.add_argument(
        "--block-size",
        type=int_in(1, MAX_BLOCK_SIZE),
        metavar="N",
        help=f"tokens per block (default: {d.block_size}; spec {s.block_size})",
    )
    parser.add_argument(
        "--conversations",
        type=int_in(1, MAX_CONVERSATIONS),
        metavar="N",
        help=f"conversations (default: {d.workload.conversations}; spec "
        f"{s.workload.conversations})",
    )
    parser.add_argument(
        "--turns",
        type=int_in(1, MAX_TURNS),
        metavar="N",
        help=f"turns per conversation (default: {d.workload.turns}; spec {s.workload.turns})",
    )
    parser.add_argument(
        "--live",
        type=int_in(0, MAX_LIVE),
        metavar="N",
        help="finished sequences kept live before they are freed "
        f"(default: {d.live}; spec {s.live})",
    )
    parser.add_argument(
        "--seed", type=non_negative, default=0, metavar="N", help="workload seed (default: 0)"
    )
    parser.add_argument(
        "--check-invariants",
        type=int_in(1, 2**31),
        metavar="N",
        default=0,
        help="run prefixkv.spec.invariants.check on the cache every N cache operations "
        "and at the end (O(pool) each)",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    sim = resolve(
        args.workload,
        spec=args.spec,
        hash_name=args.hash,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        conversations=args.conversations,
        turns=args.turns,
        live=args.live,
        seed=args.seed,
    )
    pool_tokens = sim.num_blocks * sim.block_size
    if pool_tokens > MAX_POOL_TOKENS:
        raise CommandError(
            f"--num-blocks x --block-size is {pool_tokens:,} token slots, more than "
            f"{MAX_POOL_TOKENS:,} (the pool is allocated whole)",
            exit_code=EXIT_USAGE,
        )
    if sim.cache == "spec" and sim.num_blocks > MAX_SPEC_BLOCKS:
        raise CommandError(
            f"--spec --num-blocks {sim.num_blocks:,}: the executable spec holds a Python "
            f"object per block and walks the pool on every call; at most {MAX_SPEC_BLOCKS:,}",
            exit_code=EXIT_USAGE,
        )
    w = sim.workload
    check_workload_size(
        w.conversations,
        w.turns,
        w.system_tokens + w.image_tokens,
        w.user_tokens[1] + w.reply_tokens[1] + w.image_tokens,
        "--conversations x --turns",
    )
    with progress(args.json) as bar:
        task = bar.add_task("replaying requests", total=sim.num_requests)
        result = simulate(
            sim, check_every=args.check_invariants, on_request=lambda _: bar.advance(task)
        )
    if args.json:
        emit_json({"command": "simulate", "ok": True, **to_json(sim), **to_json(result)})
    else:
        _print_report(sim, result)
    return 0


def _print_report(s: SimulationSetup, r: SimulationResult) -> None:
    from rich.console import Console
    from rich.table import Table

    w = s.workload
    computed, skipped = r.prefill_tokens_computed, r.prefill_tokens_skipped
    total = max(computed + skipped, 1)
    title = (
        f"prefixkv simulate: {s.cache} cache, {s.num_blocks:,} blocks x "
        f"{s.block_size} tokens, hash={s.hash}"
    )
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        (
            "workload",
            f"{s.workload_name}: {w.conversations} conversations x {w.turns} turns, "
            f"{w.system_prompts} shared system prompts of {w.system_tokens} tokens"
            + (f", images of {w.image_tokens} tokens" if w.image_tokens else ""),
        ),
        ("requests", f"{r.requests:,}"),
        ("prompt / reply tokens", f"{r.prompt_tokens:,} / {r.reply_tokens:,}"),
        ("hit rate (prompt tokens)", f"{r.hit_rate:.1%}"),
    ]
    if r.hybrid:
        rows += [
            ("  checkpoint hit rate", f"{r.hit_rate:.1%}  (hits restore a saved state)"),
            ("  KV hit rate", f"{r.kv_hit_rate:.1%}  (what the KV alone would hit)"),
            (
                "checkpoints",
                f"saved {r.checkpoints_saved:,} / restored {r.checkpoints_restored:,}"
                f" / released stale {r.checkpoints_released_stale:,} / evicted "
                f"{r.checkpoints_evicted:,} / discarded {r.checkpoints_discarded:,}",
            ),
            ("peak state-slot utilization", f"{r.peak_state_slot_utilization:.1%}"),
        ]
    rows += [
        ("lost reuse (tokens)", _lost_split(r)),
        ("prefill tokens computed", f"{computed:,}  ({computed / total:.1%})"),
        ("prefill tokens skipped", f"{skipped:,}  ({skipped / total:.1%})"),
        ("blocks published", f"{r.blocks_published:,}"),
        ("evictions", f"{r.evictions:,}"),
        ("peak utilization", f"{r.peak_utilization:.1%}  ({r.peak_used_blocks:,} blocks)"),
        ("early frees (pool dry)", f"{r.early_frees:,}"),
        ("cache operations", f"{r.cache_ops:,}"),
    ]
    if r.prefill_chunks:
        rows.append(("prefill chunks after the first", f"{r.prefill_chunks:,}"))
    if r.drafts_proposed:
        rows.append(
            (
                "draft tokens accepted",
                f"{r.drafts_accepted:,} of {r.drafts_proposed:,}  "
                f"({r.drafts_accepted / r.drafts_proposed:.1%})",
            )
        )
    if r.invariant_checks:
        rows.append(("invariant checks passed", f"{r.invariant_checks:,}"))
    rows.append(("wall time", f"{r.wall_time_s:.2f} s"))
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _lost_split(r: SimulationResult) -> str:
    """The lost-reuse split: ``window 1,234 / span 0 / ...`` (causes with no tokens omitted)."""
    causes = {
        "window": r.lost_window,
        "span": r.lost_span,
        "cap": r.lost_cap,
        "evicted": r.lost_evicted,
        "never cached": r.lost_never_cached,
        "checkpoint": r.lost_checkpoint,
    }
    return " / ".join(f"{cause} {n:,}" for cause, n in causes.items() if n) or "none"
