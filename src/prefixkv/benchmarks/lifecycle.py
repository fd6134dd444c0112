"""The engine life cycle that ``prefixkv bench`` times, in four call shapes.

Every request of a multi-turn chat trace goes through the calls a serving engine makes:

1. ``admit(Request(...))``: the ``Request`` is built *inside* the timed region, from the
   engine's own list of prompt token ids, because an engine builds one per request and its
   validation is part of what admission costs;
2. the prefill's ``commit`` (the first reply token is sampled at the end of the prefill);
3. per further reply token, a decode step: reserve a slot, then commit the token;
4. once finished, the request stays live among the ``live`` most recent finished ones and
   the oldest of them is freed.

When the pool runs dry (``OutOfBlocks``), the oldest live finished request is freed and the
failed call is retried, as an engine preempts; every call is a transaction, so a retry sees
the state from before the failure.

The call shapes issue exactly the same cache operations in the same order, so their
figures differ only by what each call costs:

* ``percall``: ``append(seq, 1)`` then ``commit(seq, 1, (tok,))``, two calls per token;
* ``fused``: one ``advance(seq, num_computed, accepted, num_reserve=...)`` per step;
* ``batched``: one ``advance_batch([DecodeStep(...)])`` per step;
* ``columns``: one ``advance_columns(seq_ids, num_computed, accepted, 0, num_reserve)`` per
  step, the batch as parallel columns (the engine's own lists, no record per sequence).

NOTE: by default one request runs at a time (the life cycle the figures of other engines
were measured on), so a batched step holds one sequence: that ``batched`` figure is the cost
of the batched call's shape, not the gain of batching. ``replay(..., running=k)`` runs a
continuous batch of ``k`` requests instead, whose steps hold up to ``k`` sequences.

The fused and batched calls are optional: :func:`variants_of` says which ones a manager has.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.spec import Namespace, OutOfBlocks, Request, SpecCache
from prefixkv.workloads import ChatConfig, chat_workload

__all__ = [
    "NAMESPACE",
    "VARIANTS",
    "LifecycleResult",
    "Trace",
    "TraceRequest",
    "make_cache",
    "replay",
    "trace_from_config",
    "variants_of",
]

NAMESPACE = Namespace("prefixkv-bench@1")

#: The call shapes, in report order.
VARIANTS = ("percall", "fused", "batched", "columns")


@attrs.frozen
class TraceRequest:
    """One request as the engine holds it before calling the cache (built before the timer)."""

    seq_id: int
    prompt: list[int]
    first: tuple[int]
    #: Each further reply token as the 1-tuple the commit call takes.
    rest: tuple[tuple[int], ...]


@attrs.frozen
class Trace:
    """A replayable trace and what it costs in blocks."""

    requests: tuple[TraceRequest, ...]
    blocks_touched: int
    block_size: int


@attrs.frozen
class LifecycleResult:
    """What one replay did (not how long it took: the caller times it)."""

    early_frees: int
    hit_rate: float
    evictions: int


def trace_from_config(config: ChatConfig, block_size: int = 16) -> Trace:
    """The chat workload of ``config`` in its shuffled schedule, ready to replay."""
    workload = chat_workload(config)
    requests = tuple(
        TraceRequest(
            seq_id=i,
            prompt=list(turn.prompt),
            first=(turn.reply[0],),
            rest=tuple((t,) for t in turn.reply[1:]),
        )
        for i, turn in enumerate(workload.schedule())
    )
    return Trace(requests, workload.blocks_touched(block_size), block_size)


def make_cache(manager: str, num_blocks: int, block_size: int, **kwargs: Any) -> Any:
    """A fresh ``"impl"`` (:class:`~prefixkv.impl.PrefixCacheManager`) or ``"spec"`` cache."""
    if manager == "spec":
        return SpecCache(num_blocks, block_size, **kwargs)
    if manager != "impl":
        raise InvalidConfig(f"unknown manager {manager!r}: expected 'impl' or 'spec'")
    from prefixkv.impl import PrefixCacheManager

    return PrefixCacheManager(num_blocks, block_size, **kwargs)


def variants_of(cache: object) -> tuple[str, ...]:
    """The call shapes ``cache`` offers (the fused and batched calls are optional)."""
    found = ["percall"]
    if callable(getattr(cache, "advance", None)):
        found.append("fused")
        if callable(getattr(cache, "advance_batch", None)) and _decode_step() is not None:
            found.append("batched")
        if callable(getattr(cache, "advance_columns", None)):
            found.append("columns")
    return tuple(found)


def _decode_step() -> Callable[..., Any] | None:
    try:
        from prefixkv.spec.steps import DecodeStep  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return DecodeStep  # type: ignore[no-any-return,unused-ignore]


def replay(
    cache: Any, trace: Trace, variant: str, live: int, *, running: int = 1
) -> LifecycleResult:
    """Run ``trace`` through ``cache`` with the ``variant`` call shape (see the module doc).

    ``running``: how many requests decode at once. 1 is the life cycle of the module doc;
    more runs a scheduler's continuous batch (:func:`_steps`).
    """
    if variant not in variants_of(cache):
        raise InvalidConfig(f"{type(cache).__name__} has no {variant!r} calls")
    require_int(running, "running", minimum=1)
    if running == 1:
        run = {"percall": _percall, "fused": _fused, "batched": _batched, "columns": _columns}[
            variant
        ]
        early = run(cache, trace.requests, live)
    else:
        early = _steps(cache, trace.requests, live, running, variant)
    stats = cache.stats()
    return LifecycleResult(early, stats.hit_rate, stats.evictions)


# NOTE: the three loops below are written out rather than shared through a callback, so
# that each one costs only its own calls: a shared driver would add the same indirection
# to every token and blur the difference being measured. They must stay in lockstep: the
# same operations in the same order (a test replays all three and compares the caches).


def _admit(cache: Any, req: TraceRequest, finished: deque[int]) -> tuple[int, int]:
    """Admit ``req`` (building its Request), freeing old finished requests while it does
    not fit; returns (tokens scheduled, early frees)."""
    early = 0
    while True:
        try:
            return cache.admit(
                Request(req.seq_id, req.prompt, NAMESPACE)
            ).num_scheduled_tokens, early
        except OutOfBlocks as exc:
            _make_room(cache, finished, exc)
            early += 1


def _make_room(cache: Any, finished: deque[int], exc: OutOfBlocks) -> None:
    if not finished:
        raise exc
    cache.free((finished.popleft(),))


def _percall(cache: Any, requests: tuple[TraceRequest, ...], live: int) -> int:
    append, commit, free = cache.append, cache.commit, cache.free
    finished: deque[int] = deque()
    early = 0
    for req in requests:
        sid = req.seq_id
        scheduled, e = _admit(cache, req, finished)
        early += e
        commit(sid, scheduled, req.first)
        for tok in req.rest:
            while True:
                try:
                    append(sid, 1)
                    break
                except OutOfBlocks as exc:
                    _make_room(cache, finished, exc)
                    early += 1
            commit(sid, 1, tok)
        finished.append(sid)
        if len(finished) > live:
            free((finished.popleft(),))
    return early


def _fused(cache: Any, requests: tuple[TraceRequest, ...], live: int) -> int:
    advance, free = cache.advance, cache.free
    finished: deque[int] = deque()
    early = 0
    for req in requests:
        sid = req.seq_id
        scheduled, e = _admit(cache, req, finished)
        early += e
        # Step k commits what the last forward computed and reserves the slot of the token
        # just sampled; the last step reserves nothing.
        computed, accepted = scheduled, req.first
        for tok in req.rest:
            while True:
                try:
                    advance(sid, computed, accepted, num_reserve=1)
                    break
                except OutOfBlocks as exc:
                    _make_room(cache, finished, exc)
                    early += 1
            computed, accepted = 1, tok
        advance(sid, computed, accepted, num_reserve=0)
        finished.append(sid)
        if len(finished) > live:
            free((finished.popleft(),))
    return early


def _batched(cache: Any, requests: tuple[TraceRequest, ...], live: int) -> int:
    step_type = _decode_step()
    assert step_type is not None
    advance_batch, free = cache.advance_batch, cache.free
    finished: deque[int] = deque()
    early = 0
    for req in requests:
        sid = req.seq_id
        scheduled, e = _admit(cache, req, finished)
        early += e
        computed, accepted = scheduled, req.first
        for tok in req.rest:
            # The engine builds its step records every step: that is part of the cost.
            while True:
                out = advance_batch((step_type(sid, computed, accepted, num_reserve=1),))
                if out.error is None:
                    break
                if not isinstance(out.error, OutOfBlocks):
                    raise out.error
                _make_room(cache, finished, out.error)
                early += 1
            computed, accepted = 1, tok
        advance_batch((step_type(sid, computed, accepted, num_reserve=0),)).raise_for_error()
        finished.append(sid)
        if len(finished) > live:
            free((finished.popleft(),))
    return early


def _columns(cache: Any, requests: tuple[TraceRequest, ...], live: int) -> int:
    advance_columns, free = cache.advance_columns, cache.free
    finished: deque[int] = deque()
    early = 0
    for req in requests:
        sid = req.seq_id
        scheduled, e = _admit(cache, req, finished)
        early += e
        computed, accepted = scheduled, req.first
        for tok in req.rest:
            # The engine's scheduler holds its running batch as columns: here, one each.
            while True:
                out = advance_columns((sid,), (computed,), (accepted,), 0, 1)
                if out.error is None:
                    break
                if not isinstance(out.error, OutOfBlocks):
                    raise out.error
                _make_room(cache, finished, out.error)
                early += 1
            computed, accepted = 1, tok
        advance_columns((sid,), (computed,), (accepted,), 0, 0).raise_for_error()
        finished.append(sid)
        if len(finished) > live:
            free((finished.popleft(),))
    return early


def _steps(
    cache: Any, requests: tuple[TraceRequest, ...], live: int, running: int, variant: str
) -> int:
    """A continuous batch: up to ``running`` requests decode together, one token per step.

    Each step admits requests (in trace order) into free places, then advances every
    running sequence by one token, in admission order: per sequence, ``commit`` then
    ``append`` (per call), one ``advance`` (fused), or one ``advance_batch`` for the whole
    step (batched), or one ``advance_columns`` for the whole step (columns). A sequence whose
    reply is complete leaves after its last commit.
    """
    step_type = _decode_step() if variant == "batched" else None
    commit, append, free = cache.commit, cache.append, cache.free
    advance: Any = getattr(cache, "advance", None)
    advance_batch: Any = getattr(cache, "advance_batch", None)
    advance_columns: Any = getattr(cache, "advance_columns", None)
    finished: deque[int] = deque()
    early = 0
    pending = iter(requests)
    exhausted = False
    # Per running sequence: [seq id, tokens computed by the last forward, tokens accepted,
    # index of the next reply token, the reply's further tokens].
    active: list[list[Any]] = []
    while True:
        while not exhausted and len(active) < running:
            req = next(pending, None)
            if req is None:
                exhausted = True
                break
            scheduled, e = _admit(cache, req, finished)
            early += e
            active.append([req.seq_id, scheduled, req.first, 0, req.rest])
        if not active:
            return early
        reserves = [1 if a[3] < len(a[4]) else 0 for a in active]
        if variant == "batched":
            assert step_type is not None and advance_batch is not None
            steps = [
                step_type(a[0], a[1], a[2], num_reserve=r)
                for a, r in zip(active, reserves, strict=True)
            ]
            while steps:
                out = advance_batch(steps)
                if out.error is None:
                    break
                if not isinstance(out.error, OutOfBlocks):
                    raise out.error
                _make_room(cache, finished, out.error)
                early += 1
                steps = steps[out.num_applied :]
        elif variant == "columns":
            assert advance_columns is not None
            # The scheduler's columns: ids, counts computed, tokens accepted, reservations.
            cols = [[a[0] for a in active], [a[1] for a in active], [a[2] for a in active]]
            left = reserves
            while cols[0]:
                out = advance_columns(*cols, 0, left)
                if out.error is None:
                    break
                if not isinstance(out.error, OutOfBlocks):
                    raise out.error
                _make_room(cache, finished, out.error)
                early += 1
                done = out.num_applied
                cols = [c[done:] for c in cols]
                left = left[done:]
        else:
            for a, r in zip(active, reserves, strict=True):
                sid = a[0]
                if variant == "fused":
                    while True:
                        try:
                            advance(sid, a[1], a[2], num_reserve=r)
                            break
                        except OutOfBlocks as exc:
                            _make_room(cache, finished, exc)
                            early += 1
                    continue
                commit(sid, a[1], a[2])
                while r:
                    try:
                        append(sid, 1)
                        break
                    except OutOfBlocks as exc:
                        _make_room(cache, finished, exc)
                        early += 1
        still: list[list[Any]] = []
        for a, r in zip(active, reserves, strict=True):
            if r:
                a[1], a[2] = 1, a[4][a[3]]
                a[3] += 1
                still.append(a)
            else:
                finished.append(a[0])
                if len(finished) > live:
                    free((finished.popleft(),))
        active = still
