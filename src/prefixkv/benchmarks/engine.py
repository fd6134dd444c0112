"""Prefill time against the cached fraction of the prompt, on the reference engine.

A prefix hit should make prefill cost what the *uncached* tokens cost. For one prompt
length ``L`` and cached fractions 0%, 50%, 90% and 99%, in one run on one engine:

1. a warm-up request publishes the KV of a base prompt of ``L`` tokens;
2. each timed request is the base prompt's first ``c = f * L`` tokens (block-aligned)
   followed by ``L - c`` fresh random tokens, so exactly ``c`` tokens hit; the step that
   prefills it (one forward, the budget covers the whole prompt) is timed;
3. the median over repeats is compared with the ideal line ``t(0%) * (1 - f)``.

::

    prompt   |<------- cached c = f * L ------->|<------ computed L - c ------->|
    ideal    t(f) = t(0) * (L - c) / L          (compute proportional to new tokens)

The ideal ignores that each new token still attends over the whole cached prefix and that
a step has a fixed cost (metadata, launches, the LM head); the measured/ideal ratio shows
how much those matter. The goal on a GPU is within 15% of the ideal line; on the CPU the
ratios are an indication only.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from prefixkv.outputs import GeneratedSection, Machine, figure, machine_info, write_json

__all__ = [
    "FRACTIONS",
    "FULL",
    "QUICK",
    "SECTION",
    "EngineBenchConfig",
    "EngineBenchResult",
    "PrefillRow",
    "render_markdown",
    "run_engine_bench",
    "write_outputs",
]

FRACTIONS = (0.0, 0.5, 0.9, 0.99)
#: The section of ``docs/engine.md`` that ``prefixkv bench-engine`` rewrites.
SECTION = GeneratedSection(command="prefixkv bench-engine", header="# Engine\n\n")


@attrs.frozen
class EngineBenchConfig:
    """The model and prompt of one run: ``repeats`` timed prefills per cached fraction."""

    prompt_tokens: int
    repeats: int
    block_size: int = 16
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 768


FULL = EngineBenchConfig(prompt_tokens=1600, repeats=7)
QUICK = EngineBenchConfig(
    prompt_tokens=800, repeats=3, hidden_size=128, num_layers=2, intermediate_size=256
)


@attrs.frozen
class PrefillRow:
    """One cached fraction: the prefill step's median time against the ideal line."""

    #: The fraction asked for, and the one measured (block-aligned).
    fraction: float
    actual_fraction: float
    cached_tokens: int
    computed_tokens: int
    median_ms: float
    min_ms: float
    #: ``t(0%) * computed / prompt``: compute proportional to the uncached tokens.
    ideal_ms: float
    ratio: float


@attrs.frozen
class EngineBenchResult:
    """One run of the engine benchmark (``docs/bench/engine_prefill.json``)."""

    date: str
    machine: Machine
    device: str
    backend: str
    torch_threads: int
    model: str
    config: EngineBenchConfig
    rows: tuple[PrefillRow, ...]


