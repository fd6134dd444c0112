"""``prefixkv bench``'s outputs: the generated section of ``docs/benchmarks.md``, the plot
and ``cache.json``, each rendered from the JSON form of a
:class:`~prefixkv.benchmarks.cache.CacheBenchResult`, so that a saved ``cache.json`` renders
again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixkv.outputs import GeneratedSection, figure, to_json, write_json

from .cache import (
    TARGET_BYTES_PER_BLOCK,
    TARGET_COLLISION_RATIO,
    TARGET_GROWTH,
    TARGET_US_FUSED,
    TARGET_US_PERCALL,
    CacheBenchResult,
)

__all__ = [
    "BEGIN",
    "END",
    "VARIANT_LABEL",
    "format_us",
    "plot",
    "render_markdown",
    "write_markdown",
    "write_outputs",
]

#: The section of ``docs/benchmarks.md`` that ``prefixkv bench`` rewrites.
SECTION = GeneratedSection(
    command="prefixkv bench",
    header="""# Benchmarks

Measured with `prefixkv bench` (`python -m prefixkv bench`), which rewrites the section between
the markers below, `bench/cache.json` and `bench/cache_per_block.png`.

""",
)
BEGIN = SECTION.begin
END = SECTION.end

VARIANT_LABEL = {
    "percall": "per call (append + commit)",
    "fused": "fused (advance)",
    "batched": "batched (advance_batch)",
    "columns": "batched columns (advance_columns)",
}


def format_us(row: dict[str, Any]) -> str:
    """A summary's median and interquartile range, in µs: ``median (q1-q3)``."""
    return f"{row['median_us']:.2f} ({row['q1_us']:.2f}-{row['q3_us']:.2f})"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 'es' if noun.endswith('s') else 's'}"


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render_markdown(result: dict[str, Any]) -> str:
    """The generated section of ``docs/benchmarks.md``.

    Args:
        result: the JSON form of a result (:func:`~prefixkv.outputs.to_json`).

    Returns:
        The section, markers included.
    """
    lines = [BEGIN, "", *_method(result), *_lifecycle(result["lifecycle"])]
    lines += _baseline(result.get("baseline"))
    lines += _continuous_batch(result["continuous_batch"])
    lines += _spec_beside_impl(result["spec_beside_impl"])
    lines += _memory(result["memory"])
    lines += _lookups(result["lookups"])
    lines += _targets(result["acceptance"])
    return "\n".join([*lines, END]) + "\n"


def _method(result: dict[str, Any]) -> list[str]:
    m = result["machine"]
    load = result["load_average_1m"]
    meth = result["method"]
    return [
        f"Measured {result['date']} on {m['cpu']} ({m['logical_cpus']} logical CPUs), "
        f"{m['os']}, {m['python']}. The machine was shared and loaded while it ran (1-minute "
        f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end): "
        "absolute times are indicative only; the ratios, measured side by side in one run, "
        "are the figures to compare.",
        "",
        f"Each figure is the median of the values of {meth['rounds']} rounds x "
        f"{_n(meth['processes_per_round'], 'fresh worker process')} x "
        f"{_n(meth['values_per_process'], 'value')} (after "
        f"{_n(meth['warmups_per_process'], 'warm-up value')} per process; the spec: "
        f"{_n(meth['spec_values_per_process'], 'value')} after "
        f"{meth['spec_warmups_per_process']}); in brackets, the interquartile range of those "
        "values.",
        "",
    ]


