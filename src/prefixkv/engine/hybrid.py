"""The hybrid model's recurrent layer: a causal depthwise conv and a gated linear recurrence.

A tiny Mamba/Griffin-style block. Unlike attention KV, its state is not per position: after
position ``p`` a sequence has one conv window (the last ``width - 1`` inputs) and one
recurrent vector ``h``, summarising everything before ``p``. A prefix hit therefore gives
the attention layers their KV but not this state: the engine restores it from a
checkpoint that the cache manager (:class:`~prefixkv.impl.HybridPrefixCacheManager`,
choice 7) kept at exactly the hit's boundary.

The states live in a :class:`RecurrentStatePool`, one row per cache state slot: a live
sequence's runtime slot holds its state after its computed tokens; a checkpoint slot holds
the state at the checkpoint's boundary.

::

    positions   0 ............ start-1 | start ... end-1
    attention   KV from the cache      | computed, written
    recurrent   state(start): copied from the checkpoint slot into the runtime slot at
                admission (restore), then read from the runtime slot every step
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import nn

from .config import ModelConfig
from .errors import EngineError
from .layers import Mlp, RmsNorm

__all__ = ["RecurrentLayer", "RecurrentState", "RecurrentStatePool", "StaleRecurrentState"]


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
        self, x: torch.Tensor, state: RecurrentState | None, capture: Sequence[int] = ()
    ) -> tuple[torch.Tensor, dict[int, RecurrentState]]:
        """One sequence's rows ``x`` ``[L, hidden]`` continuing from ``state`` (None: the
        sequence starts here). Returns the layer output and the states after ``k`` rows for
        every ``k`` in ``capture`` and for ``k = L``, keyed by ``k``."""
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
        n = conv.shape[0]
        states: dict[int, RecurrentState] = {}
        for k in {*capture, n}:
            if not 0 < k <= n:
                raise IndexError(f"capture after {k} rows of a {n}-row input")
            # after k rows the conv window holds rows k .. k + width - 2 of ``window``
            states[k] = RecurrentState(conv=window[k : k + self.width - 1], h=outs[k - 1])
        return out + mlp, states


class StaleRecurrentState(EngineError, RuntimeError):
    """A state slot does not hold the state at the position the engine asked for: the
    engine's save/restore bookkeeping is wrong (never a user error)."""


class RecurrentStatePool:
    """The recurrent states of the hybrid model, one row per cache state slot.

    Each slot is tagged with the position its state was taken at (-1: nothing); a read
    at another position raises :class:`StaleRecurrentState` instead of silently feeding
    the model a state from the wrong place. Which slot is whose, and when a checkpoint is
    Ready, is the cache manager's business; this only holds the tensors.
    """

    def __init__(self, num_slots: int, width: int, dim: int, device: torch.device) -> None:
        self.conv = torch.zeros(num_slots, width - 1, dim, dtype=torch.float32, device=device)
        self.h = torch.zeros(num_slots, dim, dtype=torch.float32, device=device)
        self.positions = [-1] * num_slots
        self.saves = 0
        self.restores = 0

    @property
    def num_slots(self) -> int:
        return len(self.positions)

    def write(self, slot: int, position: int, state: RecurrentState) -> None:
        self.conv[slot] = state.conv
        self.h[slot] = state.h
        self.positions[slot] = position

    def read(self, slot: int, position: int) -> RecurrentState:
        if self.positions[slot] != position:
            raise StaleRecurrentState(
                f"state slot {slot} holds the state at position {self.positions[slot]}, "
                f"not {position}"
            )
        return RecurrentState(conv=self.conv[slot].clone(), h=self.h[slot].clone())

    def copy(self, src: int, dst: int) -> int:
        """Copy slot ``src`` into ``dst`` (a restore); returns the position it holds."""
        self.conv[dst] = self.conv[src]
        self.h[dst] = self.h[src]
        self.positions[dst] = self.positions[src]
        return self.positions[dst]

    def corrupt(self, slot: int, *, amount: float = 1.0) -> None:
        """Add ``amount`` to the state in ``slot`` (for tests that show a wrong checkpoint
        breaks cache-on == cache-off)."""
        self.conv[slot] += amount
        self.h[slot] += amount
