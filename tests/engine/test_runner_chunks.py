"""The model runner computes every chunking of a prompt alike, one that splits an image too.

The reference scheduler never starts a step inside a multimodal span (choice 8 moves chunk
boundaries off spans, choice 5 clamps matches to a span's start), so the engine tests never
see a step whose first position is inside an item. The runner is the part another scheduler
drives, and its contract does not depend on that policy: a step that starts at position
``p`` inside an item reads the item's encoder rows from ``p - span.start`` on. Without this
test, reading them from row 0 again would go unnoticed.
"""

from __future__ import annotations

import itertools

import torch

from prefixkv.engine import Engine, EngineConfig, image_item
from prefixkv.engine.step import Kind, ScheduledSeq, StepPlan


def _logits(
    engine: Engine, bounds: list[int], prompt: tuple[int, ...], item: object
) -> torch.Tensor:
    """Prefill ``prompt`` in chunks ``bounds[i]:bounds[i+1]``; the last chunk's logits."""
    block = engine.pool.block_size
    blocks = tuple(range(-(-len(prompt) // block)))
    out = None
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        seq = ScheduledSeq(
            "s",
            Kind.PREFILL,
            start,
            prompt[start:end],
            blocks[: -(-end // block)],
            sample=end == len(prompt),
            multimodal=(item,),  # type: ignore[arg-type]
        )
        out = engine.runner.forward(StepPlan(i, (seq,), num_prefill_tokens=end - start))
    assert out is not None
    return out.logits[0]


def test_a_chunk_starting_inside_an_image_reads_the_rest_of_it() -> None:
    item = image_item(4, 12, b"a picture")  # positions 4 .. 15
    prompt = tuple(range(1, 21))
    whole = _logits(Engine(EngineConfig(backend="torch")), [0, 20], prompt, item)
    # the second chunk starts 6 positions into the image, the third 10 positions in
    split = _logits(Engine(EngineConfig(backend="torch")), [0, 10, 14, 20], prompt, item)
    torch.testing.assert_close(split, whole, atol=1e-4, rtol=1e-4)
    # and the image matters: another picture changes the logits
    other = image_item(4, 12, b"another picture")
    assert not torch.allclose(
        _logits(Engine(EngineConfig(backend="torch")), [0, 20], prompt, other), whole, atol=1e-3
    )
