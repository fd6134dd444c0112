"""``prefixkv bench``: how fast the cache manager is, and how that scales with the pool.

Two measurements, one run:

1. **Operations per second, impl against spec**, on the same operation stream, at 10^3 and
   10^6 blocks. The spec deep-copies its state on every operation (O(pool)), so each
   measurement runs for a time budget and reports operations per second; at 10^6 blocks the
   spec gets through only a handful. This shows the speed-up and, more to the point, that
   the impl's cost per operation does not depend on the pool size.
2. **CPU time per block touched** on the multi-turn chat workload of
   :mod:`prefixkv.workloads` (impl only), at 4,096 blocks (the pool is far too small:
   eviction runs constantly) and 1,048,576 blocks (nothing is ever evicted). This is the
   figure engines quote for their block managers, so ours can be set beside theirs.

Only cache calls are timed: token lists, requests and schedules are generated beforehand,
and the timed loop contains nothing but the calls an engine would make and the loop that
issues them. Timing uses ``time.perf_counter_ns`` with the garbage collector enabled, as in
a real server; every chat size is run several times and the best run is reported.

Results go to ``docs/bench/cache.json``, ``docs/bench/cache_per_block.png`` and a generated
section of ``docs/benchmarks.md`` (the hand-written text around it is preserved).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain, cycle
from pathlib import Path
from typing import Any

import attrs

from prefixkv.spec import Namespace, OutOfBlocks, PrefixCache, Request, SeqId, SpecCache
from prefixkv.workloads import ChatConfig, ChatWorkload, chat_workload

__all__ = [
    "FULL",
    "QUICK",
    "QUOTED",
    "BenchConfig",
    "OpsResult",
    "chat_per_block",
    "machine_info",
    "ops_per_second",
    "run_bench",
    "setup",
]

NAMESPACE = Namespace("prefixkv-bench@1")


@attrs.frozen
class BenchConfig:
    """Sizes and budgets of one benchmark run."""

    ops_sizes: tuple[int, ...]
    ops_budget_impl_s: float
    ops_budget_spec_s: float
    ops_repeats_impl: int
    spec_min_ops: int
    chat_sizes: tuple[int, ...]
    chat: ChatConfig
    chat_live: int
    chat_repeats: int
    block_size: int = 16


#: The real benchmark.
FULL = BenchConfig(
    ops_sizes=(1_000, 1_000_000),
    ops_budget_impl_s=1.0,
    ops_budget_spec_s=2.5,
    ops_repeats_impl=3,
    spec_min_ops=2,
    chat_sizes=(4_096, 1_048_576),
    chat=ChatConfig(),
    chat_live=32,
    chat_repeats=5,
)

#: Small sizes that exercise every code path in seconds (for tests and smoke runs).
QUICK = BenchConfig(
    ops_sizes=(1_000, 10_000),
    ops_budget_impl_s=0.2,
    ops_budget_spec_s=0.3,
    ops_repeats_impl=1,
    spec_min_ops=2,
    chat_sizes=(160, 65_536),
    chat=ChatConfig(
        conversations=16, turns=3, system_tokens=256, user_tokens=(20, 60), reply_tokens=(8, 24)
    ),
    chat_live=8,
    chat_repeats=2,
)

#: Figures other engines report for the same chat workload, in us per block touched.
#: Quoted, not measured here: they are plotted and tabled as such.
QUOTED: tuple[dict[str, Any], ...] = (
    {"engine": "vLLM v1", "us_per_block": {"4096": 5.5, "1048576": 5.5}, "note": "flat"},
    {
        "engine": "SGLang radix cache",
        "us_per_block_range": [4.6, 7.5],
        "note": "range over pool sizes",
    },
    {"engine": "nano-vllm", "us_per_block": {"4096": 3.1, "1048576": 1800.0}, "note": ""},
)

TARGET_US_PER_BLOCK = 2.0
AIM_US_PER_BLOCK = 1.0
TARGET_SPEEDUP = 20.0
TARGET_SCALING = 2.0


def _make(kind: str, num_blocks: int, block_size: int) -> PrefixCache:
    if kind == "spec":
        return SpecCache(num_blocks, block_size)
    from prefixkv.impl import PrefixCacheManager

    return PrefixCacheManager(num_blocks, block_size)


# -- machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "processor\t: ")):
                    _, _, value = line.partition(":")
                    if value.strip() and not value.strip().isdigit():
                        return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: they mean little without it."""
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "os": f"{platform.system()} {platform.machine()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


