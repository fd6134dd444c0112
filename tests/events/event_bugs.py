"""Example block managers with the KV-event bugs real engines shipped.

Each wraps prefixkv's own manager and corrupts only its event stream, the way the engine
named in the bug class did. The cache itself stays correct, so only INV-EVENTS can catch
them. ``snapshot().pending_events`` is corrupted the same way as ``take_events()``: an
engine's pending queue is what it will send.
"""

from __future__ import annotations

from typing import Any

import attrs
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import AllBlocksCleared, BlockRemoved, BlockStored, CacheState, KVEvent
from prefixkv.spec.multimodal import block_extra_keys

from prefixkv.conformance import Capabilities, adapter

__all__ = ["BUGS", "make_buggy"]

#: name -> the real-world bug class it re-creates.
BUGS = {
    "removed_while_served": "BlockRemoved sent when a duplicate copy is freed, though the "
    "published copy is still served (vLLM #55092)",
    "detached_without_removed": "blocks leave the reuse tree with no BlockRemoved, so router "
    "mirrors keep them forever (TensorRT-LLM #16335)",
    "duplicate_store": "every BlockStored is sent twice (Dynamo #8012, llm-d #680)",
    "clear_leaves_entries": "a full reset sends no AllBlocksCleared: the mirror keeps every block",
}


class BuggyEvents:
    """``cache`` with one event bug; everything else is forwarded."""

    def __init__(self, cache: Any, bug: str) -> None:
        if bug not in BUGS:
            raise ValueError(f"unknown event bug {bug!r}")
        self._cache = cache
        self._bug = bug
        self._injected: list[KVEvent] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def _mangle(self, events: list[KVEvent]) -> list[KVEvent]:
        out: list[KVEvent] = []
        for ev in events:
            if self._bug == "detached_without_removed" and isinstance(ev, BlockRemoved):
                continue
            if self._bug == "clear_leaves_entries" and isinstance(ev, AllBlocksCleared):
                continue
            out.append(ev)
            if self._bug == "duplicate_store" and isinstance(ev, BlockStored):
                out.append(ev)
        return out + self._injected

    def take_events(self) -> list[KVEvent]:
        events = self._mangle(self._cache.take_events())
        self._injected = []
        return events

    def snapshot(self) -> CacheState:
        snap: CacheState = self._cache.snapshot()
        return attrs.evolve(snap, pending_events=tuple(self._mangle(list(snap.pending_events))))

    def free(self, seq_ids: Any) -> None:
        if self._bug != "removed_while_served":
            return self._cache.free(seq_ids)  # type: ignore[no-any-return]
        before = self._cache.snapshot()
        try:
            ids = list(seq_ids) if not isinstance(seq_ids, (str, bytes)) else seq_ids
        except TypeError:
            ids = seq_ids  # not iterable: the cache raises its typed error
        self._cache.free(ids)
        # The bug: freeing a private duplicate of a published block announces the identity
        # as gone, though the published twin still serves it.
        self._injected.extend(BlockRemoved((h,)) for h in _twins_of(before, list(ids)))
        return None


def _twins_of(state: CacheState, ids: list[Any]) -> list[int]:
    """Hashes of published blocks that the freed sequences hold private copies of."""
    bs = state.block_size
    by_identity = {
        (v.namespace, v.parent, v.token_ids, v.extra_keys): v for v in state.blocks if v.published
    }
    hashes: list[int] = []
    for seq in state.sequences:
        if seq.seq_id not in ids:
            continue
        parent = None
        for j in range(min(len(seq.block_ids), seq.num_computed // bs)):
            extras = block_extra_keys((), j * bs, bs) if not seq.spans else None
            if extras is None:
                break  # multimodal identities need the content hashes; keep to text
            key = (seq.namespace, parent, seq.token_ids[j * bs : (j + 1) * bs], extras)
            twin = by_identity.get(key)
            if twin is None:
                break
            if twin.block_id != seq.block_ids[j] and twin.wire_hash is not None:
                hashes.append(twin.wire_hash)
            parent = twin.block_id
    return hashes


def make_buggy(bug: str) -> Any:
    """An adapter factory for the conformance kit: prefixkv.impl with ``bug``."""

    @adapter(capabilities=Capabilities(exact=False))
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> BuggyEvents:
        return BuggyEvents(
            PrefixCacheManager(num_blocks, block_size, record_events=record_events), bug
        )

    return make
