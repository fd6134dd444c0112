"""Compute backends: how the model writes KV into the paged cache and attends over it.

* ``fast``: the Triton kernels of :mod:`prefixkv.kernels` on CUDA (``write_kv``, then
  ``prefill_attention`` for mixed batches, ``decode_attention`` for one-token batches).
* ``interpreter``: the same Triton kernels on CPU tensors under the Triton interpreter
  (``TRITON_INTERPRET=1`` must be set before triton is imported). Slow; for tests.
* ``torch``: plain torch on any device, with the semantics of the kernels' torch
  references (:mod:`prefixkv.kernels.reference`), vectorised per sequence: write by slot,
  gather each sequence's keys through its block table, bottom-right causal attention.
* ``auto``: ``fast`` on CUDA, ``torch`` on the CPU.

All backends read keys and values only from the paged cache (the kernels' convention: the
new tokens' KV is written first), so a corrupted cached block changes the output whichever
backend runs.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch

from prefixkv.kernels.metadata import BatchMetadata

from .errors import BackendUnavailable

__all__ = ["Backend", "FastBackend", "TorchBackend", "resolve_device", "select_backend"]


class Backend(Protocol):
    name: str

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
    ) -> None: ...

    def attend(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
    ) -> torch.Tensor:
        """``q`` ``[tokens, q_heads, head_dim]`` -> same shape. ``host_lens`` holds each
        sequence's ``(cached, new)`` lengths as host ints (no device reads needed)."""
        ...


class TorchBackend:
    """Plain torch, the kernels' reference semantics, computed in float32."""

    name = "torch"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
    ) -> None:
        slots = meta.slot_mapping[: meta.num_tokens]
        kflat = key_cache.view(-1, *key_cache.shape[2:])
        vflat = value_cache.view(-1, *value_cache.shape[2:])
        kflat[slots] = key[: meta.num_tokens].to(key_cache.dtype)
        vflat[slots] = value[: meta.num_tokens].to(value_cache.dtype)

    def attend(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
    ) -> torch.Tensor:
        page = key_cache.shape[1]
        kflat = key_cache.view(-1, *key_cache.shape[2:])
        vflat = value_cache.view(-1, *value_cache.shape[2:])
        table = meta.block_table.table.long()
        qpk = q.shape[1] // key_cache.shape[2]
        scale = q.shape[-1] ** -0.5
        out = torch.empty_like(q)
        row = 0
        for i, (cached, new) in enumerate(host_lens):
            total = cached + new
            pos = torch.arange(total, device=q.device)
            slots = table[i, pos // page] * page + pos % page
            k = kflat[slots].float().repeat_interleave(qpk, dim=1).transpose(0, 1)  # [Hq,S,D]
            v = vflat[slots].float().repeat_interleave(qpk, dim=1).transpose(0, 1)
            qs = q[row : row + new].float().transpose(0, 1)  # [Hq, L, D]
            # bottom-right causal: new query j sits at position cached + j
            visible = pos.unsqueeze(0) <= (torch.arange(new, device=q.device) + cached)[:, None]
            scores = (qs @ k.transpose(1, 2)) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            out[row : row + new] = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).to(q.dtype)
            row += new
        return out


class FastBackend:
    """The Triton kernels: compiled on CUDA, or under the interpreter on the CPU."""

    def __init__(self, name: str) -> None:
        self.name = name
        from prefixkv import kernels

        self._k = kernels

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
    ) -> None:
        self._k.write_kv(key, value, key_cache, value_cache, meta.slot_mapping)

    def attend(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: BatchMetadata,
        host_lens: tuple[tuple[int, int], ...],
    ) -> torch.Tensor:
        if meta.max_query_len == 1 and meta.num_tokens == meta.num_seqs:
            return self._k.decode_attention(
                q,
                key_cache,
                value_cache,
                meta.block_table,
                meta.seq_lens,
                max_seq_len=meta.max_seq_len,
            )
        return self._k.prefill_attention(
            q,
            key_cache,
            value_cache,
            meta.block_table,
            meta.query_start_loc,
            meta.seq_lens,
            max_query_len=meta.max_query_len,
        )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {device!r} asked for, but CUDA is not available")
    return dev


def select_backend(name: str, device: torch.device) -> Backend:
    """The backend called ``name`` for ``device``; raises :class:`BackendUnavailable`."""
    if name == "auto":
        name = "fast" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchBackend()
    if name == "fast":
        if device.type != "cuda":
            raise BackendUnavailable(
                "the fast backend runs the Triton kernels on CUDA; use backend='torch' on "
                "the CPU, or 'interpreter' with TRITON_INTERPRET=1"
            )
        return FastBackend("fast")
    if name == "interpreter":
        if device.type != "cpu" or not _interpreting():
            raise BackendUnavailable(
                "the interpreter backend needs CPU tensors and TRITON_INTERPRET=1 set before "
                "triton is first imported"
            )
        return FastBackend("interpreter")
    raise BackendUnavailable(f"unknown backend {name!r}")
