"""The planned step: which sequences run, over which positions, with which blocks.

A :class:`StepPlan` is everything a model runner needs and nothing it has to ask the cache
for: per sequence, the first position computed this step, the tokens fed, the whole block
table after this step's reservations, and whether (and where) logits are sampled.

::

    positions      0 ........ start-1 | start ........ start+len(token_ids)-1
    KV             already computed   | written by this step's forward
    block_ids      covers every position up to start+len(token_ids)-1

A prefill chunk samples only at its last position, and only when it is the prompt's last
chunk. A decode entry feeds the pending token plus ``draft_tokens`` and samples at every
position: position ``start + i`` yields the target for draft ``i`` (greedy verification).
"""

from __future__ import annotations

import enum

import attrs

from prefixkv.spec.request import SeqId

from .generation import MultimodalItem

__all__ = ["Kind", "ScheduledSeq", "StepOutput", "StepPlan"]


class Kind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@attrs.frozen
class ScheduledSeq:
    seq_id: SeqId
    kind: Kind
    start: int
    token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    sample: bool
    draft_tokens: tuple[int, ...] = ()
    multimodal: tuple[MultimodalItem, ...] = ()
    """Items overlapping ``[start, end)``, with absolute positions."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def num_samples(self) -> int:
        """Logit rows sampled for this sequence (``0``, ``1`` or ``1 + drafts``)."""
        if not self.sample:
            return 0
        return 1 + len(self.draft_tokens) if self.kind is Kind.DECODE else 1


@attrs.frozen
class StepPlan:
    step: int
    seqs: tuple[ScheduledSeq, ...]
    preempted: tuple[SeqId, ...] = ()
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0

    @property
    def is_idle(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


@attrs.frozen
class StepOutput:
    """What the forward returns: per scheduled sequence (in plan order), the greedy token at
    each sampled position (``num_samples`` of them)."""

    sampled: tuple[tuple[int, ...], ...]
