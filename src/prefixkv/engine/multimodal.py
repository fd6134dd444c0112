"""A stub multimodal encoder: content bytes -> embeddings at the placeholder positions.

Real encoders (a ViT, an audio tower) map an item's content to one embedding per
placeholder token. The stub does the same deterministically: the embeddings are drawn from
a generator seeded with the SHA-256 of the content, so equal content gives equal
embeddings and different content (behind identical placeholder ids) gives different ones.
That is exactly the case the cache must keep apart through the span's extra keys.
"""

from __future__ import annotations

import hashlib

import torch

from prefixkv.spec.multimodal import MultimodalSpan

from .generation import MultimodalItem

__all__ = ["StubEncoder", "content_hash", "image_item"]


def content_hash(content: bytes) -> bytes:
    return hashlib.sha256(content).digest()


def image_item(start: int, length: int, content: bytes, modality: str = "image") -> MultimodalItem:
    """A multimodal item over ``[start, start + length)`` whose span carries the content's hash."""
    return MultimodalItem(
        MultimodalSpan(start, start + length, modality, content_hash(content)), content
    )


class StubEncoder:
    def __init__(self, hidden_size: int, seed: int = 0) -> None:
        self.hidden_size = hidden_size
        self.seed = seed
        self._memo: dict[tuple[bytes, int], torch.Tensor] = {}

    def encode(self, item: MultimodalItem) -> torch.Tensor:
        """``[span length, hidden_size]`` float32 embeddings for ``item`` (CPU, memoised)."""
        key = (item.content, item.span.length)
        cached = self._memo.get(key)
        if cached is None:
            digest = hashlib.sha256(self.seed.to_bytes(8, "big") + item.content).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
            cached = torch.randn(item.span.length, self.hidden_size, generator=gen)
            self._memo[key] = cached
        return cached
