"""A torch-free stand-in for the model, for scheduler tests.

The "KV" of a position is its token id, stored at the position's slot. The next token is
a hash of the context *read back through the block table*, so a wrong block table, a block
served from the wrong prefix, or KV never written all change the generated tokens, exactly
as they would with a real model. :func:`oracle` generates the same tokens directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.engine.generation import GenerationRequest
from prefixkv.engine.step import Kind, StepOutput, StepPlan

VOCAB = 61
UNWRITTEN = -1


def next_token(context: Sequence[int]) -> int:
    h = len(context)
    for t in context[-6:]:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return h % VOCAB


def oracle(request: GenerationRequest) -> list[int]:
    tokens = list(request.prompt)
    out = []
    for _ in range(request.max_new_tokens):
        t = next_token(tokens)
        out.append(t)
        tokens.append(t)
    return out


class FakeRunner:
    """Writes each fed token at its slot; samples from the context read back by slot."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.kv: dict[int, int] = {}
        self.tokens_computed = 0

    def slot(self, block_ids: Sequence[int], pos: int) -> int:
        return block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def context(self, block_ids: Sequence[int], end: int) -> list[int]:
        return [self.kv.get(self.slot(block_ids, p), UNWRITTEN) for p in range(end)]

    def forward(self, plan: StepPlan) -> StepOutput:
        sampled: list[tuple[int, ...]] = []
        for s in plan.seqs:
            for i, t in enumerate(s.token_ids):
                self.kv[self.slot(s.block_ids, s.start + i)] = t
            self.tokens_computed += s.num_tokens
            if not s.sample:
                sampled.append(())
            elif s.kind is Kind.PREFILL:
                sampled.append((next_token(self.context(s.block_ids, s.end)),))
            else:
                sampled.append(
                    tuple(
                        next_token(self.context(s.block_ids, s.start + i + 1))
                        for i in range(s.num_tokens)
                    )
                )
        return StepOutput(tuple(sampled))
