"""TinyDecoder: a decoder-only transformer with seeded random weights.

Small enough to run a workload in seconds on two CPU cores, real enough that every part of
the KV path matters: grouped-query attention reads K/V through the block table, RoPE ties
each key to its absolute position, and greedy decoding turns any wrong KV into different
logits and, soon, different tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from prefixkv.kernels.metadata import BatchMetadata

from .backend import Backend
from .config import ModelConfig
from .hybrid import RecurrentLayer, RecurrentState
from .kv_pool import KVPool
from .layers import DecoderLayer, RmsNorm

__all__ = ["TinyDecoder", "torch_dtype"]


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


class TinyDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.recurrent = RecurrentLayer(cfg) if cfg.hybrid else None
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_attention_layers)])
        self.norm = RmsNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Seeded, fan-in scaled weights.

        NOTE: not the usual std=0.02: with it a random model's logits are nearly flat and
        greedy argmax would sit on near-ties, where float noise between two equally correct
        schedules could flip a token. Fan-in scaling keeps logit gaps of order one.
        """
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = p.shape[-1] if p.dim() > 1 and not name.startswith("embed") else 1
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        self.lm_head.weight.mul_(2.0)

    def forward(
        self,
        input_embeds: torch.Tensor,
        positions: torch.Tensor,
        pool: KVPool,
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
        backend: Backend,
        sample_rows: torch.Tensor,
        states: Sequence[RecurrentState | None] = (),
        capture: Sequence[Sequence[int]] = (),
    ) -> tuple[torch.Tensor, list[dict[int, RecurrentState]]]:
        """Logits ``[len(sample_rows), vocab]`` (float32) of the rows that are sampled, and
        (hybrid model) each sequence's recurrent states after ``k`` of its new rows, for
        each ``k`` in its ``capture`` entry and for all of them.

        ``states`` holds each sequence's recurrent state at its first new position (None:
        the sequence starts at position 0).
        """
        x = input_embeds
        new_states: list[dict[int, RecurrentState]] = []
        if self.recurrent is not None:
            parts, row = [], 0
            captures = capture or [()] * len(host_lens)
            for (_, new), state, want in zip(host_lens, states, captures, strict=True):
                out, after = self.recurrent(x[row : row + new], state, want)
                parts.append(out)
                new_states.append(after)
                row += new
            x = torch.cat(parts)
        for layer, kv in zip(self.layers, pool.layers, strict=True):
            x = layer(x, positions, kv, meta, host_lens, backend)
        logits: torch.Tensor = self.lm_head(self.norm(x[sample_rows]))
        return logits.float(), new_states
