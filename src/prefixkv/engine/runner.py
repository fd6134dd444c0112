"""The model runner: one forward over a planned step, greedy sampling."""

from __future__ import annotations

import attrs
import torch

from prefixkv.impl.step import StepOutput, StepPlan

from .backend import Backend
from .batch import build_step_batch
from .kv_pool import KVPool
from .model import TinyDecoder
from .multimodal import StubEncoder

__all__ = ["ModelRunner", "RunnerOutput"]


@attrs.frozen
class RunnerOutput:
    output: StepOutput
    logits: tuple[torch.Tensor, ...]  # per scheduled sequence: [num_samples, vocab], on CPU


class ModelRunner:
    def __init__(
        self, model: TinyDecoder, pool: KVPool, backend: Backend, encoder: StubEncoder,
        device: torch.device,
    ) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.encoder = encoder
        self.device = device
        self.tokens_computed = 0

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> RunnerOutput:
        if plan.is_idle:
            return RunnerOutput(StepOutput(()), ())
        batch = build_step_batch(plan, self.pool.block_size, self.device)
        embeds = self.model.embed(batch.input_ids)
        for o in batch.overrides:
            rows = self.encoder.encode(o.item)[o.offset : o.offset + o.length]
            embeds[o.row : o.row + o.length] = rows.to(device=embeds.device, dtype=embeds.dtype)
        logits = self.model(
            embeds, batch.positions, self.pool, batch.meta, batch.host_lens, self.backend,
            batch.sample_rows,
        )
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
