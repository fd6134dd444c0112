"""Serve a chat workload through scheduler, tiny model and cache, with the cache on and off.

The driver behind ``prefixkv serve-sim``, the engine demo. It serves the project's chat
workload (:mod:`prefixkv.workloads`: shared system prompts, conversations whose every turn
re-sends the history) through :class:`prefixkv.engine.Engine` twice: with the prefix cache
on, then off (every admission in a namespace of its own). It reports time to first token,
the prefill tokens computed against those skipped and the hit rate, and whether both runs
generated the same greedy tokens, with logits within tolerance.

With ``serve-sim --replicas N`` the same turns are served by
:mod:`prefixkv.events.cluster` instead; :func:`plot_replicas` draws that run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from prefixkv.outputs import figure
from prefixkv.workloads import ChatConfig, chat_workload

if TYPE_CHECKING:
    from prefixkv.engine import EngineConfig, Turn
    from prefixkv.engine.engine import RunResult

__all__ = [
    "HybridFigures",
    "ServeOutcome",
    "ServeReport",
    "ServeSimConfig",
    "chat_turns",
    "engine_config",
    "percentile",
    "plot_replicas",
    "plot_ttft",
    "serve_on_off",
]


@attrs.frozen
class ServeSimConfig:
    """The served chat workload: a small :class:`~prefixkv.workloads.ChatConfig` (the tiny
    model is slow on a CPU) and how conversations arrive: conversation ``c`` starts at
    engine step ``c * arrival_every``; each later turn arrives when the previous one
    finished."""

    conversations: int = 24
    turns: int = 3
    system_prompts: int = 3
    system_tokens: int = 96
    user_tokens: tuple[int, int] = (8, 24)
    reply_tokens: tuple[int, int] = (6, 12)
    arrival_every: int = 2
    seed: int = 0

    def chat_config(self, vocab_size: int) -> ChatConfig:
        """The workload's shape, over the model's vocabulary; the model samples the replies."""
        return ChatConfig(
            conversations=self.conversations,
            turns=self.turns,
            system_prompts=self.system_prompts,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            reply_tokens=self.reply_tokens,
            vocab_size=vocab_size,
            seed=self.seed,
            draw_replies=False,
        )


def chat_turns(cfg: ServeSimConfig, vocab: int) -> list[Turn]:
    """The engine's turns of the chat workload, conversation by conversation.

    A first turn is the system prompt and the first user message; each later turn is only
    its new user message and ``follows`` the previous turn, so the engine appends it to the
    previous prompt and the reply the model actually generated. Each turn asks for as many
    tokens as the workload's reply has.
    """
    from prefixkv.engine import Turn

    workload = chat_workload(cfg.chat_config(vocab))
    turns: list[Turn] = []
    for conv in workload.conversations:
        c = conv.index
        previous = None
        for turn in conv.turns:
            rid = f"c{c}t{turn.turn}"
            if previous is None:
                turns.append(
                    Turn(rid, turn.prompt, len(turn.reply), arrival_step=c * cfg.arrival_every)
                )
            else:
                # the prompt re-sends the history: previous prompt, previous reply, then new
                user = turn.prompt[len(previous.prompt) + len(previous.reply) :]
                turns.append(Turn(rid, user, len(turn.reply), follows=f"c{c}t{previous.turn}"))
            previous = turn
    return turns


def engine_config(
    *,
    seed: int = 0,
    hybrid: bool = False,
    num_blocks: int = 512,
    block_size: int = 8,
    budget: int = 128,
    draft_tokens: int = 0,
    backend: str = "auto",
    device: str | None = None,
) -> EngineConfig:
    """The engine ``serve-sim`` runs: the tiny model (``hybrid``: a recurrent layer first),
    a pool of ``num_blocks`` blocks and a token ``budget`` per step, logits recorded."""
    from prefixkv.engine import EngineConfig, ModelConfig
    from prefixkv.engine.policy import SchedulerConfig

    return EngineConfig(
        model=ModelConfig(seed=seed, hybrid=hybrid),
        num_blocks=num_blocks,
        block_size=block_size,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget,
            min_prefill_tokens=min(32, budget // 4),
            num_draft_tokens=draft_tokens,
        ),
        backend=backend,
        device=device,
        record_logits=True,
    )


@attrs.frozen
class ServeOutcome:
    """Both runs, and whether they generated the same tokens (logits within tolerance)."""

    on: RunResult
    off: RunResult
    equal: bool
    max_logit_diff: float
    compared: int
    mismatch: str


def serve_on_off(
    turns: Sequence[Turn],
    config: EngineConfig,
    on_progress: Callable[[bool, int], None] | None = None,
) -> ServeOutcome:
    """Serve ``turns`` with the cache on, then off; compare the two runs' outputs.

    ``on_progress(cache_enabled, finished)`` is called after every engine step.
    """
    from prefixkv.engine import TOLERANCE, Engine, EqualityMismatch, compare_runs

    runs: dict[bool, RunResult] = {}
    for enabled in (True, False):
        engine = Engine(attrs.evolve(config, cache_enabled=enabled))

        def step(e: Engine, _: object, enabled: bool = enabled) -> None:
            if on_progress is not None:
                on_progress(enabled, sum(1 for g in e.scheduler.generations if g.finished))

        runs[enabled] = engine.run(list(turns), on_step=step)
    on, off = runs[True], runs[False]
    try:
        max_diff, compared = compare_runs(on, off, TOLERANCE[config.model.dtype])
    except EqualityMismatch as exc:
        return ServeOutcome(on, off, False, float("nan"), 0, str(exc))
    return ServeOutcome(on, off, True, max_diff, compared, "")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile of ``values`` (0.0 when there are none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


@attrs.frozen
class HybridFigures:
    """A hybrid model hits only at a Ready checkpoint: every hit is a restore, and the KV
    past the deepest checkpoint is lost reuse of kind "checkpoint"."""

    checkpoint_hit_rate: float
    checkpoints_saved: int
    checkpoints_restored: int
    checkpoints_evicted: int
    lost_checkpoint_tokens: int
    kv_only_skipped_fraction: float


@attrs.frozen
class ServeReport:
    """What ``serve-sim`` reports (one JSON object under ``--json``; see :meth:`as_json`)."""

    ok: bool
    workload: ServeSimConfig
    model: str
    backend: str
    num_blocks: int
    block_size: int
    requests: int
    generated_tokens: int
    cache_on_equals_cache_off: bool
    max_logit_diff: float
    ttft_ms_p50_on: float
    ttft_ms_p50_off: float
    ttft_ms_p90_on: float
    ttft_ms_p90_off: float
    ttft_steps_p50_on: float
    ttft_steps_p50_off: float
    prefill_tokens_computed: int
    prefill_tokens_skipped: int
    prefill_tokens_computed_off: int
    hit_rate: float
    tokens_computed_on: int
    tokens_computed_off: int
    preemptions_on: int
    steps_on: int
    steps_off: int
    wall_s_on: float
    wall_s_off: float
    hybrid: HybridFigures | None
    mismatch: str

    @classmethod
    def of(cls, outcome: ServeOutcome, sim: ServeSimConfig, config: EngineConfig) -> ServeReport:
        on, off = outcome.on, outcome.off

        def ttft(run: RunResult) -> list[float]:
            return [r.ttft_s * 1e3 for r in run.requests.values()]

        stats = on.cache
        hybrid = None
        if config.model.hybrid:
            hybrid = HybridFigures(
                checkpoint_hit_rate=(
                    stats.checkpoints_restored / stats.admissions if stats.admissions else 0.0
                ),
                checkpoints_saved=stats.checkpoints_saved,
                checkpoints_restored=stats.checkpoints_restored,
                checkpoints_evicted=stats.checkpoints_evicted,
                lost_checkpoint_tokens=stats.lost_checkpoint,
                kv_only_skipped_fraction=(
                    (stats.prefill_tokens_skipped + stats.lost_checkpoint)
                    / max(stats.prefill_tokens, 1)
                ),
            )
        return cls(
            ok=outcome.equal,
            workload=sim,
            model=config.model.version,
            backend=config.backend,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            requests=len(on.requests),
            generated_tokens=outcome.compared or sum(len(r.output) for r in on.requests.values()),
            cache_on_equals_cache_off=outcome.equal,
            max_logit_diff=outcome.max_logit_diff,
            ttft_ms_p50_on=percentile(ttft(on), 0.5),
            ttft_ms_p50_off=percentile(ttft(off), 0.5),
            ttft_ms_p90_on=percentile(ttft(on), 0.9),
            ttft_ms_p90_off=percentile(ttft(off), 0.9),
            ttft_steps_p50_on=statistics.median(r.ttft_steps for r in on.requests.values()),
            ttft_steps_p50_off=statistics.median(r.ttft_steps for r in off.requests.values()),
            prefill_tokens_computed=stats.prefill_tokens_computed,
            prefill_tokens_skipped=stats.prefill_tokens_skipped,
            prefill_tokens_computed_off=off.cache.prefill_tokens_computed,
            hit_rate=stats.hit_rate,
            tokens_computed_on=on.tokens_computed,
            tokens_computed_off=off.tokens_computed,
            preemptions_on=on.scheduler.preemptions,
            steps_on=on.steps,
            steps_off=off.steps,
            wall_s_on=on.wall_s,
            wall_s_off=off.wall_s,
            hybrid=hybrid,
            mismatch=outcome.mismatch,
        )

    def as_json(self) -> dict[str, Any]:
        """The fields as plain data; a hybrid model's figures sit at the top level."""
        out = attrs.asdict(self, recurse=True, filter=lambda a, _: a.name != "hybrid")
        if self.hybrid is not None:
            out.update(attrs.asdict(self.hybrid))
        return out


def plot_ttft(outcome: ServeOutcome, path: Path) -> None:
    """TTFT against the cached fraction of each prompt, cache on beside cache off."""
    on, off = outcome.on, outcome.off
    xs = [r.cached_fraction for r in on.requests.values()]
    with figure(path, dpi=110) as plt:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
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


def plot_replicas(result: Any, path: Path) -> None:
    """TTFT against the cached fraction of each prompt, one colour per replica
    (``result``: a :class:`prefixkv.events.cluster.ClusterResult`)."""
    with figure(path, dpi=110) as plt:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
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
