"""``prefixkv serve-sim``: serve a chat workload through scheduler, tiny model and cache.

The engine demo. :mod:`prefixkv.serving` serves the workload with the cache on and off and
compares the outputs; this command prints the report (a table, or one JSON object under
``--json``), draws ``--plot``, and exits 1 when cache on != cache off.

``--replicas N --router {kv,round-robin}`` serves the same workload on N engine replicas,
each a process of its own publishing its KV events, behind a KV-aware router
(:mod:`prefixkv.events.cluster`); it exits 1 on a router misprediction or a request that
was not served exactly once. A replica that dies or stalls (no answer within
``--stall-timeout``) is dropped and its requests re-routed; the report lists every request
once, served, re-routed or failed. ``--fail-fast`` aborts on the first failure instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from prefixkv.cli import EXIT_FAILURE, EXIT_USAGE, CommandError, Runner, emit_json
from prefixkv.events.replicas import STALL_TIMEOUT_S
from prefixkv.events.router import RouterConfigError
from prefixkv.serving import (
    ServeReport,
    ServeSimConfig,
    chat_turns,
    engine_config,
    plot_replicas,
    plot_ttft,
    serve_on_off,
)

from .support import (
    check_workload_size,
    device_name,
    int_at_least,
    int_in,
    plot_path,
    progress,
    seconds,
)

if TYPE_CHECKING:
    from prefixkv.engine import EngineConfig, Turn

__all__ = ["setup"]

# The flags' upper bounds (each a usage error past it): the workload, the KV pool and the
# replicas are built whole before the first step.
MAX_CONVERSATIONS = 10_000
MAX_TURNS = 100
MAX_SYSTEM_TOKENS = 2**16
MAX_BLOCK_SIZE = 1024
MAX_BUDGET = 2**16
MAX_DRAFT_TOKENS = 64
MAX_REPLICAS = 64
#: KV slots of the pool (num_blocks x block_size): 2**21 slots of the tiny model's
#: 512 bytes are 1 GiB, on the CPU or the GPU.
MAX_KV_TOKENS = 2**21


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``serve-sim`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    d = ServeSimConfig()
    parser.add_argument(
        "--conversations",
        type=int_in(1, MAX_CONVERSATIONS),
        default=d.conversations,
        metavar="N",
        help=f"conversations (default: {d.conversations})",
    )
    parser.add_argument(
        "--turns",
        type=int_in(1, MAX_TURNS),
        default=d.turns,
        metavar="N",
        help=f"turns per conversation (default: {d.turns})",
    )
    parser.add_argument(
        "--system-tokens",
        type=int_in(1, MAX_SYSTEM_TOKENS),
        default=d.system_tokens,
        metavar="N",
        help=f"tokens per shared system prompt (default: {d.system_tokens})",
    )
    parser.add_argument(
        "--num-blocks",
        type=int_in(1, MAX_KV_TOKENS),
        default=512,
        metavar="N",
        help="KV pool size in blocks (default: 512)",
    )
    parser.add_argument(
        "--block-size",
        type=int_in(1, MAX_BLOCK_SIZE),
        default=8,
        metavar="N",
        help="tokens per block (default: 8)",
    )
    parser.add_argument(
        "--budget",
        type=int_in(1, MAX_BUDGET),
        default=128,
        metavar="N",
        help="token budget per step (default: 128)",
    )
    parser.add_argument(
        "--draft-tokens",
        type=int_in(0, MAX_DRAFT_TOKENS),
        default=0,
        metavar="K",
        help="speculative decoding with K n-gram draft tokens a step (default: 0, off)",
    )
    parser.add_argument(
        "--hybrid",
        action="store_true",
        help="serve the hybrid model (a recurrent layer, then attention)",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "torch", "interpreter", "fast"),
        help="auto: Triton kernels on CUDA, torch on the CPU",
    )
    parser.add_argument(
        "--device",
        type=device_name,
        default=None,
        help="cpu, cuda or cuda:N (default: cuda if present)",
    )
    parser.add_argument(
        "--seed",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="workload and weights seed (default: 0)",
    )
    parser.add_argument(
        "--replicas",
        type=int_in(1, MAX_REPLICAS),
        default=None,
        metavar="N",
        help="serve on N engine replicas (processes) behind a router (needs prefixkv[events])",
    )
    parser.add_argument(
        "--router",
        default=None,
        metavar="{kv,round-robin}",
        help="with --replicas: longest cached prefix, tie-broken by load (default: kv), "
        "or round-robin",
    )
    parser.add_argument(
        "--index",
        default="auto",
        metavar="{auto,dynamo,dynamo-zmq,mirror}",
        help="with --replicas: the router's index; auto is Dynamo's RadixTree when "
        "ai-dynamo-runtime is installed, else prefixkv's mirror (default: auto); "
        "dynamo-zmq is Dynamo's own ZMQ consumer (python -m dynamo.indexer) reading the "
        "replicas' streams itself",
    )
    parser.add_argument(
        "--stall-timeout",
        type=seconds,
        default=STALL_TIMEOUT_S,
        metavar="S",
        help="with --replicas: a replica that does not answer a tick within S seconds is "
        f"stalled, and dropped (default: {STALL_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--fail-fast",
        action="store_true",
        help="with --replicas: abort the run on the first replica that dies or stalls, "
        "instead of dropping it and re-routing its requests",
    )
    parser.add_argument(
        "--plot",
        type=plot_path,
        default=None,
        metavar="PATH",
        help="write a PNG of TTFT against the cached fraction of each prompt (PATH.png "
        "for a PATH without a suffix, PATH/figure.png for a folder)",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    kv_tokens = args.num_blocks * args.block_size
    if kv_tokens > MAX_KV_TOKENS:
        raise CommandError(
            f"--num-blocks x --block-size is {kv_tokens:,} KV slots, more than "
            f"{MAX_KV_TOKENS:,} (the KV pool is allocated whole)",
            exit_code=EXIT_USAGE,
        )
    sim = ServeSimConfig(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        seed=args.seed,
    )
    check_workload_size(
        sim.conversations,
        sim.turns,
        sim.system_tokens,
        sim.user_tokens[1] + sim.reply_tokens[1],
        "--conversations x --turns x --system-tokens",
    )
    config = engine_config(
        seed=args.seed,
        hybrid=args.hybrid,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        budget=args.budget,
        draft_tokens=args.draft_tokens,
        backend=args.backend,
        device=args.device,
    )
    turns = chat_turns(sim, config.model.vocab_size)
    if args.replicas is not None or args.router is not None:
        return _run_replicas(args, sim, attrs.evolve(config, record_logits=False), turns)
    with progress(args.json) as bar:
        tasks = {
            enabled: bar.add_task(f"serving, cache {label}", total=len(turns))
            for enabled, label in ((True, "on "), (False, "off"))
        }
        outcome = serve_on_off(
            turns, config, lambda enabled, done: bar.update(tasks[enabled], completed=done)
        )
    report = ServeReport.of(outcome, sim, config)
    out = {"command": "serve-sim", **report.as_json()}
    if args.plot is not None:
        plot_ttft(outcome, args.plot)
        out["plot"] = str(args.plot)
    if args.json:
        emit_json(out)
    else:
        _print(report, args.plot)
    if not outcome.equal:
        # Not a CommandError: the report (with ok=false) is already the one JSON document.
        print(
            f"prefixkv serve-sim: error: cache on != cache off: {outcome.mismatch}", file=sys.stderr
        )
        return EXIT_FAILURE
    return 0


def _print(r: ServeReport, plot: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    w = r.workload
    table = Table(
        title=f"prefixkv serve-sim: {r.model}, {r.num_blocks} blocks x "
        f"{r.block_size} tokens, backend {r.backend}",
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    computed, skipped = r.prefill_tokens_computed, r.prefill_tokens_skipped
    total = max(computed + skipped, 1)
    rows = [
        (
            "workload",
            f"{w.conversations} conversations x {w.turns} turns, "
            f"{w.system_prompts} shared system prompts of {w.system_tokens} tokens",
        ),
        ("requests / generated tokens", f"{r.requests} / {r.generated_tokens}"),
        ("TTFT p50 (cache on / off)", f"{r.ttft_ms_p50_on:.1f} ms / {r.ttft_ms_p50_off:.1f} ms"),
        ("TTFT p90 (cache on / off)", f"{r.ttft_ms_p90_on:.1f} ms / {r.ttft_ms_p90_off:.1f} ms"),
        ("TTFT p50 in steps (on / off)", f"{r.ttft_steps_p50_on} / {r.ttft_steps_p50_off}"),
        ("hit rate (prompt tokens)", f"{r.hit_rate:.1%}"),
    ]
    if r.hybrid is not None:
        h = r.hybrid
        rows += [
            (
                "checkpoint hit rate (admissions)",
                f"{h.checkpoint_hit_rate:.1%}  "
                f"({h.checkpoints_restored} restored of {h.checkpoints_saved} saved)",
            ),
            (
                "prompt tokens KV alone would skip",
                f"{h.kv_only_skipped_fraction:.1%}  "
                f"({h.lost_checkpoint_tokens:,} lost for want of a checkpoint)",
            ),
        ]
    rows += [
        ("prefill tokens computed", f"{computed:,}  ({computed / total:.1%})"),
        ("prefill tokens skipped", f"{skipped:,}  ({skipped / total:.1%})"),
        (
            "tokens through the model (on / off)",
            f"{r.tokens_computed_on:,} / {r.tokens_computed_off:,}",
        ),
        ("preemptions (cache on)", str(r.preemptions_on)),
        ("steps / wall time (on)", f"{r.steps_on} / {r.wall_s_on:.2f} s"),
        ("steps / wall time (off)", f"{r.steps_off} / {r.wall_s_off:.2f} s"),
        (
            "cache on == cache off",
            f"yes: identical tokens, max |logit diff| {r.max_logit_diff:.2g}"
            if r.cache_on_equals_cache_off
            else "NO",
        ),
    ]
    if plot is not None:
        rows.append(("plot", str(plot)))
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


# -- --replicas N --------------------------------------------------------------------------


def _run_replicas(
    args: argparse.Namespace, sim: ServeSimConfig, config: EngineConfig, turns: Sequence[Turn]
) -> int:
    """``serve-sim --replicas N --router R``: run, report (``--json``: one object), plot."""
    try:
        from prefixkv.events.cluster import report, run_cluster
        from prefixkv.events.transport import EventPublisher  # noqa: F401  (needs pyzmq)
    except ImportError as exc:
        raise RouterConfigError(
            f"--replicas needs the events extra (pip install prefixkv[events]): {exc}"
        ) from None

    if args.replicas is None:
        raise RouterConfigError("--router needs --replicas N")
    result = run_cluster(
        turns,
        config,
        replicas=args.replicas,
        router=args.router or "kv",
        index=args.index,
        stall_timeout_s=args.stall_timeout,
        fail_fast=args.fail_fast,
    )
    ok = result.served_exactly_once and result.mispredictions == 0
    out = {
        "command": "serve-sim",
        "ok": ok,
        "workload": attrs.asdict(sim),
        "model": config.model.version,
        "backend": config.backend,
        "num_blocks": config.num_blocks,
        "block_size": config.block_size,
        **report(result),
    }
    if args.plot is not None:
        plot_replicas(result, args.plot)
        out["plot"] = str(args.plot)
    if args.json:
        emit_json(out)
    else:
        _print_replicas(
            out,
            f"prefixkv serve-sim: {result.replicas} replicas, {config.model.version}, "
            f"{config.num_blocks} blocks x {config.block_size} tokens each",
        )
    if not ok:
        if result.failed:
            why = (
                f"{len(result.failed)} of {len(result.workload)} requests were not served "
                f"({len(result.replica_failures)} replicas failed)"
            )
        elif not result.served_exactly_once:
            why = "a request was not served exactly once"
        else:
            why = (
                f"{result.mispredictions} router mispredictions ({out['mispredicted_under']} "
                f"served fewer tokens than predicted, {out['mispredicted_over']} more; "
                f"{out['changed_while_queued']} found the cache changed while queued)"
            )
        print(f"prefixkv serve-sim: error: {why}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _print_replicas(r: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    total = max(r["prefill_tokens"], 1)
    rows = [
        ("router / index", f"{r['router']} / {r['index']}"),
        (
            "requests (per replica)",
            f"{r['requests']} ({', '.join(map(str, r['requests_per_replica']))})",
        ),
        (
            "requests served / re-routed / failed",
            f"{r['requests_served']} / {r['requests_rerouted']} / {r['requests_failed']}",
        ),
        ("every request served exactly once", "yes" if r["served_exactly_once"] else "NO"),
        ("hit rate (prompt tokens)", f"{r['hit_rate']:.1%}"),
        (
            "prefill tokens saved",
            f"{r['prefill_tokens_skipped']:,} of {r['prefill_tokens']:,}  "
            f"({r['prefill_tokens_skipped'] / total:.1%})",
        ),
        (
            "TTFT p50 / p90 (CPU-model time)",
            f"{r['ttft_ms_p50']:.1f} ms / {r['ttft_ms_p90']:.1f} ms",
        ),
        ("TTFT p50 in steps", str(r["ttft_steps_p50"])),
        (
            "tokens from cache: predicted / served",
            f"{r['predicted_tokens']:,} / {r['cached_tokens']:,}",
        ),
        (
            "router mispredictions",
            f"{r['mispredictions']} of {r['requests']} "
            f"({r['mispredicted_under']} served fewer tokens than predicted, "
            f"{r['mispredicted_over']} more; {r['routed_in_flight']} with events in flight)",
        ),
        ("events rejected by the index / replays", f"{r['rejected_events']} / {r['replays']}"),
        ("ticks / wall time", f"{r['ticks']} / {r['wall_s']:.1f} s"),
    ]
    for f in r["replica_failures"]:
        rows.append(
            (
                f"replica {f['replica']} dropped at tick {f['tick']}",
                f"{f['reason']}; {f['blocks_dropped']} blocks left the index, "
                f"{len(f['rerouted'])} requests re-routed, {len(f['failed'])} failed",
            )
        )
    failed = [e for e in r["request_log"] if e["status"] == "failed"]
    if failed:
        rows.append(("failed requests", ", ".join(f"{e['id']} ({e['reason']})" for e in failed)))
    if "plot" in r:
        rows.append(("plot", r["plot"]))
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