def _shape_table(life: dict[str, Any]) -> list[str]:
    """One row per call shape, one column per pool size, then each shape over per call."""
    sizes = sorted({r["num_blocks"] for r in life["rows"]})
    lines = [
        "| call shape | " + " | ".join(f"{n:,} blocks" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for v in life["variants"]:
        cells = [
            format_us(next(r for r in life["rows"] if r["num_blocks"] == n and r["variant"] == v))
            for n in sizes
        ]
        lines.append(f"| {VARIANT_LABEL[v]} | " + " | ".join(cells) + " |")
    for v in life["variants"][1:]:
        cells = [f"{r[f'{v}_over_percall']:.2f}x" for r in life["ratios"]]
        lines.append(f"| {v} / per call | " + " | ".join(cells) + " |")
    return lines


def _lifecycle(life: dict[str, Any]) -> list[str]:
    sizes = sorted({r["num_blocks"] for r in life["rows"]})
    first = {n: next(r for r in life["rows"] if r["num_blocks"] == n) for n in sizes}
    lines = ["### Engine life cycle: µs per block touched", "", *_shape_table(life)]
    lines += [
        "| hit rate | " + " | ".join(f"{first[n]['hit_rate']:.1%}" for n in sizes) + " |",
        "| evictions | " + " | ".join(f"{first[n]['evictions']:,}" for n in sizes) + " |",
        "",
        f"{first[sizes[0]]['requests']:,} requests, {first[sizes[0]]['blocks_touched']:,} "
        "blocks touched. Every call shape did exactly the same thing (same hits, evictions and "
        "published blocks), checked by an untimed replay of each.",
    ]
    if life["variants_missing"]:
        lines += [
            "",
            "Not measured: " + ", ".join(life["variants_missing"]) + " (this build of the "
            "manager does not offer those calls).",
        ]
    return lines


def _baseline(base: dict[str, Any] | None) -> list[str]:
    if not base:
        return []
    lines = [
        "",
        f"### Against the baseline (commit {base['commit']}), µs per block touched",
        "",
        "The same cases with the baseline checkout's code (`prefixkv bench --baseline "
        "PATH`), each run right after this checkout's in every round. The ratio is the "
        "baseline's median over this checkout's: above 1, this checkout is faster.",
        "",
        "| call shape | pool (blocks) | baseline | this | baseline / this |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in base["rows"]:
        lines.append(
            f"| {VARIANT_LABEL[r['variant']]} | {r['num_blocks']:,} | "
            f"{format_us(r['baseline'])} | {r['this_median_us']:.2f} | "
            f"{r['baseline_over_this']:.2f}x |"
        )
    return lines


def _continuous_batch(cb: dict[str, Any]) -> list[str]:
    if not cb["rows"]:
        return []
    return [
        "",
        f"### Continuous batch: {cb['running']} requests decoding at once, µs per block touched",
        "",
        "The same trace, admitted in order into a batch of "
        f"{cb['running']} running requests, each step decoding one token of every one; "
        "a batched step now holds up to that many sequences. A different schedule from "
        "the table above (other hits, other evictions): compare within this table.",
        "",
        *_shape_table(cb),
    ]


def _spec_beside_impl(sp: dict[str, Any]) -> list[str]:
    return [
        "",
        "### The spec beside the impl (small trace, small pool)",
        "",
        f"The spec is the readable definition and its cost per call grows with the pool, so it "
        f"runs only a small trace: "
        f"{sp['requests']} requests, {sp['blocks_touched']:,} blocks touched, "
        f"{sp['num_blocks']:,} blocks, per-call shape.",
        "",
        "| manager | µs per block touched |",
        "|---|---:|",
        f"| impl | {format_us(sp['impl'])} |",
        f"| spec | {format_us(sp['spec'])} |",
        f"| spec / impl | {sp['spec_over_impl']:,.0f}x |",
    ]


def _memory(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Host memory per cached block",
        "",
        "| pool (blocks) | cached blocks | RSS bytes / block | tracemalloc bytes / block |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['num_blocks']:,} | {r['cached_blocks']:,} | {r['rss_bytes_per_block']:,.0f} | "
            f"{r['tracemalloc_bytes_per_block']:,.0f} |"
        )
    return lines


def _lookups(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Crafted collisions: µs per lookup (`match`)",
        "",
        "The crafted blocks share one key under the hasher (its identity hash, which KV "
        "events carry); the index column is the most crafted blocks the manager's own index "
        "files under one key.",
        "",
        "| hasher | crafted blocks under one hash | under one index key | crafted | control "
        "| crafted / control |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['hasher']} | {r['largest_bucket']:,} | {r['largest_index_bucket']:,} | "
            f"{format_us(r['crafted'])} | {format_us(r['control'])} | {r['ratio']:.1f}x |"
        )
    return lines


def _targets(acc: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "### Targets (issue 16 and 17)",
        "",
        f"- per call at most {TARGET_US_PERCALL:g} µs per block at every size: "
        f"{_met(acc['percall_ok'])} (worst median {acc['percall_worst_us']:.2f} µs)",
    ]
    if acc["fused_or_batched_worst_us"] is None:
        lines.append(f"- fused or batched at most {TARGET_US_FUSED:g} µs: not measured")
    else:
        lines.append(
            f"- fused or batched at most {TARGET_US_FUSED:g} µs per block at every size: "
            f"{_met(acc['fused_or_batched_ok'])} (worst median "
            f"{acc['fused_or_batched_worst_us']:.2f} µs)"
        )
    return [
        *lines,
        f"- cost per block does not grow with the pool (largest / smallest at most "
        f"{TARGET_GROWTH:g}x): {_met(acc['growth_ok'])} ({acc['percall_growth']:.2f}x)",
        f"- at most {TARGET_BYTES_PER_BLOCK:g} bytes per cached block at the largest pool: "
        f"{_met(acc['bytes_per_block_ok'])} ({acc['largest_pool_rss_bytes_per_block']:,.0f} "
        f"RSS, {acc['largest_pool_tracemalloc_bytes_per_block']:,.0f} tracemalloc)",
        f"- crafted-collision lookups at most {TARGET_COLLISION_RATIO:g}x the control, default "
        f"hasher: {_met(acc['collision_ok'])} ({acc['collision_ratio_default']:.1f}x)",
        "",
        "![µs per block touched and bytes per cached block against pool size]"
        "(bench/cache_per_block.png)",
        "",
    ]


def write_markdown(path: Path, section: str) -> None:
    """Replace the generated section of ``path``, keeping the hand-written text around it."""
    SECTION.write(path, section)


def plot(result: dict[str, Any], path: Path) -> None:
    """µs per block touched (median, interquartile bars) and bytes per cached block against
    the pool size, from the JSON form of a result. This run's figures only: other engines'
    never share its axes."""
    with figure(path, metadata={"Software": None}) as plt:
        _draw(plt, result)


def _draw(plt: Any, result: dict[str, Any]) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), dpi=110)
    life = result["lifecycle"]
    markers = {"percall": "o", "fused": "s", "batched": "^", "columns": "D"}
    for v in life["variants"]:
        rows = sorted((r for r in life["rows"] if r["variant"] == v), key=lambda r: r["num_blocks"])
        xs = [r["num_blocks"] for r in rows]
        ys = [r["median_us"] for r in rows]
        err = [[y - r["q1_us"] for y, r in zip(ys, rows, strict=True)],
               [r["q3_us"] - y for y, r in zip(ys, rows, strict=True)]]  # fmt: skip
        left.errorbar(xs, ys, yerr=err, marker=markers[v], capsize=3, label=VARIANT_LABEL[v])
    left.axhline(TARGET_US_PERCALL, color="black", lw=0.8, ls="-.", label="target, per call")
    left.axhline(TARGET_US_FUSED, color="gray", lw=0.8, ls=":", label="target, fused or batched")
    left.set_xscale("log", base=2)
    left.set_ylim(bottom=0)
    left.set_xlabel("pool size (blocks of 16 tokens)")
    left.set_ylabel("µs per block touched (median)")
    left.set_title("Engine life cycle, chat trace", fontsize=10)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    mem = result["memory"]
    xs = [r["num_blocks"] for r in mem]
    right.plot(xs, [r["rss_bytes_per_block"] for r in mem], "-o", label="RSS")
    right.plot(xs, [r["tracemalloc_bytes_per_block"] for r in mem], "-s", label="tracemalloc")
    right.axhline(TARGET_BYTES_PER_BLOCK, color="black", lw=0.8, ls="-.", label="target")
    right.set_xscale("log", base=2)
    right.set_ylim(bottom=0)
    right.set_xlabel("pool size (blocks of 16 tokens)")
    right.set_ylabel("bytes per cached block")
    right.set_title("Host memory, pool filled with distinct prompts", fontsize=10)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(
        f"prefixkv, {result['date']}, {result['machine']['logical_cpus']}-CPU machine, shared "
        "and loaded: absolute times indicative only",
        fontsize=9,
    )


def write_outputs(result: CacheBenchResult, out: Path) -> list[Path]:
    """Write ``bench/cache.json``, ``bench/cache_per_block.png`` and ``benchmarks.md``."""
    data = to_json(result)
    bench_dir = out / "bench"
    json_path = write_json(bench_dir / "cache.json", data)
    png_path = bench_dir / "cache_per_block.png"
    plot(data, png_path)
    md_path = out / "benchmarks.md"
    write_markdown(md_path, render_markdown(data))
    return [md_path, json_path, png_path]