# -- 1. operations per second ------------------------------------------------------------

# Operation kinds of the ops stream.
_ADMIT, _PREFILL, _APPEND, _COMMIT, _FREE = range(5)
_Op = tuple[int, int, Any]


@attrs.frozen
class OpsResult:
    kind: str
    num_blocks: int
    ops: int
    elapsed_s: float

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s

    @property
    def us_per_op(self) -> float:
        return 1e6 * self.elapsed_s / self.ops


def _op_stream(*, variants: int = 16, live: int = 4, decode: int = 4) -> Iterator[_Op]:
    """An endless admit/commit/append/free stream over a shared-prefix workload.

    Each cycle admits one of ``variants`` prompts (a 256-token shared prefix and a distinct
    tail of 24-63 tokens), commits its prefill, decodes ``decode`` tokens (append + commit)
    and frees the sequence admitted ``live`` cycles earlier: 3 + 2 * decode operations. The
    working set is bounded (the same prompts come back), so the stream fits in 10^3 blocks
    for ever and never evicts: both caches run exactly the same operations at both sizes.
    (Decoded tokens are the same every time too, so a block they fill comes back as well.)
    """
    prefix = list(range(1000, 1000 + 256))
    prompts = [
        tuple(prefix + [5000 + 100 * v + i for i in range(24 + (v * 5) % 40)])
        for v in range(variants)
    ]
    ids = 2 * live  # a seq id is reused only long after it was freed
    period = variants * ids // _gcd(variants, ids)

    def cycle_ops(c: int, with_free: bool) -> list[_Op]:
        sid = c % ids
        ops: list[_Op] = [
            (_ADMIT, sid, Request(sid, prompts[c % variants], NAMESPACE)),
            (_PREFILL, sid, (7,)),
        ]
        for t in range(decode):
            ops += [(_APPEND, sid, None), (_COMMIT, sid, (8 + t,))]
        if with_free:
            ops.append((_FREE, sid, [(c - live) % ids]))
        return ops

    prologue = [op for c in range(live) for op in cycle_ops(c, with_free=False)]
    prologue += [op for c in range(live, period) for op in cycle_ops(c, with_free=True)]
    body = [op for c in range(period, 2 * period) for op in cycle_ops(c, with_free=True)]
    return chain(prologue, cycle(body))


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _drive_ops(
    cache: PrefixCache, stream: Iterator[_Op], budget_s: float, min_ops: int
) -> tuple[int, int]:
    """Run ``stream`` until ``budget_s`` has passed and ``min_ops`` ran; (ops, elapsed ns).

    The same interpreter loop (and its clock read after every operation) runs both caches.
    """
    admit, commit, append, free = cache.admit, cache.commit, cache.append, cache.free
    scheduled: dict[SeqId, int] = {}
    clock = time.perf_counter_ns
    ops = 0
    start = clock()
    deadline = start + int(budget_s * 1e9)
    now = start
    for kind, sid, arg in stream:
        if kind == _APPEND:
            append(sid, 1)
        elif kind == _COMMIT:
            commit(sid, 1, arg)
        elif kind == _ADMIT:
            scheduled[sid] = admit(arg).num_scheduled_tokens
        elif kind == _PREFILL:
            commit(sid, scheduled[sid], arg)
        else:
            free(arg)
        ops += 1
        now = clock()
        if now >= deadline and ops >= min_ops:
            break
    return ops, now - start


