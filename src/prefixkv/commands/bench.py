"""``prefixkv bench``: what the cache manager costs an engine, measured in fresh processes.

The measurements are :mod:`prefixkv.benchmarks.cache`'s; this command picks their sizes
(``--quick`` or the full run), writes ``docs/benchmarks.md``'s generated section,
``docs/bench/cache.json`` and ``docs/bench/cache_per_block.png``, and prints a summary
(or, under ``--json``, the whole result).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prefixkv.benchmarks.cache import FULL, QUICK, TARGETS, run_bench
from prefixkv.benchmarks.cache_report import VARIANT_LABEL, format_us, write_outputs
from prefixkv.cli import Runner, emit_json
from prefixkv.outputs import to_json

from .support import add_output_flags, logger, output_dir

__all__ = ["setup"]


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``bench`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    # NOTE: imported here so that a missing optional dependency fails the command as it
    # loads, with the registry's one-line message, before any work is done.
    import numpy  # noqa: F401
    import psutil  # noqa: F401
    import pyperf  # noqa: F401

    add_output_flags(
        parser,
        quick="toy sizes, under a minute; writes nothing unless --out is given",
        out="docs directory to write benchmarks.md and bench/ into (default: the source "
        "checkout's docs/, or ./docs, for a full run; nothing for --quick)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="PATH",
        help="another prefixkv source checkout (say, the main branch): its code runs the "
        "life cycle's cases too, side by side in the same rounds, and the report gives "
        "its medians and the ratios",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a target is missed (µs per block, growth, memory, collisions)",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    result = run_bench(
        QUICK if args.quick else FULL, logger("bench", args.json), baseline=args.baseline
    )
    out = output_dir(args)
    written = [str(p) for p in write_outputs(result, out)] if out is not None else []
    ok = result.acceptance.met or not args.strict
    if args.json:
        emit_json({"command": "bench", "ok": ok, **to_json(result), "written": written})
    else:
        _print_summary(to_json(result), written)
    return 0 if ok else 1


def _print_summary(result: dict[str, Any], written: list[str]) -> None:
    """The figures, from the JSON form of the result (as ``cache.json`` holds them)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    life = result["lifecycle"]
    sizes = sorted({r["num_blocks"] for r in life["rows"]})
    table = Table(
        title="engine life cycle, µs per block touched: median (IQR)", title_justify="left"
    )
    table.add_column("call shape")
    for n in sizes:
        table.add_column(f"{n:,} blocks", justify="right")
    for v in life["variants"]:
        table.add_row(
            VARIANT_LABEL[v],
            *(
                format_us(
                    next(r for r in life["rows"] if r["num_blocks"] == n and r["variant"] == v)
                )
                for n in sizes
            ),
        )
    for v in life["variants"][1:]:
        table.add_row(
            f"{v} / per call", *(f"{r[f'{v}_over_percall']:.2f}x" for r in life["ratios"])
        )
    console.print(table)
    cb = result["continuous_batch"]
    for n in sorted({r["num_blocks"] for r in cb["rows"]}):
        cells = ", ".join(
            f"{r['variant']} {format_us(r)}" for r in cb["rows"] if r["num_blocks"] == n
        )
        console.print(f"continuous batch of {cb['running']} at {n:,} blocks: {cells}")
    base = result.get("baseline")
    if base:
        for r in base["rows"]:
            console.print(
                f"baseline {base['commit']}, {r['variant']} at {r['num_blocks']:,} blocks: "
                f"{format_us(r['baseline'])} against {r['this_median_us']:.2f} µs: "
                f"{r['baseline_over_this']:.2f}x"
            )
    sp = result["spec_beside_impl"]
    console.print(
        f"spec beside impl ({sp['requests']} requests, {sp['num_blocks']:,} blocks): impl "
        f"{format_us(sp['impl'])}, spec {format_us(sp['spec'])} µs per block, spec / impl "
        f"{sp['spec_over_impl']:,.0f}x"
    )
    for r in result["memory"]:
        console.print(
            f"memory at {r['num_blocks']:,} blocks: {r['rss_bytes_per_block']:,.0f} B RSS, "
            f"{r['tracemalloc_bytes_per_block']:,.0f} B tracemalloc per cached block"
        )
    for r in result["lookups"]:
        console.print(
            f"lookups, {r['hasher']}: {r['largest_bucket']:,} crafted blocks under one hash, "
            f"{r['largest_index_bucket']:,} under one index key; "
            f"crafted {format_us(r['crafted'])} µs, control {format_us(r['control'])} µs: "
            f"{r['ratio']:.1f}x"
        )
    acc = result["acceptance"]
    for key in TARGETS:
        console.print(f"{'met   ' if acc[key] else 'MISSED'} {key.removesuffix('_ok')}")
    load = result["load_average_1m"]
    console.print(
        f"load average {load['start']:.1f} -> {load['end']:.1f} on "
        f"{result['machine']['logical_cpus']} CPUs: absolute times are indicative only"
    )
    if written:
        console.print("wrote " + ", ".join(written))
