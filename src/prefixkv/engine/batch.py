"""Step metadata -> tensors: the one place where a :class:`StepPlan` becomes model input.

::

    plan.seqs     [ seq a: positions 8..12 ][ seq b: position 30 + 2 drafts ][ seq c ... ]
    input rows    0 ................... 4    5 ......................... 7    8 ...
    sample rows   4 (if a's last chunk)      5, 6, 7 (targets for the pending token, d1, d2)

Multimodal items overlapping a sequence's new positions become ``(row, length, item,
offset)`` overrides: rows whose input embedding is the encoder's output for the item
instead of the placeholder token's embedding.
"""

from __future__ import annotations

import attrs
import torch

from prefixkv.kernels.metadata import BatchMetadata, build_batch_metadata

from .generation import MultimodalItem
from .step import StepPlan

__all__ = ["MultimodalOverride", "StepBatch", "build_step_batch"]


@attrs.frozen
class MultimodalOverride:
    row: int
    length: int
    item: MultimodalItem
    offset: int  # first position of the item covered, relative to the item's start


@attrs.frozen
class StepBatch:
    input_ids: torch.Tensor  # int64 [tokens]
    positions: torch.Tensor  # int64 [tokens]
    meta: BatchMetadata
    host_lens: tuple[tuple[int, int], ...]  # (cached, new) per sequence, host ints
    sample_rows: torch.Tensor  # int64 [samples]
    samples_per_seq: tuple[int, ...]
    overrides: tuple[MultimodalOverride, ...]


def build_step_batch(plan: StepPlan, block_size: int, device: torch.device) -> StepBatch:
    ids: list[int] = []
    positions: list[int] = []
    rows: list[int] = []
    per_seq: list[int] = []
    overrides: list[MultimodalOverride] = []
    for s in plan.seqs:
        base = len(ids)
        ids.extend(s.token_ids)
        positions.extend(range(s.start, s.end))
        n = s.num_samples
        per_seq.append(n)
        rows.extend(range(base + s.num_tokens - n, base + s.num_tokens))
        for item in s.multimodal:
            lo, hi = max(item.span.start, s.start), min(item.span.end, s.end)
            overrides.append(
                MultimodalOverride(base + lo - s.start, hi - lo, item, lo - item.span.start)
            )
    meta = build_batch_metadata(
        [s.start for s in plan.seqs],
        [s.num_tokens for s in plan.seqs],
        [s.block_ids for s in plan.seqs],
        block_size,
        device=device,
    )
    return StepBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta,
        host_lens=tuple((s.start, s.num_tokens) for s in plan.seqs),
        sample_rows=torch.tensor(rows, dtype=torch.int64, device=device),
        samples_per_seq=tuple(per_seq),
        overrides=tuple(overrides),
    )
