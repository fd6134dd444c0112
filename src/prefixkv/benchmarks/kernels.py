"""The kernel benchmark's report: ``kernels.md``, ``kernels.json`` and two figures.

:func:`prefixkv.kernels.bench.run` measures; this module writes what it measured, with the
shared report helpers (:mod:`prefixkv.outputs`), so that ``kernels/`` stays a library of kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixkv.outputs import figure, write_json

__all__ = ["markdown_report", "plot", "write_outputs"]


def _f(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def markdown_report(r: dict[str, Any]) -> str:
    """The whole of ``kernels.md``: ceilings, data movement, prefill and decode tables."""
    c = r["ceilings"]
    lines = [
        f"# prefixkv kernel benchmark: {r['device']}",
        "",
        f"torch {r['torch']}, triton {r['triton']}, {r['dtype']}, heads q/kv "
        f"{r['heads']['q']}/{r['heads']['kv']}, head_dim {r['heads']['head_dim']}, "
        f"page size {r['heads']['page_size']}, {r['timestamp']}"
        + (" (DRY RUN: interpreter, timings meaningless)" if r["dry_run"] else ""),
        "",
        f"Ceilings: copy {_f(c['copy_gbps'], 1)} GB/s (read + write), "
        f"bf16 matmul {_f(c['bf16_matmul_tflops'], 1)} TFLOP/s.",
        "",
        "## Data movement",
        "",
        "| kernel | shape | ms | GB/s | of copy |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {m['kernel']} | {m['shape']} | {_f(m['ms'], 3)} | {_f(m['gbps'], 1)} | "
        f"{_f(100 * m['frac_of_copy'], 0)}% |"
        for m in r["movement"]
    ]
    lines += [
        "",
        "## Prefix-prefill attention (TFLOP/s, causal FLOPs)",
        "",
        "| context | cached | batch | backend | ms | TFLOP/s | of matmul |",
        "| ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for p in r["prefill"]:
        if p["error"]:
            lines.append(
                f"| {p['context']} | {p['cached_frac']:.0%} | {p['batch']} | "
                f"{p['backend']} | unsupported: {p['error'][:80]} | | |"
            )
        else:
            lines.append(
                f"| {p['context']} | {p['cached_frac']:.0%} | {p['batch']} | "
                f"{p['backend']} | {_f(p['ms'], 3)} | {_f(p['tflops'], 1)} | "
                f"{_f(100 * p['frac_of_matmul'], 0)}% |"
            )
    lines += [
        "",
        "## Decode attention (split-K)",
        "",
        "| batch | context | splits | ms | GB/s | of copy |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {d['batch']} | {d['context']} | {d['splits']} | {_f(d['ms'], 3)} | "
        f"{_f(d['gbps'], 1)} | {_f(100 * d['frac_of_copy'], 0)}% |"
        for d in r["decode"]
    ]
    return "\n".join(lines) + "\n"


def write_outputs(r: dict[str, Any], folder: Path) -> list[Path]:
    """Write ``kernels.json``, ``kernels.md`` and the figures into ``folder``."""
    paths = [write_json(folder / "kernels.json", r), folder / "kernels.md"]
    paths[1].write_text(markdown_report(r), encoding="utf-8")
    paths += plot(r, folder)
    return paths


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """Prefill TFLOP/s per cached fraction, and every kernel's share of copy bandwidth."""
    title = r["device"] + (" (dry run)" if r["dry_run"] else "")
    paths = [folder / "kernels_prefill.png", folder / "kernels_bandwidth.png"]
    fracs = sorted({p["cached_frac"] for p in r["prefill"]})
    with figure(paths[0], dpi=120) as plt:
        fig, axes = plt.subplots(1, len(fracs), figsize=(5 * len(fracs), 4), squeeze=False)
        for ax, frac in zip(axes[0], fracs, strict=True):
            for backend in sorted({p["backend"] for p in r["prefill"]}):
                pts = [
                    (p["context"], p["tflops"])
                    for p in r["prefill"]
                    if p["cached_frac"] == frac and p["backend"] == backend and p["tflops"]
                ]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=backend)
            ax.axhline(r["ceilings"]["bf16_matmul_tflops"], ls="--", c="grey", label="bf16 matmul")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"prefill, {frac:.0%} cached")
            ax.legend(fontsize=7)
        fig.suptitle(title)
    with figure(paths[1], dpi=120) as plt:
        _, ax = plt.subplots(figsize=(8, 4))
        labels = [m["kernel"] for m in r["movement"]] + [
            f"decode b{d['batch']} {d['context']}" for d in r["decode"]
        ]
        values = [100 * m["frac_of_copy"] for m in r["movement"]] + [
            100 * d["frac_of_copy"] for d in r["decode"]
        ]
        ax.barh(labels, values)
        ax.axvline(100, ls="--", c="grey")
        ax.set_xlabel("% of measured copy bandwidth")
        ax.set_title(title)
    return paths
