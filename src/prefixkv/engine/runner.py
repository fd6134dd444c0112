"""The model runner: one forward over a planned step, greedy sampling."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from .backend import Backend
from .batch import build_step_batch
from .generation import MultimodalItem
from .hybrid import RecurrentState
from .kv_pool import KVPool
from .model import TinyDecoder
from .multimodal import StubEncoder
from .step import StepOutput, StepPlan

__all__ = ["ModelRunner", "RunnerOutput"]


@attrs.frozen
class RunnerOutput:
    output: StepOutput
    logits: tuple[torch.Tensor, ...]  # per scheduled sequence: [num_samples, vocab], on CPU
    #: Hybrid model, per scheduled sequence: its recurrent state after each position asked
    #: for in ``capture`` and after its last new token, keyed by absolute position.
    states: tuple[dict[int, RecurrentState], ...] = ()


class ModelRunner:
    def __init__(
        self,
        model: TinyDecoder,
        pool: KVPool,
        backend: Backend,
        encoder: StubEncoder,
        device: torch.device,
    ) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.encoder = encoder
        self.device = device
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

    @torch.inference_mode()
    def forward(
        self,
        plan: StepPlan,
        states: Sequence[RecurrentState | None] = (),
        capture: Sequence[Sequence[int]] = (),
    ) -> RunnerOutput:
        """Run ``plan``. Hybrid model: ``states`` holds each sequence's recurrent state at
        its ``start`` (None at 0), ``capture`` the absolute positions (in ``start + 1 ..
        end``) whose states to return besides the one after the last new token."""
        if plan.is_idle:
            return RunnerOutput(StepOutput(()), ())
        batch = build_step_batch(plan, self.pool.block_size, self.device)
        embeds = self.model.embed(batch.input_ids)
        for o in batch.overrides:
            rows = self.encoder.encode(o.item)[o.offset : o.offset + o.length]
            embeds[o.row : o.row + o.length] = rows.to(device=embeds.device, dtype=embeds.dtype)
        hybrid = self.model.recurrent is not None
        if hybrid and len(states) != len(plan.seqs):
            raise ValueError("the hybrid model needs each sequence's recurrent state")
        relative = (
            [[p - s.start for p in want] for s, want in zip(plan.seqs, capture, strict=True)]
            if capture
            else []
        )
        logits, after = self.model(
            embeds,
            batch.positions,
            self.pool,
            batch.meta,
            batch.host_lens,
            self.backend,
            batch.sample_rows,
            states,
            relative,
        )
        absolute = (
            tuple(
                {s.start + k: state for k, state in by_rows.items()}
                for s, by_rows in zip(plan.seqs, after, strict=True)
            )
            if hybrid
            else ()
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
        return RunnerOutput(StepOutput(tuple(sampled)), tuple(per_seq), absolute)
