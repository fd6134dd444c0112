"""Checkpoint events: a hybrid cache says which published blocks carry a restorable checkpoint.

``CheckpointStored`` when a checkpoint becomes Ready on a block, ``CheckpointRemoved`` when it
is released with the block still published (slot pressure) or with its evicted block (after
the ``BlockRemoved``). Both hybrid managers emit the same stream; the mirror counts
checkpoints per hash, and INV-EVENTS compares them with the published blocks' checkpoints.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.impl import CheckpointStore, HybridPrefixCacheManager
from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    EventMirror,
    EventStreamError,
    HybridSpecCache,
    InvariantViolation,
    Namespace,
    Request,
)
from prefixkv.spec.event_mirror import published_checkpoints
from prefixkv.spec.invariants import check_events

NS = Namespace("hybrid-llm@1")
CLASSES = (HybridSpecCache, HybridPrefixCacheManager)


class Watched:
    """A hybrid cache whose drained events feed a mirror, with INV-EVENTS after each call."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.mirror = EventMirror()
        self.log: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.cache, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            events = self.cache.take_events()
            self.log.extend(events)
            self.mirror.apply_all(events)
            check_events(self.mirror, self.cache)
            return out

        return call


def make(cls: type[Any], **kwargs: Any) -> Watched:
    args: dict[str, Any] = {"max_num_seqs": 2, "state_budget": 2, "record_events": True}
    args.update(kwargs)
    return Watched(cls(16, 4, **args))


def serve(c: Watched, seq_id: str, prompt: list[int]) -> None:
    """Prefill the whole prompt and sample one token: a checkpoint at the last full block."""
    adm = c.admit(Request(seq_id, prompt, NS))
    c.commit(seq_id, adm.num_scheduled_tokens, [1])


@pytest.mark.parametrize("cls", CLASSES)
def test_a_ready_checkpoint_is_announced_after_its_block(cls: type[Any]) -> None:
    c = make(cls)
    serve(c, "a", list(range(9)))
    stored = [e for e in c.log if isinstance(e, BlockStored)]
    assert len(stored) == 2 and c.log[-1] == CheckpointStored((stored[-1].block_hashes[-1],))
    assert c.log.index(c.log[-1]) > c.log.index(stored[-1])
    h1 = stored[-1].block_hashes[-1]
    assert c.mirror.has_checkpoint(h1)
    assert not c.mirror.has_checkpoint(stored[0].block_hashes[0])
    assert published_checkpoints(c.cache.snapshot()) == {h1: 1}


@pytest.mark.parametrize("cls", CLASSES)
def test_an_evicted_block_takes_its_checkpoint_with_a_removal(cls: type[Any]) -> None:
    c = make(cls)
    serve(c, "a", list(range(9)))
    c.log.clear()
    c.free(["a"])
    assert c.evict(16) == 2
    removed = [e for e in c.log if isinstance(e, BlockRemoved)]
    (ck,) = [e for e in c.log if isinstance(e, CheckpointRemoved)]
    # The stale checkpoint's removal follows its block's.
    assert c.log.index(ck) == c.log.index(BlockRemoved(ck.block_hashes)) + 1
    assert len(removed) == 2 and not c.mirror.checkpoints and len(c.mirror) == 0


@pytest.mark.parametrize("cls", CLASSES)
def test_slot_pressure_removes_the_checkpoint_and_keeps_the_block(cls: type[Any]) -> None:
    c = make(cls, state_budget=0)  # two slots: runtime slots lent to checkpoints
    serve(c, "a", list(range(9)))
    (h1,) = c.log[-1].block_hashes
    c.free(["a"])
    c.log.clear()
    # b's runtime slot is free; its reservation needs the slot of a's checkpoint.
    c.admit(Request("b", list(range(100, 109)), NS))
    assert CheckpointRemoved((h1,)) in c.log
    assert not any(isinstance(e, BlockRemoved) for e in c.log)
    assert h1 in c.mirror and not c.mirror.has_checkpoint(h1)


@pytest.mark.parametrize("cls", CLASSES)
def test_a_full_reset_clears_checkpoints_too(cls: type[Any]) -> None:
    c = make(cls)
    serve(c, "a", list(range(9)))
    c.free(["a"])
    c.log.clear()
    c.reset(preserve_cache=False)
    assert c.log == [AllBlocksCleared()]
    assert not c.mirror.checkpoints


