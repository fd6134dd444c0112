"""``prefixkv serve-sim``: serve a chat workload through scheduler, tiny model and cache.

The engine demo. It runs a multi-turn chat workload (shared system prompts, conversations
whose every turn re-sends the history) through :class:`prefixkv.engine.Engine` twice: with
the prefix cache on, then off (every admission in a namespace of its own). It reports time
to first token, the prefill tokens computed against those skipped and the hit rate, and
checks that both runs generated the same greedy tokens, with logits within tolerance (exit
status 1 otherwise). ``--plot`` writes TTFT against the cached fraction of each prompt.

``--replicas N --router {kv,round-robin}`` serves the same workload on N engine replicas,
each a process of its own publishing its KV events, behind a KV-aware router
(:mod:`prefixkv.events.cluster`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ServeSimConfig", "chat_turns", "setup"]


@attrs.frozen
class ServeSimConfig:
    conversations: int = 24
    turns: int = 3
    system_prompts: int = 3
    system_tokens: int = 96
    user_tokens: tuple[int, int] = (8, 24)
    reply_tokens: tuple[int, int] = (6, 12)
    arrival_every: int = 2
    seed: int = 0


def chat_turns(cfg: ServeSimConfig, vocab: int) -> list[Any]:
    """The workload: conversation ``c`` starts at step ``c * arrival_every`` with one of the
    shared system prompts; each later turn follows the previous one (history + new user
    message)."""
    from prefixkv.engine import Turn

    rng = random.Random(cfg.seed)
    systems = [
        [rng.randrange(vocab) for _ in range(cfg.system_tokens)] for _ in range(cfg.system_prompts)
    ]
    turns: list[Turn] = []
    for c in range(cfg.conversations):
        system = systems[rng.randrange(cfg.system_prompts)]
        for t in range(cfg.turns):
            user = [rng.randrange(vocab) for _ in range(rng.randint(*cfg.user_tokens))]
            reply = rng.randint(*cfg.reply_tokens)
            if t == 0:
                turns.append(
                    Turn(f"c{c}t0", [*system, *user], reply, arrival_step=c * cfg.arrival_every)
                )
            else:
                turns.append(Turn(f"c{c}t{t}", user, reply, follows=f"c{c}t{t - 1}"))
    return turns


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def setup(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    d = ServeSimConfig()
    parser.add_argument(
        "--conversations",
        type=_positive,
        default=d.conversations,
        metavar="N",
        help=f"conversations (default: {d.conversations})",
    )
    parser.add_argument(
        "--turns",
        type=_positive,
        default=d.turns,
        metavar="N",
        help=f"turns per conversation (default: {d.turns})",
    )
    parser.add_argument(
        "--system-tokens",
        type=_positive,
        default=d.system_tokens,
        metavar="N",
        help=f"tokens per shared system prompt (default: {d.system_tokens})",
    )
    parser.add_argument(
        "--num-blocks",
        type=_positive,
        default=512,
        metavar="N",
        help="KV pool size in blocks (default: 512)",
    )
    parser.add_argument(
        "--block-size", type=_positive, default=8, metavar="N", help="tokens per block (default: 8)"
    )
    parser.add_argument(
        "--budget",
        type=_positive,
        default=128,
        metavar="N",
        help="token budget per step (default: 128)",
    )
    parser.add_argument(
        "--draft-tokens",
        type=int,
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
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="workload and weights seed (default: 0)"
    )
    parser.add_argument(
        "--replicas",
        type=int,
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
        metavar="{auto,dynamo,mirror}",
        help="with --replicas: the router's index; auto is Dynamo's RadixTree when "
        "ai-dynamo-runtime is installed, else prefixkv's mirror (default: auto)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a PNG of TTFT against the cached fraction of each prompt",
    )
    return _run


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _configs(args: argparse.Namespace) -> tuple[ServeSimConfig, Any]:
    """The workload and the engine configuration the flags describe."""
    from prefixkv.engine import EngineConfig, ModelConfig
    from prefixkv.engine.policy import SchedulerConfig

    sim = ServeSimConfig(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        seed=args.seed,
    )
    config = EngineConfig(
        model=ModelConfig(seed=args.seed, hybrid=args.hybrid),
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.budget,
            min_prefill_tokens=min(32, args.budget // 4),
            num_draft_tokens=args.draft_tokens,
        ),
        backend=args.backend,
        device=args.device,
        record_logits=True,
    )
    return sim, config


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from prefixkv.cli import EXIT_FAILURE, emit_json
    from prefixkv.engine import TOLERANCE, Engine, EqualityMismatch, compare_runs
    from prefixkv.engine.engine import RunResult

    sim, config = _configs(args)
    model = config.model
    turns = chat_turns(sim, model.vocab_size)
    if args.replicas is not None or args.router is not None:
        from prefixkv.serve_replicas import run_from_args

        return run_from_args(args, sim, attrs.evolve(config, record_logits=False), turns)
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=args.json,
        transient=True,
    )
    runs: dict[str, RunResult] = {}
    with progress:
        for label, enabled in (("cache on ", True), ("cache off", False)):
            task = progress.add_task(f"serving, {label}", total=len(turns))
            engine = Engine(attrs.evolve(config, cache_enabled=enabled))

            def advance(e: Engine, _: object, task: Any = task) -> None:
                done = sum(1 for g in e.scheduler.generations if g.finished)
                progress.update(task, completed=done)

            runs["on" if enabled else "off"] = engine.run(turns, on_step=advance)
    on, off = runs["on"], runs["off"]
    try:
        max_diff, compared = compare_runs(on, off, TOLERANCE[model.dtype])
        equal, mismatch = True, ""
    except EqualityMismatch as exc:
        max_diff, compared, equal, mismatch = float("nan"), 0, False, str(exc)
    report = _report(on, off, sim, config, equal, max_diff, compared)
    if args.plot is not None:
        _plot(on, off, args.plot)
        report["plot"] = str(args.plot)
    if args.json:
        report["mismatch"] = mismatch
        emit_json(report)
    else:
        _print(report)
    if not equal:
        # Not a CommandError: the report (with ok=false) is already the one JSON document.
        print(f"prefixkv serve-sim: error: cache on != cache off: {mismatch}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _report(
    on: Any, off: Any, sim: ServeSimConfig, config: Any, equal: bool, max_diff: float, compared: int
) -> dict[str, Any]:
    def ttft(run: Any) -> list[float]:
        return [r.ttft_s * 1e3 for r in run.requests.values()]

    stats = on.cache
    hybrid: dict[str, Any] = {}
    if config.model.hybrid:
        # A hybrid hit needs a Ready checkpoint at its boundary: every hit is a restore,
        # and the KV past the deepest checkpoint is lost reuse of kind "checkpoint".
        prompt = max(stats.prefill_tokens, 1)
        hybrid = {
            "checkpoint_hit_rate": (
                stats.checkpoints_restored / stats.admissions if stats.admissions else 0.0
            ),
            "checkpoints_saved": stats.checkpoints_saved,
            "checkpoints_restored": stats.checkpoints_restored,
            "checkpoints_evicted": stats.checkpoints_evicted,
            "lost_checkpoint_tokens": stats.lost_checkpoint,
            "kv_only_skipped_fraction": (
                (stats.prefill_tokens_skipped + stats.lost_checkpoint) / prompt
            ),
        }
    return {
        "command": "serve-sim",
        "ok": equal,
        "workload": attrs.asdict(sim),
        "model": config.model.version,
        "backend": config.backend,
        "num_blocks": config.num_blocks,
        "block_size": config.block_size,
        "requests": len(on.requests),
        "generated_tokens": compared or sum(len(r.output) for r in on.requests.values()),
        "cache_on_equals_cache_off": equal,
        "max_logit_diff": max_diff,
        "ttft_ms_p50_on": _percentile(ttft(on), 0.5),
        "ttft_ms_p50_off": _percentile(ttft(off), 0.5),
        "ttft_ms_p90_on": _percentile(ttft(on), 0.9),
        "ttft_ms_p90_off": _percentile(ttft(off), 0.9),
        "ttft_steps_p50_on": statistics.median(r.ttft_steps for r in on.requests.values()),
        "ttft_steps_p50_off": statistics.median(r.ttft_steps for r in off.requests.values()),
        "prefill_tokens_computed": stats.prefill_tokens_computed,
        "prefill_tokens_skipped": stats.prefill_tokens_skipped,
        "prefill_tokens_computed_off": off.cache.prefill_tokens_computed,
        "hit_rate": stats.hit_rate,
        "tokens_computed_on": on.tokens_computed,
        "tokens_computed_off": off.tokens_computed,
        "preemptions_on": on.scheduler.preemptions,
        "steps_on": on.steps,
        "steps_off": off.steps,
        "wall_s_on": on.wall_s,
        "wall_s_off": off.wall_s,
        **hybrid,
    }


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    w = r["workload"]
    table = Table(
        title=f"prefixkv serve-sim: {r['model']}, {r['num_blocks']} blocks x "
        f"{r['block_size']} tokens, backend {r['backend']}",
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    computed, skipped = r["prefill_tokens_computed"], r["prefill_tokens_skipped"]
    total = max(computed + skipped, 1)
    rows = [
        (
            "workload",
            f"{w['conversations']} conversations x {w['turns']} turns, "
            f"{w['system_prompts']} shared system prompts of {w['system_tokens']} "
            f"tokens",
        ),
        ("requests / generated tokens", f"{r['requests']} / {r['generated_tokens']}"),
        (
            "TTFT p50 (cache on / off)",
            f"{r['ttft_ms_p50_on']:.1f} ms / {r['ttft_ms_p50_off']:.1f} ms",
        ),
        (
            "TTFT p90 (cache on / off)",
            f"{r['ttft_ms_p90_on']:.1f} ms / {r['ttft_ms_p90_off']:.1f} ms",
        ),
        ("TTFT p50 in steps (on / off)", f"{r['ttft_steps_p50_on']} / {r['ttft_steps_p50_off']}"),
        ("hit rate (prompt tokens)", f"{r['hit_rate']:.1%}"),
        ("prefill tokens computed", f"{computed:,}  ({computed / total:.1%})"),
        ("prefill tokens skipped", f"{skipped:,}  ({skipped / total:.1%})"),
        (
            "tokens through the model (on / off)",
            f"{r['tokens_computed_on']:,} / {r['tokens_computed_off']:,}",
        ),
        ("preemptions (cache on)", str(r["preemptions_on"])),
        ("steps / wall time (on)", f"{r['steps_on']} / {r['wall_s_on']:.2f} s"),
        ("steps / wall time (off)", f"{r['steps_off']} / {r['wall_s_off']:.2f} s"),
        (
            "cache on == cache off",
            f"yes: identical tokens, max |logit diff| {r['max_logit_diff']:.2g}"
            if r["cache_on_equals_cache_off"]
            else "NO",
        ),
    ]
    if "checkpoint_hit_rate" in r:
        rows[6:6] = [
            (
                "checkpoint hit rate (admissions)",
                f"{r['checkpoint_hit_rate']:.1%}  "
                f"({r['checkpoints_restored']} restored of {r['checkpoints_saved']} saved)",
            ),
            (
                "prompt tokens KV alone would skip",
                f"{r['kv_only_skipped_fraction']:.1%}  "
                f"({r['lost_checkpoint_tokens']:,} lost for want of a checkpoint)",
            ),
        ]
    if "plot" in r:
        rows.append(("plot", r["plot"]))
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


def _plot(on: Any, off: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.cached_fraction for r in on.requests.values()]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.scatter(xs, [r.ttft_s * 1e3 for r in on.requests.values()], s=14, label="cache on")
    ax.scatter(
        xs,
        [off.requests[k].ttft_s * 1e3 for k in on.requests],
        s=14,
        marker="x",
        color="gray",
        label="cache off (same request)",
    )
    ax.set_xlabel("cached fraction of the prompt (cache-on run)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("serve-sim: TTFT against cached prefix")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
