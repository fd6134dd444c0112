"""Layers of the tiny decoder: RMSNorm, rotary embeddings, GQA attention over the paged
cache, SwiGLU MLP. Plain torch modules; attention goes through a :class:`Backend`."""

from __future__ import annotations

import torch
from torch import nn

from prefixkv.kernels.metadata import BatchMetadata

from .backend import Backend
from .config import ModelConfig

__all__ = ["Attention", "DecoderLayer", "Mlp", "RmsNorm", "apply_rope"]


class RmsNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` ``[tokens, heads, dim]`` at ``positions``.

    The angle depends only on a token's absolute position, which is what lets a cached
    prefix's keys be reused by any later request: position ``p`` is rotated the same way
    whichever step computed it.
    """
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = positions.float()[:, None] * inv[None, :]  # [tokens, dim/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    xf = x.float()
    half = dim // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(
            cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False
        )
        self.out = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
        backend: Backend,
    ) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        qkv = self.qkv(x)
        q_end = cfg.num_heads * cfg.head_dim
        k_end = q_end + cfg.num_kv_heads * cfg.head_dim
        q = qkv[:, :q_end].reshape(t, cfg.num_heads, cfg.head_dim)
        k = qkv[:, q_end:k_end].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, k_end:].reshape(t, cfg.num_kv_heads, cfg.head_dim).contiguous()
        q = apply_rope(q, positions, cfg.rope_theta).contiguous()
        k = apply_rope(k, positions, cfg.rope_theta).contiguous()
        key_cache, value_cache = kv
        # KV first, then attention reads every key (cached prefix and new) from the cache.
        backend.write_kv(k, v, key_cache, value_cache, meta)
        o = backend.attend(q, key_cache, value_cache, meta, host_lens)
        out: torch.Tensor = self.out(o.reshape(t, q_end))
        return out


class Mlp(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        down: torch.Tensor = self.down(nn.functional.silu(gate) * up)
        return down


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RmsNorm(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.mlp_norm = RmsNorm(cfg.hidden_size)
        self.mlp = Mlp(cfg)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
        backend: Backend,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions, kv, meta, host_lens, backend)
        mlp: torch.Tensor = self.mlp(self.mlp_norm(x))
        return x + mlp