def test_both_managers_emit_the_same_stream() -> None:
    logs = []
    for cls in CLASSES:
        c = make(cls, state_budget=1)
        for i, prompt in enumerate(([*range(9)], [*range(13)], [*range(50, 59)], [*range(9)])):
            serve(c, f"s{i}", prompt)
            c.free([f"s{i}"])
        c.evict(3)
        logs.append(c.log)
    assert logs[0] == logs[1]
    assert any(isinstance(e, CheckpointRemoved) for e in logs[0])


# -- the mirror is strict, and INV-EVENTS sees a missing checkpoint event --------------------


def test_the_mirror_refuses_checkpoint_events_that_describe_no_cache() -> None:
    m = EventMirror()
    m.apply(BlockStored((5,), None, (1, 2, 3, 4), 4, "m", None, None, ((),)))
    with pytest.raises(EventStreamError):
        m.apply(CheckpointStored((6,)))  # no such block
    m.apply(CheckpointStored((5,)))
    with pytest.raises(EventStreamError):
        m.apply(CheckpointStored((5,)))  # one checkpoint per block
    with pytest.raises(EventStreamError):
        m.apply_all([CheckpointRemoved((5,)), CheckpointRemoved((5,))])
    assert m.checkpoints == {5: 1}  # all or nothing
    m.apply(CheckpointRemoved((5,)))
    assert not m.checkpoints and 5 in m
    assert CheckpointStored((5,)) != BlockRemoved((5,))  # not a one-field tuple


class _SilentStaleStore(CheckpointStore):
    def on_evict(self, block: int, events: list[Any] | None) -> None:
        n = 0 if events is None else len(events)
        super().on_evict(block, events)
        if events is not None:
            del events[n:]


class _NoStaleRemoval(HybridPrefixCacheManager):
    """A seeded bug: a checkpoint that goes stale with its block leaves unannounced."""

    store_type = _SilentStaleStore


class _NoReadyEvent(HybridPrefixCacheManager):
    """A seeded bug: a checkpoint becomes Ready silently."""

    def take_events(self) -> list[Any]:
        return [e for e in super().take_events() if not isinstance(e, CheckpointStored)]


@pytest.mark.parametrize("cls", [_NoStaleRemoval, _NoReadyEvent])
def test_inv_events_catches_a_missing_checkpoint_event(cls: type[Any]) -> None:
    c = make(cls)
    with pytest.raises(InvariantViolation, match="INV-EVENTS") as info:
        serve(c, "a", list(range(9)))
        c.free(["a"])
        c.evict(16)
    assert "checkpoint" in str(info.value)


# -- on the wire, and at Dynamo's router -----------------------------------------------------


def _hybrid_stream() -> list[Any]:
    c = make(HybridPrefixCacheManager)
    serve(c, "a", list(range(9)))
    c.free(["a"])
    c.evict(16)
    return c.log


@pytest.mark.parametrize("fmt", ["vllm-0.33", "vllm-0.20"])
def test_checkpoint_events_travel_only_on_request(fmt: str) -> None:
    wire = pytest.importorskip("prefixkv.events.wire")
    events = _hybrid_stream()
    kinds = (CheckpointStored, CheckpointRemoved)
    assert any(isinstance(e, kinds) for e in events)
    both = wire.encode_batch(events, checkpoints=True, wire_format=fmt)
    assert wire.decode_batch(both, wire_format=fmt) == events
    # What vLLM's decoder accepts (tests/events/test_vllm_corpus.py):
    plain = wire.decode_batch(wire.encode_batch(events, wire_format=fmt), wire_format=fmt)
    assert plain == [e for e in events if not isinstance(e, kinds)]


def test_dynamo_skips_checkpoint_events() -> None:
    pytest.importorskip("dynamo.llm")
    from prefixkv.events.dynamo import DynamoIndex

    events = _hybrid_stream()
    index = DynamoIndex()
    index.apply(0, events)
    assert index.skipped == 2 and index.rejected == 0
    assert index.applied == len(events) - 2
