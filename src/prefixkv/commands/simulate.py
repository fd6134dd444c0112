"""``prefixkv simulate``: replay a multi-turn chat workload through a cache, report reuse.

The driver and its presets are :mod:`prefixkv.simulation`'s; this command turns the flags
into a :class:`~prefixkv.simulation.SimulationSetup`, shows progress on stderr, and prints
what the cache saved: a table, or one JSON object under ``--json``.
"""

from __future__ import annotations

import argparse

from prefixkv.cli import Runner, emit_json
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

from .support import int_at_least, progress

__all__ = ["setup"]


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``simulate`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    d, s = IMPL_PRESET, SPEC_PRESET
    positive, non_negative = int_at_least(1), int_at_least(0)
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
        type=positive,
        metavar="N",
        help=f"pool size (default: {d.num_blocks}; spec {s.num_blocks})",
    )
    parser.add_argument(
        "--block-size",
        type=positive,
        metavar="N",
        help=f"tokens per block (default: {d.block_size}; spec {s.block_size})",
    )
    parser.add_argument(
        "--conversations",
        type=positive,
        metavar="N",
        help=f"conversations (default: {d.workload.conversations}; spec "
        f"{s.workload.conversations})",
    )
    parser.add_argument(
        "--turns",
        type=positive,
        metavar="N",
        help=f"turns per conversation (default: {d.workload.turns}; spec {s.workload.turns})",
    )
    parser.add_argument(
        "--live",
        type=non_negative,
        metavar="N",
        help="finished sequences kept live before they are freed "
        f"(default: {d.live}; spec {s.live})",
    )
    parser.add_argument(
        "--seed", type=non_negative, default=0, metavar="N", help="workload seed (default: 0)"
    )
    parser.add_argument(
        "--check-invariants",
        type=positive,
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
