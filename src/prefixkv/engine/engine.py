"""The reference engine: scheduler + tiny model + paged KV pool + prefix cache.

This is the loop an engine developer would write, in the smallest form that is still
complete::

    plan = scheduler.schedule()            # admit / chunk / decode / preempt, slots reserved
    out = runner.forward(plan)             # write KV into the reserved slots, attend, sample
    finished = scheduler.commit_step(out)  # publish committed full blocks, free finished

A workload is a list of :class:`Turn`. A turn that ``follows`` another one arrives when the
other has finished, with the other's prompt and output, then its own tokens, as its prompt
(a multi-turn chat). :meth:`Engine.run` returns every request's tokens, its time to first
token, how much of its prompt came from the cache, and (``record_logits``) the logits of
every generated token, which :mod:`.equality` compares between cache on and cache off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import attrs
import torch

from prefixkv.impl.cache import PrefixCacheManager
from prefixkv.impl.hybrid import HybridPrefixCacheManager
from prefixkv.spec.errors import InvalidRequest
from prefixkv.spec.multimodal import MultimodalSpan
from prefixkv.spec.namespace import Namespace
from prefixkv.spec.results import CacheStats

from .backend import resolve_device, select_backend
from .config import EngineConfig
from .draft import RECOMPUTE_BLOCKS, NgramDrafter
from .generation import GenerationRequest, MultimodalItem
from .hybrid import RecurrentStatePool
from .kv_pool import KVPool
from .model import TinyDecoder, torch_dtype
from .multimodal import StubEncoder
from .runner import ModelRunner, RunnerOutput
from .scheduler import Scheduler, SchedulerStats
from .state_io import RecurrentStateIO
from .step import StepPlan

__all__ = ["Engine", "RequestResult", "RunResult", "Turn"]


def _shift(item: MultimodalItem, by: int) -> MultimodalItem:
    s = item.span
    return MultimodalItem(
        MultimodalSpan(s.start + by, s.end + by, s.modality, s.content_hash), item.content
    )


def _token_tuple(tokens: Iterable[int]) -> tuple[int, ...]:
    return tuple(tokens)


def _item_tuple(items: Iterable[MultimodalItem]) -> tuple[MultimodalItem, ...]:
    return tuple(items)


@attrs.frozen
class Turn:
    """One request of a workload.

    ``tokens`` is the whole prompt, or with ``follows`` the new user message appended to
    the followed request's prompt and output. ``multimodal`` positions are relative to
    ``tokens``. The turn arrives at step ``arrival_step`` or when ``follows`` finished,
    whichever is later.
    """

    request_id: str
    tokens: tuple[int, ...] = attrs.field(converter=_token_tuple)
    max_new_tokens: int
    follows: str | None = None
    arrival_step: int = 0
    multimodal: tuple[MultimodalItem, ...] = attrs.field(default=(), converter=_item_tuple)
    kv_token_limit: int | None = None


@attrs.frozen
class RequestResult:
    request_id: str
    prompt_tokens: int
    output: tuple[int, ...]
    cached_tokens: int
    """Prompt tokens served from the cache at the first admission."""
    ttft_s: float
    ttft_steps: int
    preemptions: int

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens


@attrs.frozen
class RunResult:
    requests: dict[str, RequestResult]
    logits: dict[str, list[torch.Tensor]]
    cache: CacheStats
    scheduler: SchedulerStats
    steps: int
    wall_s: float
    tokens_computed: int

    def outputs(self) -> dict[str, tuple[int, ...]]:
        return {k: r.output for k, r in self.requests.items()}


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = cfg = EngineConfig() if config is None else config
        self.device = resolve_device(cfg.device)
        if self.device.type == "cpu" and cfg.cpu_threads is not None:
            torch.set_num_threads(cfg.cpu_threads)
        self.backend = select_backend(cfg.backend, self.device)
        dtype = torch_dtype(cfg.model.dtype)
        self.model = TinyDecoder(cfg.model).to(device=self.device, dtype=dtype).eval()
        self.pool = KVPool(cfg.model, cfg.num_blocks, cfg.block_size, self.device, dtype)
        self.encoder = StubEncoder(cfg.model.hidden_size, cfg.model.seed)
        self.hybrid: HybridPrefixCacheManager | None = None
        self.states: RecurrentStatePool | None = None
        self.state_io: RecurrentStateIO | None = None
        if cfg.model.hybrid:
            self.hybrid = HybridPrefixCacheManager(
                cfg.num_blocks,
                cfg.block_size,
                max_num_seqs=cfg.scheduler.max_num_seqs,
                state_budget=cfg.state_budget,
                decode_state_interval=cfg.decode_state_interval,
                record_events=cfg.record_events,
            )
            self.states = RecurrentStatePool(
                cfg.scheduler.max_num_seqs + cfg.state_budget,
                cfg.model.conv_width,
                cfg.model.hidden_size,
                self.device,
            )
            self.state_io = RecurrentStateIO(self.hybrid, self.states)
        self.cache: PrefixCacheManager = (
            self.hybrid
            if self.hybrid is not None
            else PrefixCacheManager(cfg.num_blocks, cfg.block_size, record_events=cfg.record_events)
        )
        self.speculative = cfg.scheduler.num_draft_tokens > 0
        drafter = NgramDrafter(cfg.ngram) if self.speculative else None
        self.scheduler = Scheduler(
            self.cache, cfg.scheduler, cache_enabled=cfg.cache_enabled, drafter=drafter
        )
        self.runner = ModelRunner(self.model, self.pool, self.backend, self.encoder, self.device)
        self.namespace = Namespace(cfg.model.version)
        self.logits: dict[str, list[torch.Tensor]] = {}
        self._added_at: dict[str, float] = {}
        self._first_token_at: dict[str, float] = {}

    def request(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        multimodal: Sequence[MultimodalItem] = (),
        kv_token_limit: int | None = None,
    ) -> GenerationRequest:
        """A request in this engine's namespace (speculative ones get the recompute window)."""
        vocab = self.config.model.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token ids {bad[:4]} outside the model's vocabulary of {vocab}")
        return GenerationRequest(
            request_id,
            prompt,
            max_new_tokens,
            self.namespace,
            tuple(multimodal),
            kv_token_limit,
            RECOMPUTE_BLOCKS if self.speculative else 0,
        )

    def add(self, request: GenerationRequest) -> None:
        self.scheduler.add(request)
        self._added_at[request.request_id] = time.perf_counter()

    def step(self) -> tuple[StepPlan, RunnerOutput]:
        """One step: schedule, forward, commit.

        A hybrid model's recurrent states move around the forward and the commit through
        :class:`~.state_io.RecurrentStateIO` (restores, checkpoint saves, the kept state).
        """
        plan = self.scheduler.schedule()
        io = self.state_io if not plan.is_idle else None
        try:
            if io is not None:
                states = io.before_forward(plan)
                out = self.runner.forward(plan, states.states, states.capture)
                io.save_checkpoints(states, out)
            else:
                out = self.runner.forward(plan)
        except BaseException:
            self.scheduler.cancel_step()
            raise
        before = {s.seq_id: len(self.scheduler.generation(str(s.seq_id)).tokens) for s in plan.seqs}
        self.scheduler.commit_step(out.output)
        if io is not None:
            io.keep_accepted(plan, out)
        now = time.perf_counter()
        for s, logits in zip(plan.seqs, out.logits, strict=True):
            rid = str(s.seq_id)
            added = len(self.scheduler.generation(rid).tokens) - before[s.seq_id]
            if added:
                self._first_token_at.setdefault(rid, now)
                if self.config.record_logits:
                    self.logits.setdefault(rid, []).extend(logits[:added])
        return plan, out

    def run(
        self,
        workload: Sequence[Turn],
        *,
        on_step: Callable[[Engine, StepPlan], None] | None = None,
        max_steps: int = 1_000_000,
    ) -> RunResult:
        """Serve ``workload`` to completion."""
        ids = [t.request_id for t in workload]
        if len(set(ids)) != len(ids):
            raise InvalidRequest("request ids in a workload must be unique")
        known = set(ids)
        for t in workload:
            if t.follows is not None and t.follows not in known:
                raise InvalidRequest(f"{t.request_id!r} follows unknown request {t.follows!r}")
        pending = list(workload)
        sched = self.scheduler
        start = time.perf_counter()
        steps = 0
        while pending or sched.has_unfinished:
            if steps >= max_steps:
                raise RuntimeError(f"workload not finished after {max_steps} steps")
            still: list[Turn] = []
            for t in pending:
                ready = steps >= t.arrival_step
                parent = None
                if t.follows is not None:
                    parent = sched.generation(t.follows) if t.follows in self._added_at else None
                    ready = ready and parent is not None and parent.finished
                if not ready:
                    still.append(t)
                    continue
                history = list(parent.tokens) if parent is not None else []
                items = [_shift(m, len(history)) for m in t.multimodal]
                self.add(
                    self.request(
                        t.request_id,
                        [*history, *t.tokens],
                        t.max_new_tokens,
                        multimodal=items,
                        kv_token_limit=t.kv_token_limit,
                    )
                )
            pending = still
            plan, _ = self.step()
            steps += 1
            if on_step is not None:
                on_step(self, plan)
        wall = time.perf_counter() - start
        results: dict[str, RequestResult] = {}
        for rid in ids:
            g = sched.generation(rid)
            first = g.first_token_step if g.first_token_step is not None else 0
            results[rid] = RequestResult(
                request_id=rid,
                prompt_tokens=len(g.request.prompt),
                output=g.output,
                cached_tokens=g.num_cached_at_admission,
                ttft_s=self._first_token_at[rid] - self._added_at[rid],
                ttft_steps=first - g.arrival,
                preemptions=g.preemptions,
            )
        return RunResult(
            requests=results,
            logits=self.logits,
            cache=self.cache.stats(),
            scheduler=attrs.evolve(sched.stats),
            steps=steps,
            wall_s=wall,
            tokens_computed=self.runner.tokens_computed,
        )
