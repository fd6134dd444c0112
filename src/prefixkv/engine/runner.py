"""The model runner: one forward over a planned step, greedy sampling."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from prefixkv.impl.generation import MultimodalItem
from prefixkv.impl.step import ScheduledSeq, StepOutput, StepPlan
from prefixkv.spec.request import SeqId

from .backend import Backend
from .batch import build_step_batch
from .hybrid import RecurrentState, RecurrentStateStore
from .kv_pool import KVPool
from .model import TinyDecoder
from .multimodal import StubEncoder

#: A sequence's tokens so far and its multimodal items (the hybrid model's state recompute
#: reads the cached prefix, which the step plan does not carry).
ContextFn = Callable[[SeqId], tuple[Sequence[int], Sequence[MultimodalItem]]]

__all__ = ["ModelRunner", "RunnerOutput"]


@attrs.frozen
class RunnerOutput:
    output: StepOutput
    logits: tuple[torch.Tensor, ...]  # per scheduled sequence: [num_samples, vocab], on CPU


class ModelRunner:
    def __init__(
        self, model: TinyDecoder, pool: KVPool, backend: Backend, encoder: StubEncoder,
        device: torch.device, context: ContextFn | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.encoder = encoder
        self.device = device
        self.context = context
        self.states = RecurrentStateStore()
        self.tokens_computed = 0

    def embed(
        self, ids: Sequence[int], start: int, items: Sequence[MultimodalItem]
    ) -> torch.Tensor:
        """Input embeddings of positions ``start ..`` holding ``ids``, items included."""
        embeds: torch.Tensor = self.model.embed(
            torch.tensor(list(ids), dtype=torch.int64, device=self.device)
        )
        end = start + len(ids)
        for item in items:
            lo, hi = max(item.span.start, start), min(item.span.end, end)
            if lo < hi:
                rows = self.encoder.encode(item)[lo - item.span.start : hi - item.span.start]
                embeds[lo - start : hi - start] = rows.to(embeds.device, embeds.dtype)
        return embeds

    def _initial_state(self, s: ScheduledSeq) -> RecurrentState | None:
        """The hybrid layer's state at ``s.start``: stored, or recomputed from scratch."""
        if s.start == 0:
            return None
        if self.context is None:
            raise RuntimeError("the hybrid model's runner needs a context function")
        tokens, items = self.context(s.seq_id)
        prefix = tokens[: s.start]
        state = self.states.get(s.seq_id, prefix)
        if state is None:
            assert self.model.recurrent is not None
            _, state = self.model.recurrent(self.embed(prefix, 0, items), None)
            self.states.recomputes += 1
            self.states.recomputed_tokens += s.start
        return state

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> RunnerOutput:
        if plan.is_idle:
            return RunnerOutput(StepOutput(()), ())
        batch = build_step_batch(plan, self.pool.block_size, self.device)
        embeds = self.model.embed(batch.input_ids)
        for o in batch.overrides:
            rows = self.encoder.encode(o.item)[o.offset : o.offset + o.length]
            embeds[o.row : o.row + o.length] = rows.to(device=embeds.device, dtype=embeds.dtype)
        hybrid = self.model.recurrent is not None
        states = [self._initial_state(s) for s in plan.seqs] if hybrid else []
        logits, after = self.model(
            embeds, batch.positions, self.pool, batch.meta, batch.host_lens, self.backend,
            batch.sample_rows, states,
        )
        if hybrid and self.context is not None:
            for s, state in zip(plan.seqs, after, strict=True):
                history, _ = self.context(s.seq_id)
                self.states.put(s.seq_id, [*history[: s.start], *s.token_ids], state)
        self.tokens_computed += batch.meta.num_tokens
        # One host transfer per step: the sampled tokens (and logits) go back to the host.
        tokens = logits.argmax(-1).tolist()
        logits_cpu = logits.cpu()
        sampled: list[tuple[int, ...]] = []
        per_seq: list[torch.Tensor] = []
        row = 0
        for n in batch.samples_per_seq:
            sampled.append(tuple(int(t) for t in tokens[row : row + n]))
            per_seq.append(logits_cpu[row : row + n])
            row += n
        return RunnerOutput(StepOutput(tuple(sampled)), tuple(per_seq))
