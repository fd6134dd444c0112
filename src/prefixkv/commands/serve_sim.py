"""``prefixkv serve-sim --replicas N --router R``: the command's side of multi-replica serving.

:mod:`prefixkv.events.cluster` runs the replicas and the router; this module turns the
result into the command's report (a table, or one JSON object under ``--json``), its plot
and its exit status (1 on a misprediction, or a request not served exactly once).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import attrs

from prefixkv.events.router import RouterConfigError

__all__ = ["plot_requests", "print_report", "run_from_args"]


def print_report(r: dict[str, Any], title: str) -> None:
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
            "router mispredictions",
            f"{r['mispredictions']} of {r['routed_checked']} checked "
            f"({r['routed_in_flight']} with events in flight)",
        ),
        ("events rejected by the index / replays", f"{r['rejected_events']} / {r['replays']}"),
        ("ticks / wall time", f"{r['ticks']} / {r['wall_s']:.1f} s"),
    ]
    if "plot" in r:
        rows.append(("plot", r["plot"]))
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


def run_from_args(args: Any, sim: Any, engine_config: Any, turns: Sequence[Any]) -> int:
    """``serve-sim --replicas N --router R``: run, report (``--json``: one object), plot."""
    from prefixkv.cli import EXIT_FAILURE, emit_json

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
        engine_config,
        replicas=args.replicas,
        router=args.router or "kv",
        index=args.index,
    )
    r = report(result)
    ok = result.served_exactly_once and result.mispredictions == 0
    out = {
        "command": "serve-sim",
        "ok": ok,
        "workload": attrs.asdict(sim),
        "model": engine_config.model.version,
        "backend": engine_config.backend,
        "num_blocks": engine_config.num_blocks,
        "block_size": engine_config.block_size,
        **r,
    }
    if args.plot is not None:
        plot_requests(result, args.plot)
        out["plot"] = str(args.plot)
    if args.json:
        emit_json(out)
    else:
        print_report(
            out,
            f"prefixkv serve-sim: {result.replicas} replicas, {engine_config.model.version}, "
            f"{engine_config.num_blocks} blocks x {engine_config.block_size} tokens each",
        )
    if not ok:
        print(
            "prefixkv serve-sim: error: "
            + (
                "a request was not served exactly once"
                if not result.served_exactly_once
                else f"{result.mispredictions} router mispredictions"
            ),
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return 0


def plot_requests(result: Any, path: Any) -> None:
    """TTFT against the cached fraction of each prompt, one colour per replica."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for replica in range(result.replicas):
        reqs = [r for r in result.requests.values() if r.replica == replica]
        ax.scatter(
            [r.cached_tokens / r.prompt_tokens for r in reqs],
            [r.ttft_s * 1e3 for r in reqs],
            s=14,
            label=f"replica {replica}",
        )
    ax.set_xlabel("cached fraction of the prompt")
    ax.set_ylabel("time to first token (ms, CPU-model time)")
    ax.set_title(f"serve-sim, {result.replicas} replicas, router {result.router}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