def run_engine_bench(
    cfg: EngineBenchConfig,
    *,
    backend: str = "auto",
    device: str | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> EngineBenchResult:
    """Time the prefill step at each of :data:`FRACTIONS` (module doc)."""
    import torch

    from prefixkv.engine import Engine, EngineConfig, ModelConfig
    from prefixkv.engine.policy import SchedulerConfig

    L, bs = cfg.prompt_tokens, cfg.block_size
    model = ModelConfig(
        vocab_size=1024,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
    )
    num_blocks = (L // bs + 2) * (len(FRACTIONS) * cfg.repeats + 4)
    engine = Engine(
        EngineConfig(
            model=model,
            num_blocks=num_blocks,
            block_size=bs,
            backend=backend,
            device=device,
            scheduler=SchedulerConfig(
                max_num_batched_tokens=L + 64, max_num_seqs=4, min_prefill_tokens=0
            ),
        )
    )
    sync: Callable[[], None] = (
        torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    )
    rng = random.Random(0)
    base = [rng.randrange(model.vocab_size) for _ in range(L)]
    counter = 0

    def prefill(prompt: list[int]) -> tuple[float, int]:
        nonlocal counter
        counter += 1
        engine.add(engine.request(f"q{counter}", prompt, 1))
        sync()
        t0 = time.perf_counter()
        engine.step()
        sync()
        elapsed = time.perf_counter() - t0
        assert not engine.scheduler.has_unfinished, "the prompt did not fit in one step"
        return elapsed, engine.scheduler.generation(f"q{counter}").num_cached_at_admission

    prefill(base)  # publish the base prompt's KV (and warm up)
    for _ in range(2):
        prefill([rng.randrange(model.vocab_size) for _ in range(L)])  # warm-up, no hits
    measured: list[tuple[float, int, float, float]] = []
    for f in FRACTIONS:
        cached = int(f * L) // bs * bs
        times = []
        for _ in range(cfg.repeats):
            tail = [rng.randrange(model.vocab_size) for _ in range(L - cached)]
            if tail[0] == base[cached % L]:
                tail[0] = (tail[0] + 1) % model.vocab_size  # the hit must stop at `cached`
            elapsed, hit = prefill([*base[:cached], *tail])
            assert hit == cached, (hit, cached)
            times.append(elapsed)
        median_ms = statistics.median(times) * 1e3
        measured.append((f, cached, median_ms, min(times) * 1e3))
        log(f"cached {f:.0%}: {median_ms:.2f} ms")
    t0 = measured[0][2]
    rows = []
    for f, cached, median_ms, min_ms in measured:
        ideal_ms = t0 * (L - cached) / L
        rows.append(
            PrefillRow(
                fraction=f,
                actual_fraction=cached / L,
                cached_tokens=cached,
                computed_tokens=L - cached,
                median_ms=median_ms,
                min_ms=min_ms,
                ideal_ms=ideal_ms,
                ratio=median_ms / ideal_ms,
            )
        )
    return EngineBenchResult(
        date=time.strftime("%Y-%m-%d"),
        machine=machine_info(),
        device=str(engine.device),
        backend=engine.backend.name,
        torch_threads=torch.get_num_threads(),
        model=model.version,
        config=cfg,
        rows=tuple(rows),
    )


def render_markdown(result: EngineBenchResult) -> str:
    """The generated section of ``docs/engine.md`` (markers included)."""
    m, c = result.machine, result.config
    lines = [
        SECTION.begin,
        "",
        f"Measured {result.date} on {m.cpu} ({m.logical_cpus} logical CPUs), "
        f"device `{result.device}`, backend `{result.backend}`, "
        f"{result.torch_threads} torch thread(s). Model `{result.model}`; prompt of "
        f"{c.prompt_tokens} tokens, blocks of {c.block_size}, median of "
        f"{c.repeats} prefills per row.",
        "",
        "| cached | cached tokens | computed tokens | measured (ms) | ideal (ms) | "
        "measured / ideal |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result.rows:
        lines.append(
            f"| {r.actual_fraction:.1%} | {r.cached_tokens} | {r.computed_tokens} | "
            f"{r.median_ms:.2f} | {r.ideal_ms:.2f} | {r.ratio:.2f} |"
        )
    lines += ["", SECTION.end]
    return "\n".join(lines) + "\n"


def plot(result: EngineBenchResult, path: Path) -> None:
    """Measured prefill time against the ideal line, per cached fraction."""
    rows = result.rows
    xs = [r.fraction * 100 for r in rows]
    with figure(path, dpi=110) as plt:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
        ax.plot(xs, [r.median_ms for r in rows], "o-", label="measured (median)")
        ax.plot(
            xs,
            [r.ideal_ms for r in rows],
            "--",
            color="gray",
            label="ideal: t(0%) x uncached fraction",
        )
        for x, r in zip(xs, rows, strict=True):
            ax.annotate(
                f"{r.ratio:.2f}x",
                (x, r.median_ms),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=8,
            )
        ax.set_xlabel("cached fraction of the prompt (%)")
        ax.set_ylabel("prefill step time (ms)")
        ax.set_title(f"prefill vs cached prefix ({result.device}, {result.backend})")
        ax.legend()


def write_outputs(result: EngineBenchResult, out: Path) -> list[Path]:
    """Write ``bench/engine_prefill.json``, ``bench/engine_prefill.png`` and ``engine.md``."""
    json_path = write_json(out / "bench" / "engine_prefill.json", result)
    png_path = out / "bench" / "engine_prefill.png"
    plot(result, png_path)
    md_path = SECTION.write(out / "engine.md", render_markdown(result))
    return [md_path, json_path, png_path]
