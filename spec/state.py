"""An implementation-neutral snapshot of a cache, for invariant checks and comparison.

Both the spec and the optimized implementation can render themselves as a
:class:`CacheState`. :mod:`prefixkv.spec.invariants` checks every INV-* on it, and the
differential state machines require the two snapshots to be equal after every step.
Snapshots are O(num_blocks): they are a testing tool, never on a hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from .events import KVEvent
from .multimodal import MultimodalSpan
from .request import SeqId
from .results import CacheStats

__all__ = [
    "BlockView",
    "CacheState",
    "CheckpointView",
    "SeqRecord",
    "SeqView",
    "StateSlotsView",
    "seq_view",
]


@attrs.frozen
class BlockView:
    """One block of the pool.

    For a published block, ``(namespace, parent, token_ids, extra_keys)`` is its stored
    identity with the parent identity replaced by the parent's block id; this is exact
    because the parent of a published block is published and never reused while the child
    exists (INV-ANCESTOR, INV-INDEX).
    """

    block_id: int
    refcount: int
    published: bool
    namespace: bytes | None = None
    parent: int | None = None
    token_ids: tuple[int, ...] | None = None
    extra_keys: tuple[tuple[int, bytes], ...] = ()
    block_hash: int | None = None
    depth: int = 0
    last_use: int = 0
    routed_experts: bytes | None = None
    """Routed-expert data riding on a published block (never part of its identity)."""
    event_hash: int | None = None
    """The hash the block's KV events carry, when it differs from ``block_hash`` (prefixkv's
    own caches: :func:`~prefixkv.spec.identity.event_hash`, kept while they record events);
    None where the events carry ``block_hash`` (:attr:`wire_hash` reads either)."""

    @property
    def wire_hash(self) -> int | None:
        """The hash this block's KV events carry: ``event_hash``, else ``block_hash``."""
        return self.block_hash if self.event_hash is None else self.event_hash


@attrs.frozen
class SeqView:
    """One live sequence.

    ::

        token_ids  |<--------------- known tokens (prompt + accepted) --------------->|
        KV         |<-------- num_computed -------->|
        slots      |<------------- num_reserved ------------->|
        blocks     [ b0 ][ b1 ][ w2 ][ w3 ][ b4 ][ b5 ]        len = ceil(num_reserved / bs)
                   |<-cached->|<-window->|
    """

    seq_id: SeqId
    namespace: bytes
    token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    num_computed: int
    num_reserved: int
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    """Tokens attached from the cache at admission."""
    num_window_blocks: int = 0
    """Recompute-window blocks, right after the cached ones."""
    kv_token_limit: int | None = None
    spans: tuple[tuple[int, int], ...] = ()
    """``(start, end)`` of each multimodal span of the prompt."""


class SeqRecord(Protocol):
    """What every cache keeps per live sequence, under the same names (the spec's record
    and the manager's ``SeqState`` both have them): all :func:`seq_view` reads."""

    @property
    def seq_id(self) -> SeqId: ...
    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def blocks(self) -> Sequence[int]: ...
    @property
    def num_computed(self) -> int: ...
    @property
    def num_reserved(self) -> int: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def num_cached(self) -> int: ...
    @property
    def window_blocks(self) -> int: ...
    @property
    def kv_token_limit(self) -> int | None: ...
    @property
    def spans(self) -> Sequence[MultimodalSpan]: ...


def seq_view(seq: SeqRecord, namespace: bytes) -> SeqView:
    """Render one live sequence; ``namespace`` is its namespace key (the spec keeps the
    :class:`~prefixkv.spec.namespace.Namespace`, the manager its key)."""
    return SeqView(
        seq_id=seq.seq_id,
        namespace=namespace,
        token_ids=tuple(seq.tokens),
        block_ids=tuple(seq.blocks),
        num_computed=seq.num_computed,
        num_reserved=seq.num_reserved,
        num_prompt_tokens=seq.prompt_len,
        num_cached_tokens=seq.num_cached,
        num_window_blocks=seq.window_blocks,
        kv_token_limit=seq.kv_token_limit,
        spans=tuple((sp.start, sp.end) for sp in seq.spans),
    )


@attrs.frozen
class CheckpointView:
    """One recurrent-state checkpoint (hybrid models, choice 7).

    ``status`` is ``"reserved"`` (``owner`` will save into it), ``"ready"`` (restorable,
    ``node`` is the published block whose boundary it is at), or ``"pinned"`` (Ready, and a
    restore by ``owner`` is pending). ``order`` ranks Ready checkpoints by when they were
    saved: slot pressure evicts the oldest unpinned one first.
    """

    slot: int
    status: str
    boundary: int
    owner: SeqId | None = None
    node: int | None = None
    order: int = 0


@attrs.frozen
class StateSlotsView:
    """The recurrent-state slot pool of a hybrid cache.

    ::

        slots   [ 0 .............................................. R + B - 1 ]
                  each one free, a runtime slot (one per live sequence, at most R),
                  or a checkpoint slot (idle runtime slots are lent to checkpoints)
    """

    num_runtime_slots: int
    state_budget: int
    decode_state_interval: int
    free_slots: tuple[int, ...]
    runtime: tuple[tuple[SeqId, int], ...]
    """(sequence, runtime slot) in admission order."""
    checkpoints: tuple[CheckpointView, ...]
    """Sorted by slot."""
    runtime_positions: tuple[tuple[SeqId, int | None], ...] | None = None
    """(sequence, position of the state its runtime slot holds) in admission order;
    ``None`` as the position while a restore is pending (the slot holds nothing yet).
    ``None`` as a whole: the cache does not track what the runtime slots hold."""


@attrs.frozen
class CacheState:
    num_blocks: int
    block_size: int
    blocks: tuple[BlockView, ...]
    free_queue: tuple[int, ...]
    index: tuple[tuple[int, int], ...]
    """(hash key, block id) for every index entry, sorted."""
    sequences: tuple[SeqView, ...]
    """Live sequences in admission order."""
    stats: CacheStats
    pending_events: tuple[KVEvent, ...]
    state_slots: StateSlotsView | None = None
    """Hybrid caches only."""
