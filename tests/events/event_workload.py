"""A random run of a cache, drained after every step: the event streams the event tests read.

Each step admits a prompt (and commits its forward), frees a sequence, evicts a few blocks,
or, now and then, frees everything and resets the cache; the events it produced are drained
as one batch. The tests differ only in the prompts they draw (:class:`Prompts`) and what a
forward accepts, so the run itself is written once, here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from prefixkv.spec import KVEvent, MultimodalSpan, Namespace, OutOfBlocks, Request

__all__ = ["Prompts", "event_batches"]


@attrs.frozen
class Prompts:
    """How a step draws its prompt.

    Attributes:
        namespaces: drawn from uniformly.
        tokens: the token ids drawn from.
        lengths: ``(low, high)``, the prompt length as ``rng.randrange(low, high)``.
        spans: the multimodal spans of a drawn prompt (None: none).
    """

    namespaces: Sequence[Namespace]
    tokens: Sequence[int]
    lengths: tuple[int, int]
    spans: Callable[[random.Random, list[int]], tuple[MultimodalSpan, ...]] | None = None


def event_batches(
    cache: Any,
    rng: random.Random,
    steps: int,
    prompts: Prompts,
    *,
    accepted: Sequence[int] = (1,),
    evict_below: float = 0.97,
) -> list[list[KVEvent]]:
    """Run ``steps`` random steps on ``cache``; one drained event batch per step.

    A roll below 0.6 admits a prompt, below 0.9 frees a live sequence, below
    ``evict_below`` evicts 1 to 3 blocks; above it the cache is emptied and reset.
    """
    batches: list[list[KVEvent]] = []
    live: list[str] = []
    for step in range(steps):
        roll = rng.random()
        if roll < 0.6:
            sid = f"s{step}"
            ns = rng.choice(prompts.namespaces)
            tokens = [rng.choice(prompts.tokens) for _ in range(rng.randrange(*prompts.lengths))]
            spans = prompts.spans(rng, tokens) if prompts.spans is not None else ()
            try:
                adm = cache.admit(Request(sid, tokens, ns, spans=spans), len(tokens))
            except OutOfBlocks:
                pass
            else:
                cache.commit(sid, adm.num_scheduled_tokens, accepted)
                live.append(sid)
        elif roll < 0.9 and live:
            cache.free([live.pop(rng.randrange(len(live)))])
        elif roll < evict_below:
            cache.evict(rng.randrange(1, 4))
        else:
            cache.free(live)
            live = []
            cache.reset(preserve_cache=False)
        batches.append(cache.take_events())
    return batches
