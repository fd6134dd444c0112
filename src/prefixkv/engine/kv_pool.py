"""The paged KV tensors: one key and one value cache per layer, NHD layout.

Block ``b`` of the cache manager is page ``b`` of every layer's cache: the manager's block
table is the kernels' block table, with no conversion (``page_size == block_size``).
"""

from __future__ import annotations

import torch

from .config import ModelConfig

__all__ = ["KVPool"]


class KVPool:
    """``[attention layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``, one tensor.

    Views from ``unbind`` (explicit strides) are what the kernels receive.
    """

    def __init__(
        self,
        model: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # NOTE: zero-filled, not empty, so that every run is deterministic. A read of a slot
        # never written then gives zeros in both runs, and may slip past an on/off
        # comparison; reads of stale or wrong KV do not, which the corruption test shows.
        self.data = torch.zeros(
            model.num_attention_layers,
            2,
            num_blocks,
            block_size,
            model.num_kv_heads,
            model.head_dim,
            device=device,
            dtype=dtype,
        )
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (layer[0], layer[1]) for layer in self.data.unbind(0)
        ]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def corrupt(self, block_id: int, *, amount: float = 1.0) -> None:
        """Add ``amount`` to every key and value of ``block_id`` in every layer (for tests
        that show a wrong cached block breaks cache-on == cache-off)."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} outside the pool of {self.num_blocks}")
        self.data[:, :, block_id] += amount