def ops_per_second(
    kind: str,
    num_blocks: int,
    budget_s: float,
    *,
    min_ops: int = 1,
    repeats: int = 1,
    block_size: int = 16,
) -> OpsResult:
    """Operations per second of a fresh ``kind`` cache on the ops stream (best of ``repeats``).

    The cache is built outside the timed region (the spec's constructor is O(pool)).
    """
    best: OpsResult | None = None
    for _ in range(repeats):
        cache = _make(kind, num_blocks, block_size)
        gc.collect()
        ops, ns = _drive_ops(cache, _op_stream(), budget_s, min_ops)
        result = OpsResult(kind, num_blocks, ops, ns / 1e9)
        if best is None or result.ops_per_s > best.ops_per_s:
            best = result
        del cache
    assert best is not None
    return best


# -- 2. CPU time per block touched on the chat workload --------------------------------------

_Plan = list[tuple[int, Request, tuple[int], list[tuple[int]]]]


def _chat_plan(workload: ChatWorkload) -> _Plan:
    """Everything the timed loop needs, built beforehand: requests and per-token tuples."""
    plan: _Plan = []
    for i, turn in enumerate(workload.schedule()):
        reply = turn.reply
        plan.append((i, Request(i, turn.prompt, NAMESPACE), (reply[0],), [(t,) for t in reply[1:]]))
    return plan


def _replay_timed(cache: PrefixCache, plan: _Plan, live: int) -> tuple[int, int, int]:
    """Replay ``plan`` through ``cache``; returns (elapsed ns, thread CPU ns, early frees).

    The CPU time is a cross-check only: when it is well below the elapsed time, something
    else was competing for the CPU and the run should be repeated on a quieter machine.

    Finished sequences stay live, the ``live`` most recent ones; older ones are freed. If
    the pool runs dry the oldest finished sequence is freed early (never needed at the
    benchmark's sizes, but a smaller pool must not crash the benchmark).
    """
    admit, commit, append, free = cache.admit, cache.commit, cache.append, cache.free
    finished: deque[int] = deque()
    early = 0
    clock = time.perf_counter_ns
    cpu_start = time.thread_time_ns()
    start = clock()
    for sid, req, first, rest in plan:
        while True:
            try:
                adm = admit(req)
                break
            except OutOfBlocks:
                if not finished:
                    raise
                free((finished.popleft(),))
                early += 1
        commit(sid, adm.num_scheduled_tokens, first)
        for tok in rest:
            try:
                append(sid, 1)
            except OutOfBlocks:
                if not finished:
                    raise
                free((finished.popleft(),))
                early += 1
                append(sid, 1)
            commit(sid, 1, tok)
        finished.append(sid)
        if len(finished) > live:
            free((finished.popleft(),))
    elapsed = clock() - start
    cpu = time.thread_time_ns() - cpu_start
    return elapsed, cpu, early


def chat_per_block(
    workload: ChatWorkload,
    num_blocks: int,
    *,
    live: int = 32,
    repeats: int = 2,
    block_size: int = 16,
    plan: _Plan | None = None,
) -> dict[str, Any]:
    """us per block touched of the impl on ``workload`` (best of ``repeats`` fresh caches)."""
    plan = _chat_plan(workload) if plan is None else plan
    touched = workload.blocks_touched(block_size)
    runs_ns: list[int] = []
    cpu_ns: list[int] = []
    stats = None
    early = 0
    for _ in range(repeats):
        cache = _make("impl", num_blocks, block_size)
        gc.collect()
        ns, cpu, early = _replay_timed(cache, plan, live)
        runs_ns.append(ns)
        cpu_ns.append(cpu)
        stats = cache.stats()
        del cache
    assert stats is not None
    best = min(runs_ns)
    return {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "requests": len(plan),
        "blocks_touched": touched,
        "runs_us_per_block": [ns / touched / 1e3 for ns in runs_ns],
        "us_per_block": best / touched / 1e3,
        "cpu_us_per_block_of_best_run": cpu_ns[runs_ns.index(best)] / touched / 1e3,
        "best_s": best / 1e9,
        "hit_rate": stats.hit_rate,
        "evictions": stats.evictions,
        "blocks_published": stats.blocks_published,
        "early_frees": early,
    }


