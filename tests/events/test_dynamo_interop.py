"""Interop with a real KV-aware router: NVIDIA Dynamo's ``RadixTree`` (ai-dynamo-runtime).

Several managers run a random workload. Their events are translated and applied to one
router index, and on random probes the router's overlap for every worker must equal the
prefix that worker serves (the published identity chain, before the match policy's caps).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("dynamo.llm")

from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    EventMirror,
    KVEvent,
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    Request,
    SpecCache,
)
from prefixkv.spec.event_mirror import served_prefix_blocks
from prefixkv.spec.identity import event_hash

from prefixkv.events.dynamo import DynamoIndex

BS = 4
MODEL = "tiny-llm@1"
#: Each mode's namespaces. Requests draw a tenant and a prompt from shared prefixes, so
#: equal tokens recur across tenants: exactly where a router that ignores identity merges.
MODES: dict[str, tuple[Namespace, ...]] = {
    "one-namespace": (Namespace(MODEL),),
    "salts": tuple(Namespace(MODEL, salt=f"tenant-{i}".encode()) for i in range(3)),
    "adapters": tuple(Namespace(MODEL, adapter=f"lora-{i}") for i in range(3)),
    "multimodal": (Namespace(MODEL), Namespace(MODEL, salt=b"tenant-1")),
}
PREFIXES = [tuple(range(100 + 10 * k, 100 + 10 * k + 8)) for k in range(3)]
IMAGE = tuple([7] * 8)  # placeholder tokens: equal for every image


def _prompt(rng: random.Random, mode: str) -> tuple[Namespace, tuple[int, ...], tuple[Any, ...]]:
    ns = rng.choice(MODES[mode])
    tokens = list(rng.choice(PREFIXES))
    spans: list[MultimodalSpan] = []
    if mode == "multimodal" and rng.random() < 0.7:
        start = len(tokens) + rng.choice((0, 2))
        tokens += [1] * (start - len(tokens)) + list(IMAGE)
        content = bytes([rng.randrange(3)]) * 8  # three distinct images
        spans.append(MultimodalSpan(start, start + len(IMAGE), "image", content))
    tokens += [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
    return ns, tuple(tokens), tuple(spans)


def run_cluster(
    make: Callable[[], Any],
    mode: str,
    seed: int,
    *,
    workers: int = 3,
    steps: int = 300,
    drop: Callable[[KVEvent], bool] = lambda e: False,
    identity: bool = True,
) -> tuple[int, int, DynamoIndex]:
    """Run the workload; return (probes, mispredictions, index)."""
    rng = random.Random(seed)
    caches = [make() for _ in range(workers)]
    index = DynamoIndex(identity=identity)
    # prefixkv's own router index, fed the same events: it must agree with Dynamo's.
    mirrors = [EventMirror() for _ in range(workers)]
    live: list[list[str]] = [[] for _ in range(workers)]
    probes = wrong = 0
    for step in range(steps):
        w = rng.randrange(workers)
        c = caches[w]
        roll = rng.random()
        if roll < 0.55:
            ns, tokens, spans = _prompt(rng, mode)
            seq = f"s{step}"
            req = Request(seq, tokens, ns, spans=spans)
            try:
                adm = c.admit(req, len(tokens))
            except OutOfBlocks:
                pass
            else:
                c.commit(seq, adm.num_scheduled_tokens, ())
                assert adm.num_cached_tokens % BS == 0
                live[w].append(seq)
        elif roll < 0.85 and live[w]:
            victims = rng.sample(live[w], rng.randrange(1, len(live[w]) + 1))
            c.free(victims)
            live[w] = [s for s in live[w] if s not in victims]
        elif roll < 0.95:
            c.evict(rng.randrange(1, 6))
        else:
            c.free(live[w])
            live[w] = []
            c.reset(preserve_cache=False)
        events = [e for e in c.take_events() if not drop(e)]
        index.apply(w, events)
        if drop(AllBlocksCleared()) or drop(BlockRemoved((0,))):
            pass  # a lossy stream: the strict mirror would refuse it, Dynamo's router does not
        else:
            mirrors[w].apply_all(events)
        for _ in range(2):
            ns, tokens, spans = _prompt(rng, mode)
            predicted = index.overlaps(ns, tokens, BS, spans)
            for v, cache in enumerate(caches):
                probes += 1
                served = served_prefix_blocks(cache.snapshot(), ns, tokens, spans)
                wrong += predicted.get(v, 0) != served
                if identity and not drop(AllBlocksCleared()) and not drop(BlockRemoved((0,))):
                    assert mirrors[v].overlap(event_hash, ns, tokens, spans) == served
    return probes, wrong, index


MANAGERS: dict[str, Callable[[], Any]] = {
    "spec": lambda: SpecCache(24, BS, record_events=True),
    "impl": lambda: PrefixCacheManager(24, BS, record_events=True),
}


@pytest.mark.parametrize("manager", sorted(MANAGERS))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_router_overlap_equals_the_served_prefix(manager: str, mode: str) -> None:
    probes, wrong, index = run_cluster(MANAGERS[manager], mode, seed=len(mode))
    assert index.applied > 100 and probes > 1000
    assert (wrong, index.rejected) == (0, 0)


@pytest.mark.parametrize(
    "dropped", [BlockRemoved, AllBlocksCleared], ids=["removed-dropped", "cleared-dropped"]
)
def test_the_check_fails_when_events_are_dropped(dropped: type) -> None:
    """The same run with removals (or clears) lost on the way: the router must drift."""
    _, wrong, index = run_cluster(
        MANAGERS["impl"], "salts", seed=3, drop=lambda e: isinstance(e, dropped)
    )
    assert wrong > 0 or index.rejected > 0


def test_events_without_identity_merge_tenants() -> None:
    """Tokens and adapter alone (the old BlockStored): salted tenants collapse in the router."""
    _, wrong, index = run_cluster(MANAGERS["impl"], "salts", seed=3, identity=False)
    assert wrong > 0 and index.rejected > 0
