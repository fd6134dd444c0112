"""Room promises: a cache that says there is room must be able to do it without running out.

``can_admit``, ``can_append`` and ``can_continue_prefill`` are promises about the pool. Before
the kit issues the operation a ``True`` answer promised, it counts, from the candidate's own
snapshot, the fewest new blocks the operation takes (``need``) and the most blocks any cache
could hand it (``supply``). When ``need > supply`` the promise cannot be kept, whatever the
cache does next: the check fails (``CAN-ADMIT``, ``CAN-APPEND``, ``CAN-CONTINUE``) before the
operation runs, with the counts, instead of as the ``CRASH`` of the manager's own allocation
guard tripping halfway.

The counts, and why each holds in every design the kit knows::

    need   = blocks_for(end) - blocks held      the table holds ceil(reserved / bs) blocks
                                                (INV-LIMIT); an admission holds its hits
    supply = free + evictable - own hits        blocks no table holds and no reference pins

* ``end`` is the reservation the operation must reach: ``reserved + n`` for ``append``
  (speculative slots included: drafts are slots like any other, and an MTP engine's kept
  draft slots are already in ``reserved``), and :func:`~prefixkv.spec.contract.chunk_end`
  for an admission or a chunk (the whole prompt without a budget, at most the budget and
  ``kv_token_limit``, never splitting a span). A recompute window's blocks are new: the
  admission recomputes them privately, so they are in ``need`` and not among the hits.
* ``free`` are the free queue's unpublished blocks and ``evictable`` the published blocks,
  both with refcount 0 and in no live block table. It is an upper bound under every
  eviction policy: leaf-only eviction (radix trees) may reach fewer of them now, never
  more, and a block counted as evictable that is not (a lock the engine dropped) only
  makes the check weaker, never wrong.
* ``own hits`` are the request's hits among the evictable blocks: an admission pins its
  hits before it evicts anything (every design must, or it evicts what it is about to
  read), so they stop being supply. A hit on a block another sequence holds was never in it.

A cache may be stricter than these counts (a watermark, a conservative estimate); that is
not this check's business (the steps decide what a refusal with room means). So the check
never fails a correct cache, in the safety mode or in the exact one.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from prefixkv.spec import CacheState, Match, MultimodalSpan, Request, SeqId, contract

__all__ = ["Room", "admission_room", "append_room", "continue_room"]


@attrs.frozen
class Room:
    """What one room query promised, counted on the candidate's snapshot."""

    #: The fewest new blocks the operation takes.
    need: int
    #: Unpublished blocks in the free queue that no one holds.
    free: int
    #: Published blocks that no one holds (cached, refcount 0).
    evictable: int
    #: Of the evictable blocks, those the request hits (an admission pins them first).
    own_hits: int = 0

    @property
    def supply(self) -> int:
        """The most new blocks any cache could hand the operation."""
        return self.free + self.evictable - self.own_hits

    @property
    def short(self) -> bool:
        """The operation cannot get its blocks: a ``True`` answer is a broken promise."""
        return self.need > self.supply

    def broken(self, asked: str) -> str:
        """The failure message of a broken promise.

        Args:
            asked: the operation the room query answered for, as a call (``"admit(...)"``,
                ``"append(...)"``, ``"continue_prefill(...)"``).

        Returns:
            The counts on the first line only (one message shape, so one failure class per
            root cause, whatever the counts), and what was asked on the second.
        """
        operation = asked.split("(", 1)[0]
        pinned = f" - {self.own_hits} evictable blocks it hits and pins first" * (
            operation == "admit"
        )
        return (
            f"can_{operation} said True, but {operation} needs {self.need} new blocks and the "
            f"pool can supply at most {self.supply} ({self.free} free + {self.evictable} "
            f"evictable{pinned}): it must run out of blocks halfway\n  asked: {asked}"
        )


def _unheld(state: CacheState) -> tuple[int, int, frozenset[int]]:
    """(free, evictable, the evictable block ids) on ``state``: blocks with refcount 0 in no
    live block table, unpublished in the free queue or published."""
    held = {b for seq in state.sequences for b in seq.block_ids}
    queued = set(state.free_queue)
    free = 0
    evictable: set[int] = set()
    for blk in state.blocks:
        if blk.refcount or blk.block_id in held:
            continue
        if blk.published:
            evictable.add(blk.block_id)
        elif blk.block_id in queued:
            free += 1
    return free, len(evictable), frozenset(evictable)


def admission_room(state: CacheState, req: Request, budget: int | None, match: Match) -> Room:
    """The room ``admit(req, budget)`` takes, after ``match`` (the candidate's, on ``state``).

    Args:
        state: the candidate's snapshot when the room query answered.
        req: the request to admit.
        budget: the token budget (``None``: the whole prompt, up to ``kv_token_limit``).
        match: the candidate's match of ``req`` on ``state``: the hits it attaches.

    Returns:
        The counts; :attr:`Room.short` says whether the promise is broken.
    """
    cached = match.num_cached_tokens
    end = contract.chunk_end(cached, req.num_tokens, budget, req.kv_token_limit, req.spans)
    hits = tuple(match.block_ids)
    need = contract.blocks_for(max(end, cached), state.block_size) - len(hits)
    free, evictable, ids = _unheld(state)
    return Room(max(need, 0), free, evictable, len(set(hits) & ids))


def append_room(state: CacheState, seq_id: SeqId, num_tokens: int) -> Room | None:
    """The room ``append(seq_id, num_tokens)`` takes; ``None`` for a sequence the snapshot
    does not show live.

    Args:
        state: the candidate's snapshot when the room query answered.
        seq_id: the sequence to grow.
        num_tokens: the slots to add at its tail (decode tokens, drafts, a prompt chunk).

    Returns:
        The counts, or ``None``.
    """
    seq = next((s for s in state.sequences if s.seq_id == seq_id), None)
    if seq is None or type(num_tokens) is not int or num_tokens < 1:
        return None
    need = contract.blocks_for(seq.num_reserved + num_tokens, state.block_size)
    free, evictable, _ = _unheld(state)
    return Room(max(need - len(seq.block_ids), 0), free, evictable)


def continue_room(
    state: CacheState,
    seq_id: SeqId,
    budget: int | None,
    spans: Sequence[MultimodalSpan] = (),
) -> Room | None:
    """The room ``continue_prefill(seq_id, budget)`` takes: the next chunk of the prompt;
    ``None`` for a sequence the snapshot does not show live, or with no prompt left.

    Args:
        state: the candidate's snapshot when the room query answered.
        seq_id: the sequence whose prefill continues.
        budget: the token budget (``None``: the rest of the prompt, up to the limit).
        spans: the prompt's multimodal spans (a chunk never splits one).

    Returns:
        The counts, or ``None``.
    """
    seq = next((s for s in state.sequences if s.seq_id == seq_id), None)
    if seq is None or seq.num_reserved >= seq.num_prompt_tokens:
        return None
    end = contract.chunk_end(
        seq.num_reserved, seq.num_prompt_tokens, budget, seq.kv_token_limit, spans
    )
    need = contract.blocks_for(end, state.block_size) - len(seq.block_ids)
    free, evictable, _ = _unheld(state)
    return Room(max(need, 0), free, evictable)