# -- the run -------------------------------------------------------------------------------


def run_bench(config: BenchConfig, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run both measurements; returns everything ``cache.json`` holds."""
    bs = config.block_size
    ops_rows: list[dict[str, Any]] = []
    for n in config.ops_sizes:
        log(f"ops/s: impl at {n:,} blocks")
        impl = ops_per_second(
            "impl", n, config.ops_budget_impl_s, repeats=config.ops_repeats_impl, block_size=bs
        )
        log(f"ops/s: spec at {n:,} blocks (O(pool) per operation)")
        spec = ops_per_second(
            "spec", n, config.ops_budget_spec_s, min_ops=config.spec_min_ops, block_size=bs
        )
        ops_rows.append(
            {
                "num_blocks": n,
                "impl_ops": impl.ops,
                "impl_ops_per_s": impl.ops_per_s,
                "impl_us_per_op": impl.us_per_op,
                "spec_ops": spec.ops,
                "spec_ops_per_s": spec.ops_per_s,
                "spec_us_per_op": spec.us_per_op,
                "speedup": impl.ops_per_s / spec.ops_per_s,
            }
        )
    impl_scaling = ops_rows[-1]["impl_us_per_op"] / ops_rows[0]["impl_us_per_op"]

    log("chat workload: generating requests")
    workload = chat_workload(config.chat)
    plan = _chat_plan(workload)
    chat_rows = []
    for n in config.chat_sizes:
        log(f"chat workload: impl at {n:,} blocks, {config.chat_repeats} runs")
        chat_rows.append(
            chat_per_block(
                workload,
                n,
                live=config.chat_live,
                repeats=config.chat_repeats,
                block_size=bs,
                plan=plan,
            )
        )
    del plan

    worst_us = max(r["us_per_block"] for r in chat_rows)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "ops": {
            "stream": "admit, prefill commit, 4 x (append 1, commit 1), free; 16 prompts "
            "sharing a 256-token prefix; 4 sequences live; block size 16",
            "sizes": ops_rows,
            "impl_us_per_op_ratio_largest_to_smallest": impl_scaling,
        },
        "chat": {
            "workload": attrs.asdict(config.chat),
            "live": config.chat_live,
            "repeats": config.chat_repeats,
            "sizes": chat_rows,
        },
        "quoted": list(QUOTED),
        "acceptance": {
            "speedup_at_least": TARGET_SPEEDUP,
            "speedup_ok": all(r["speedup"] >= TARGET_SPEEDUP for r in ops_rows),
            "scaling_below": TARGET_SCALING,
            "scaling_ok": impl_scaling < TARGET_SCALING,
            "us_per_block_at_most": TARGET_US_PER_BLOCK,
            "us_per_block_aim": AIM_US_PER_BLOCK,
            "us_per_block_ok": worst_us <= TARGET_US_PER_BLOCK,
        },
    }


# -- outputs -------------------------------------------------------------------------------

BEGIN = "<!-- BEGIN generated by `prefixkv bench`: edits between these markers are overwritten -->"
END = "<!-- END generated by `prefixkv bench` -->"

_HEADER = """# Benchmarks

Measured with `prefixkv bench` (`python -m prefixkv bench`), which rewrites the section between
the markers below, `docs/bench/cache.json` and `docs/bench/cache_per_block.png`.
`prefixkv bench --quick` runs the same code at toy sizes in seconds (a test runs it, so the
benchmark cannot rot); its figures mean nothing.

## Method

**Impl against spec.** Both caches run the same endless operation stream: admit one of 16
prompts that share a 256-token prefix, commit its prefill, decode 4 tokens (append 1,
commit 1), free the sequence admitted 4 cycles earlier. The working set is bounded, so the
stream fits in 10^3 blocks and both sizes run exactly the same operations. Each
measurement runs for a time budget and reports operations per second. The spec deep-copies
its state in every operation (O(pool), by design: it is the readable definition), so at
10^6 blocks it completes only a couple of operations. What matters most is that the impl's
cost per operation does not change with the pool size.

**Per block touched.** The multi-turn chat workload of `prefixkv.workloads`: 200
conversations x 4 turns in a shuffled order (each conversation's turns stay in order), 4
shared 1,024-token system prompts, user turns of 100-300 tokens, replies of 50-150 tokens
decoded, appended and committed one token at a time, every turn re-sending the whole
history; block size 16; the 32 most recently finished sequences stay live, older ones are
freed. Blocks touched = sum over requests of ceil((prompt + reply) / 16). Requests and token
tuples are built before the clock starts; the timed region holds only the cache calls and
the loop issuing them. Garbage collection stays enabled. Each size runs 5 times on a fresh
cache and the best run counts. The thread CPU time of that run is listed as a cross-check:
when it is well below the elapsed time, the machine was busy. At 4,096 blocks the pool is
much smaller than the working set and eviction runs all the time; at 1,048,576 blocks
nothing is evicted.

Figures for other engines are quoted for the same workload, not measured here, and come
from other machines: compare the scaling and the order of magnitude, not small differences.
"""


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def render_markdown(result: dict[str, Any]) -> str:
    """The generated section of ``docs/benchmarks.md``."""
    m = result["machine"]
    acc = result["acceptance"]
    lines = [
        BEGIN,
        "",
        f"Measured {result['date']} on {m['cpu']} ({m['logical_cpus']} logical CPUs), "
        f"{m['os']}, {m['python']}.",
        "",
        "### Impl against spec (operations per second)",
        "",
        "| blocks | impl ops/s | impl µs/op | spec ops/s | spec ops run | impl / spec |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["ops"]["sizes"]:
        lines.append(
            f"| {r['num_blocks']:,} | {_fmt_rate(r['impl_ops_per_s'])} | "
            f"{r['impl_us_per_op']:.2f} | {_fmt_rate(r['spec_ops_per_s'])} | {r['spec_ops']:,} | "
            f"{r['speedup']:,.0f}x |"
        )
    scaling = result["ops"]["impl_us_per_op_ratio_largest_to_smallest"]
    sizes = result["ops"]["sizes"]
    lines += [
        "",
        f"Impl cost per operation at {sizes[-1]['num_blocks']:,} blocks / at "
        f"{sizes[0]['num_blocks']:,} blocks: **{scaling:.2f}x** (target < {TARGET_SCALING:g}x: "
        f"{'met' if acc['scaling_ok'] else 'missed'}). Speed-up over the spec at least "
        f"{TARGET_SPEEDUP:g}x: {'met' if acc['speedup_ok'] else 'missed'}.",
        "",
        "### CPU time per block touched, multi-turn chat workload",
        "",
    ]
    chat = result["chat"]["sizes"]
    by_size = {r["num_blocks"]: r for r in chat}
    if set(by_size) == {4096, 1048576}:
        lines += [
            "| engine | source | 4,096 blocks | 1,048,576 blocks |",
            "|---|---|---:|---:|",
            f"| **prefixkv impl** | measured | **{by_size[4096]['us_per_block']:.2f} µs** | "
            f"**{by_size[1048576]['us_per_block']:.2f} µs** |",
            "| vLLM v1 | quoted | about 5.5 µs | about 5.5 µs (flat) |",
            "| SGLang radix cache | quoted | 4.6-7.5 µs | 4.6-7.5 µs |",
            "| nano-vllm | quoted | 3.1 µs | 1,800 µs |",
            "",
        ]
    else:
        lines += ["(No comparison with other engines: this run did not use their pool sizes.)", ""]
    lines += [
        "| blocks | µs / block touched (best) | all runs | CPU µs / block (best run) | "
        "hit rate | evictions | blocks touched | best run |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in chat:
        runs = ", ".join(f"{x:.2f}" for x in r["runs_us_per_block"])
        lines.append(
            f"| {r['num_blocks']:,} | {r['us_per_block']:.2f} | {runs} | "
            f"{r['cpu_us_per_block_of_best_run']:.2f} | {r['hit_rate']:.1%} | "
            f"{r['evictions']:,} | {r['blocks_touched']:,} | {r['best_s']:.3f} s |"
        )
    lines += [
        "",
        f"Target: at most {TARGET_US_PER_BLOCK:g} µs per block touched at both sizes (aim "
        f"{AIM_US_PER_BLOCK:g} µs): {'met' if acc['us_per_block_ok'] else 'missed'}.",
        "",
        "![CPU time per block touched](bench/cache_per_block.png)",
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def splice_generated(path: Path, section: str, *, begin: str, end: str, header: str) -> None:
    """Replace the section of ``path`` between the markers ``begin`` and ``end``, keeping the
    hand-written text around it; a file without them gets the section appended (after
    ``header`` when it is empty or missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        new = head + section.rstrip("\n") + tail
        if not new.endswith("\n"):
            new += "\n"
    else:
        new = (text.rstrip("\n") + "\n\n" if text.strip() else header) + section
    path.write_text(new, encoding="utf-8")


def write_markdown(path: Path, section: str) -> None:
    """Replace the generated section of ``path``, keeping the hand-written text around it."""
    splice_generated(path, section, begin=BEGIN, end=END, header=_HEADER + "\n")


def plot(result: dict[str, Any], path: Path) -> None:
    """µs per block touched against pool size: ours measured, the others quoted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
    xs = [4096, 1048576]
    ax.fill_between(
        xs,
        4.6,
        7.5,
        color="tab:orange",
        alpha=0.18,
        label="SGLang radix cache, 4.6-7.5 µs (quoted)",
    )
    ax.plot(xs, [5.5, 5.5], "--", color="tab:blue", label="vLLM v1, about 5.5 µs (quoted)")
    ax.plot(xs, [3.1, 1800.0], ":", marker="s", color="tab:gray", label="nano-vllm (quoted)")
    chat = result["chat"]["sizes"]
    ax.plot(
        [r["num_blocks"] for r in chat],
        [r["us_per_block"] for r in chat],
        "-o",
        color="tab:green",
        linewidth=2.2,
        label="prefixkv impl (measured)",
    )
    for i, r in enumerate(chat):
        ax.annotate(
            f"{r['us_per_block']:.2f} µs",
            (r["num_blocks"], r["us_per_block"]),
            textcoords="offset points",
            xytext=(8, 6) if i == 0 else (-52, 8),
            color="tab:green",
        )
    ax.axhline(
        TARGET_US_PER_BLOCK,
        color="black",
        linewidth=0.8,
        linestyle="-.",
        label=f"target {TARGET_US_PER_BLOCK:g} µs",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(2**11.6, 2**20.4)
    ax.set_ylim(0.5, 4000)
    ax.set_xlabel("pool size (blocks of 16 tokens)")
    ax.set_ylabel("µs per block touched")
    ax.set_title("Block manager cost, multi-turn chat workload", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    """Write ``bench/cache.json``, ``bench/cache_per_block.png`` and ``benchmarks.md``."""
    import json

    bench_dir = out / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    json_path = bench_dir / "cache.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    png_path = bench_dir / "cache_per_block.png"
    plot(result, png_path)
    md_path = out / "benchmarks.md"
    write_markdown(md_path, render_markdown(result))
    return [md_path, json_path, png_path]


# -- command line --------------------------------------------------------------------------


def default_docs_dir() -> Path:
    """The source checkout's ``docs/`` when running from one (editable install), else ./docs."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "docs").is_dir():
        return checkout / "docs"
    return Path("docs")


def setup(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Add the ``bench`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="toy sizes, a few seconds; writes nothing unless --out is given",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="docs directory to write benchmarks.md and bench/ into (default: the source "
        "checkout's docs/, or ./docs, for a full run; nothing for --quick)",
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print the figures only, write no files"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a target is missed (speed-up, scaling, µs per block)",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    config = QUICK if args.quick else FULL
    out: Path | None = args.out
    if out is None and not args.quick:
        out = default_docs_dir()
    if args.no_write:
        out = None

    def log(message: str) -> None:
        if not args.json:
            err.print(f"[dim]bench:[/dim] {message}", highlight=False)

    result = run_bench(config, log)
    result["quick"] = bool(args.quick)
    written = write_outputs(result, out) if out is not None else []
    result["written"] = [str(p) for p in written]
    acc = result["acceptance"]
    ok = acc["speedup_ok"] and acc["scaling_ok"] and acc["us_per_block_ok"]
    if args.json:
        from prefixkv.cli import emit_json

        emit_json({"command": "bench", "ok": bool(ok or not args.strict), **result})
    else:
        _print_summary(result)
    return 0 if ok or not args.strict else 1


def _print_summary(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ops = Table(title="impl against spec, same operation stream", title_justify="left")
    for col in ("blocks", "impl ops/s", "impl µs/op", "spec ops/s", "spec ops run", "impl/spec"):
        ops.add_column(col, justify="right")
    for r in result["ops"]["sizes"]:
        ops.add_row(
            f"{r['num_blocks']:,}",
            _fmt_rate(r["impl_ops_per_s"]),
            f"{r['impl_us_per_op']:.2f}",
            _fmt_rate(r["spec_ops_per_s"]),
            f"{r['spec_ops']:,}",
            f"{r['speedup']:,.0f}x",
        )
    console.print(ops)
    scaling = result["ops"]["impl_us_per_op_ratio_largest_to_smallest"]
    console.print(f"impl µs/op, largest pool / smallest pool: {scaling:.2f}x")
    chat = Table(title="impl, multi-turn chat workload", title_justify="left")
    for col in ("blocks", "µs/block touched", "runs", "CPU µs/block", "hit rate", "evictions"):
        chat.add_column(col, justify="right")
    for r in result["chat"]["sizes"]:
        chat.add_row(
            f"{r['num_blocks']:,}",
            f"{r['us_per_block']:.2f}",
            ", ".join(f"{x:.2f}" for x in r["runs_us_per_block"]),
            f"{r['cpu_us_per_block_of_best_run']:.2f}",
            f"{r['hit_rate']:.1%}",
            f"{r['evictions']:,}",
        )
    console.print(chat)
    console.print(
        "quoted, not measured here: vLLM v1 about 5.5 µs/block (flat), SGLang radix cache "
        "4.6-7.5 µs, nano-vllm 3.1 µs at 4,096 and 1,800 µs at 1,048,576 blocks"
    )
    acc = result["acceptance"]
    for key, label in (
        ("speedup_ok", f"impl >= {TARGET_SPEEDUP:g}x spec"),
        ("scaling_ok", f"impl µs/op changes < {TARGET_SCALING:g}x with pool size"),
        ("us_per_block_ok", f"<= {TARGET_US_PER_BLOCK:g} µs per block touched"),
    ):
        console.print(f"{'met   ' if acc[key] else 'MISSED'} {label}")
    if result["written"]:
        console.print("wrote " + ", ".join(result["written"]))
