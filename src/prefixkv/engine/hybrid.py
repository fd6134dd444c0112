"""The hybrid model's recurrent layer: a causal depthwise conv and a gated linear recurrence.

A tiny Mamba/Griffin-style block. Unlike attention KV, its state is not per position: after
position ``p`` a sequence has one conv window (the last ``width - 1`` inputs) and one
recurrent vector ``h``, summarising everything before ``p``. A prefix hit therefore gives
the attention layers their KV but not this state.

NOTE: the cache manager's checkpoint lifecycle (choice 7: save a Ready checkpoint at block
boundaries, restore it on a hit at exactly that boundary) is not wired here yet. The runner
recomputes the state from scratch over the cached prefix instead
(:class:`RecurrentStateStore`): correct, it only forgoes the saving for this one layer.
When the checkpoint API lands, the store's "recompute" path becomes "restore the Ready
checkpoint at the matched boundary", with the same validation.

::

    positions   0 ............ start-1 | start ... end-1
    attention   KV from the cache      | computed, written
    recurrent   state(start): restored from the store when it was left exactly at
                ``start`` by the same tokens, else recomputed by a scan over 0..start-1
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import nn

from .config import ModelConfig
from .layers import Mlp, RmsNorm

__all__ = ["RecurrentLayer", "RecurrentState", "RecurrentStateStore"]


@attrs.frozen
class RecurrentState:
    conv: torch.Tensor  # [width - 1, dim]: the last inputs of the conv
    h: torch.Tensor  # [dim]


class RecurrentLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.width = cfg.conv_width
        self.norm = RmsNorm(d)
        self.in_proj = nn.Linear(d, 2 * d, bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(d, cfg.conv_width))
        self.decay_logit = nn.Parameter(torch.zeros(d))
        self.out_proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = RmsNorm(d)
        self.mlp = Mlp(cfg)

    def initial_state(self, like: torch.Tensor) -> RecurrentState:
        d = self.out_proj.in_features
        return RecurrentState(
            conv=torch.zeros(self.width - 1, d, dtype=torch.float32, device=like.device),
            h=torch.zeros(d, dtype=torch.float32, device=like.device),
        )

    def forward(
        self, x: torch.Tensor, state: RecurrentState | None
    ) -> tuple[torch.Tensor, RecurrentState]:
        """One sequence's rows ``x`` ``[L, hidden]`` continuing from ``state`` (None: the
        sequence starts here). Returns the layer output and the state after the last row."""
        if state is None:
            state = self.initial_state(x)
        u, gate = self.in_proj(self.norm(x)).float().chunk(2, dim=-1)
        window = torch.cat([state.conv, u], dim=0)  # [width - 1 + L, d]
        # causal depthwise conv: output t reads inputs t .. t + width - 1 of the window
        conv = (window.unfold(0, self.width, 1) * self.conv_weight.float()).sum(-1)  # [L, d]
        a = torch.sigmoid(self.decay_logit.float())
        h = state.h
        outs = []
        for t in range(conv.shape[0]):
            h = a * h + (1 - a) * conv[t]
            outs.append(h)
        hs = torch.stack(outs) if outs else conv
        y = self.out_proj((hs * nn.functional.silu(gate)).to(x.dtype))
        out = x + y
        mlp: torch.Tensor = self.mlp(self.mlp_norm(out))
        new_state = RecurrentState(conv=window[window.shape[0] - (self.width - 1) :], h=h)
        return out + mlp, new_state


class RecurrentStateStore:
    """Each live sequence's recurrent state, and the tokens it summarises.

    A stored state is reused only for the exact same token prefix: after a speculative
    step with rejected drafts, or a preemption, the prefix differs and the state is
    recomputed instead of being trusted.
    """

    def __init__(self) -> None:
        self._states: dict[object, tuple[tuple[int, ...], RecurrentState]] = {}
        self.recomputes = 0
        self.recomputed_tokens = 0

    def get(self, seq_id: object, prefix: Sequence[int]) -> RecurrentState | None:
        entry = self._states.get(seq_id)
        if entry is None or entry[0] != tuple(prefix):
            return None
        return entry[1]

    def put(self, seq_id: object, prefix: Sequence[int], state: RecurrentState) -> None:
        self._states[seq_id] = (tuple(prefix), state)

    def drop(self, seq_id: object) -> None:
        self._states.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._states)
