"""A multi-token-prediction (MTP) block manager: the minimal engine of
:mod:`examples.minimal_engine` with draft slots and no rollback.

A decode step reserves the slot of the last sampled token plus one per draft token
(``may_append(seq, n)``, after ``can_append(seq, n)``). The forward pass writes them all;
the accepted drafts and a bonus token become known, and the rejected drafts' slots stay
reserved: the next step writes over them, so it asks only for the slots it lacks. A block is
published once the KV of all its tokens is written and every token of it is accepted. Blocks
hold 16 tokens by default.

:data:`BUGS` holds the same engine with one bug each, of the kinds MTP engines have shipped.
"""

from __future__ import annotations

from .minimal_engine import MinimalEngine, NoFreeBlocks, Sequence

__all__ = ["BUGS", "MTPEngine"]


class MTPEngine(MinimalEngine):
    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_blocks, block_size)

    def blocks_to_reserve(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``num_tokens`` more slots need beyond the table's."""
        return self.num_blocks_for(seq.num_slots + num_tokens) - len(seq.block_table)

    def can_append(self, seq: Sequence, num_tokens: int = 1) -> bool:
        return self.blocks_to_reserve(seq, num_tokens) <= len(self.free_block_ids)

    def may_append(self, seq: Sequence, num_tokens: int = 1) -> None:
        """Reserve ``num_tokens`` more slots: the sampled token's and the drafts'."""
        need = self.blocks_to_reserve(seq, num_tokens)
        if need > len(self.free_block_ids):
            raise NoFreeBlocks(seq.seq_id)
        seq.block_table += [self._take() for _ in range(need)]
        seq.num_slots += num_tokens


# -- seeded bugs -----------------------------------------------------------------------------


class FloorAtBoundary(MTPEngine):
    """Bug: the reservation rounds the slots down to whole blocks, so drafts that cross a
    block boundary get no block for the tokens past it."""

    def blocks_to_reserve(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, (seq.num_slots + num_tokens) // self.block_size - len(seq.block_table))


class RoomForOneBlock(MTPEngine):
    """Bug: the room check asks for one free block whenever a block is needed, however many
    blocks the drafts span."""

    def can_append(self, seq: Sequence, num_tokens: int = 1) -> bool:
        need = self.blocks_to_reserve(seq, num_tokens)
        return need == 0 or len(self.free_block_ids) >= 1


class PublishesUnwrittenTokens(MTPEngine):
    """Bug: blocks are published as soon as their tokens are known: the bonus token just
    sampled is known, but its KV is written by the next step."""

    def postprocess(self, seq: Sequence, num_computed: int, new_token_ids: list[int]) -> None:
        super().postprocess(seq, num_computed, new_token_ids)
        for j in range(min(len(seq.token_ids), seq.num_slots) // self.block_size):
            self.publish(seq, j)


#: name -> the engine with that bug.
BUGS: dict[str, type[MTPEngine]] = {
    "floor_at_boundary": FloorAtBoundary,
    "room_for_one_block": RoomForOneBlock,
    "publishes_unwritten_tokens": PublishesUnwrittenTokens,
}
