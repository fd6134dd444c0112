"""Variants of the engine-style manager with another policy, to test the capabilities.

Each correct variant follows one design difference that real engines have (publish at
schedule time, any-order eviction, last-wins duplicates); each buggy one breaks the safety
property the kit checks instead of prefixkv's policy. Only the kit's tests use them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
from prefixkv.spec import Admission, Request

from examples.engine_style import CAPABILITIES, EngineStyleManager, _Seq, factory_for
from prefixkv.conformance import Capabilities

__all__ = [
    "AnyOrderEviction",
    "LastWinsDuplicates",
    "LeaksUnreachable",
    "SchedulePublish",
    "SchedulePublishKeepsCancelled",
    "make",
]


class SchedulePublish(EngineStyleManager):
    """Publishes a full block as soon as it is allocated with known tokens (vLLM v1), and
    unpublishes the blocks a sequence never computed when it is freed or rolled back."""

    def _publish_known(self, seq: _Seq) -> None:
        bs = self.block_size
        for j in range(seq.cached // bs, min(seq.reserved, len(seq.tokens)) // bs):
            self._publish(seq, j)

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        adm = super().admit(req, num_new_tokens)
        self._publish_known(self.seqs[req.seq_id])
        return adm

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        new = super().append(seq_id, num_tokens)
        self._publish_known(self._seq(seq_id))
        return new

    def _unpublish_uncomputed(self, seq: _Seq, first: int) -> None:
        bs = self.block_size
        for j in reversed(range(max(first, seq.computed // bs), len(seq.blocks))):
            b = seq.blocks[j]
            blk = self.blocks[b]
            mine = j >= seq.cached // bs and blk.hash is not None and blk.children == 0
            if mine and blk.hash is not None and self.hash_to_block.get(blk.hash) == b:
                self._evict_block(b)
                self.counters["evictions"] -= 1  # withdrawn, not evicted

    def free(self, seq_ids: Iterable[Any]) -> None:
        ids = list(seq_ids) if isinstance(seq_ids, (list, tuple)) else None
        if ids is not None and all(s in self.seqs for s in ids) and len(set(ids)) == len(ids):
            for s in ids:
                self._unpublish_uncomputed(self.seqs[s], 0)
        super().free(seq_ids)

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        seq = self._seq(seq_id)
        if isinstance(num_tokens, int) and 0 < num_tokens <= seq.reserved - seq.computed:
            keep = -(-(seq.reserved - num_tokens) // self.block_size)
            self._unpublish_uncomputed(seq, keep)
        super().rollback(seq_id, num_tokens)


class SchedulePublishKeepsCancelled(SchedulePublish):
    """Bug: a cancelled writer's blocks stay findable, so a later request is served KV that
    was never written."""

    def _unpublish_uncomputed(self, seq: _Seq, first: int) -> None:
        return


class AnyOrderEviction(EngineStyleManager):
    """Evicts any cached block, lowest block id first, so parents (allocated first) tend to
    go before their children (content-addressed caches)."""

    def _take(self) -> int:
        b = min(self.free_ids)
        self.free_ids.remove(b)
        if self.blocks[b].hash is not None:
            self._evict_block(b)
        return b

    def _supply(self, pinned: Iterable[int] = ()) -> int:
        held = set(pinned)
        return sum(1 for b in self.free_ids if b not in held)

    def evict(self, num_blocks: int) -> int:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            return super().evict(num_blocks)  # the same InvalidRequest
        cached = sorted(b for b in self.free_ids if self.blocks[b].hash is not None)
        cached = cached[:num_blocks]
        for b in cached:
            self._evict_block(b)
        return len(cached)


class LeaksUnreachable(AnyOrderEviction):
    """Bug: eviction walks the index from the roots, so a block whose parent was evicted is
    unreachable and never evicted again."""

    def _reachable(self, b: int) -> bool:
        parent = self.blocks[b].parent
        return parent < 0 or self.blocks[parent].hash is not None

    def evict(self, num_blocks: int) -> int:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            return super().evict(num_blocks)
        cached = sorted(
            b for b in self.free_ids if self.blocks[b].hash is not None and self._reachable(b)
        )[:num_blocks]
        for b in cached:
            self._evict_block(b)
        return len(cached)


class LastWinsDuplicates(EngineStyleManager):
    """A second block with a published identity is published too and takes over the index
    entry; the older copy stays published (shared, read-only) until it is evicted."""

    def _publish(self, seq: _Seq, j: int) -> None:
        bs, b = self.block_size, seq.blocks[j]
        parent = seq.blocks[j - 1] if j else -1
        if parent >= 0 and self.blocks[parent].hash is None:
            return
        tokens = tuple(seq.tokens[j * bs : (j + 1) * bs])
        h = self.block_hash(self.blocks[parent].hash if parent >= 0 else None, seq.ns, tokens)
        if self.hash_to_block.get(h) == b or self.blocks[b].hash is not None:
            return
        blk = self.blocks[b]
        blk.hash, blk.tokens, blk.parent, blk.ns = h, tokens, parent, seq.ns
        blk.depth = self.blocks[parent].depth + 1 if parent >= 0 else 1
        if parent >= 0:
            self.blocks[parent].children += 1
        self.hash_to_block[h] = b  # last wins
        self.counters["published"] += 1

    def _evict_block(self, b: int) -> None:
        blk = self.blocks[b]
        assert blk.hash is not None
        if self.hash_to_block.get(blk.hash) == b:
            del self.hash_to_block[blk.hash]
        if blk.parent >= 0:
            self.blocks[blk.parent].children -= 1
        blk.hash, blk.tokens, blk.parent, blk.ns, blk.depth = None, (), -1, b"", 0
        self.counters["evictions"] += 1

    def stats(self) -> Any:
        # older copies are published too, though the index lists only the newest
        published = sum(1 for blk in self.blocks if blk.hash is not None)
        return attrs.evolve(super().stats(), num_published_blocks=published)


def make(cls: type[EngineStyleManager], **policy: Any) -> Any:
    """An adapter factory for ``cls`` declaring ``policy`` on top of the example's own."""
    return factory_for(cls).with_capabilities(attrs.evolve(CAPABILITIES, **policy))


#: The example's own capabilities (prefixkv's policy, safety mode).
BASE: Capabilities = CAPABILITIES
