"""The auditor's checks: vLLM's own streams are clean, and each seeded event bug is named.

The clean side: the corpora vLLM's own publisher produced (``tests/events/data``), PUB and
replay frames, in both event shapes; and prefixkv's streams of random workloads, with the
pool size declared. The dirty side: the same prefixkv streams with one event bug each,
seeded the way engines shipped them (``event_bugs.py``), or by hand (a child sent before
its parent, a batch lost with no replay): each must be reported by the check that names it,
and by no other.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("msgspec")

from event_bugs import BuggyEvents
from event_workload import Prompts, event_batches
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    KVEvent,
    Namespace,
)

from prefixkv.events.audit import (
    AuditError,
    StreamAudit,
    audit_batches,
    decode_engine_batch,
)
from prefixkv.events.wire import WireFormat, encode_batch

DATA = Path(__file__).parent / "data"
CORPORA = ("vllm-0.33.0.json", "vllm-0.20.0.json")
NAMESPACES = (Namespace("m@1"), Namespace("m@1", salt=b"t1"), Namespace("m@1", adapter="a"))
NUM_BLOCKS = 16


def frames(corpus: dict[str, Any], key: str) -> list[list[bytes]]:
    if key == "replay":
        return [[bytes.fromhex(f) for f in r] for r in corpus["replay"]]
    return [[bytes.fromhex(f) for f in step["frames"]] for step in corpus["steps"]]


@pytest.mark.parametrize("name", CORPORA)
def test_vllm_own_streams_are_clean(name: str) -> None:
    corpus = json.loads((DATA / name).read_text())
    pub = StreamAudit(topic=corpus["topic"].encode())
    for message in frames(corpus, "steps"):
        assert pub.on_pub(message) is None
    replay = StreamAudit()
    for message in frames(corpus, "replay"):
        replay.on_replayed(message)
    for audit in (pub, replay):
        report = audit.report()
        assert report["ok"], report["violations"]
        assert report["batches"] == len(corpus["steps"])
        assert report["events"]["BlockStored"] > 0 and report["events"]["BlockRemoved"] > 0
        assert report["events"]["AllBlocksCleared"] > 0


def workload(cache: Any, rng: random.Random, steps: int) -> list[list[KVEvent]]:
    """Admit, commit, free, evict and (now and then) reset: one event batch per step."""
    return event_batches(cache, rng, steps, _PROMPTS, evict_below=0.96)


_PROMPTS = Prompts(NAMESPACES, (1, 2, 3), (4, 14))


def stream(
    batches: list[list[KVEvent]], fmt: WireFormat = WireFormat.VLLM_0_33
) -> list[tuple[int, bytes]]:
    """The batches as a publisher numbers and sends them (empty batches are not sent)."""
    sent = [b for b in batches if b]
    return [(seq, encode_batch(b, ts=float(seq), wire_format=fmt)) for seq, b in enumerate(sent)]


def broken(audit: StreamAudit) -> set[str]:
    return {check for check, n in audit.counts.items() if n}


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("seed", range(3))
def test_prefixkv_streams_are_clean(fmt: WireFormat, seed: int) -> None:
    batches = workload(
        PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(seed), 300
    )
    audit = audit_batches(stream(batches, fmt), num_blocks=NUM_BLOCKS)
    assert audit.ok, audit.violations[:5]
    assert audit.events["BlockRemoved"] > 0 and audit.events["AllBlocksCleared"] > 0
    assert audit.peak_live > NUM_BLOCKS // 2  # the capacity check had something to check


def buggy(bug: str, seed: int = 0) -> list[list[KVEvent]]:
    cache = BuggyEvents(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), bug)
    return workload(cache, random.Random(seed), 300)


def test_duplicate_store_is_single_store_repeated() -> None:
    audit = audit_batches(stream(buggy("duplicate_store")), num_blocks=NUM_BLOCKS)
    assert broken(audit) == {"single-store"}
    assert {v.cause for v in audit.violations} == {"repeated"}


def test_a_declared_refcount_model_counts_stores_and_removals() -> None:
    block = BlockStored((7,), None, (1, 2), 2, "m@1", None, None, ((),))
    twice: list[list[KVEvent]] = [[block], [block], [BlockRemoved((7,))], [BlockRemoved((7,))]]
    assert audit_batches(stream(twice), refcount=True).ok
    assert broken(audit_batches(stream(twice))) == {"single-store", "known-removal"}
    thrice: list[list[KVEvent]] = [*twice, [BlockRemoved((7,))]]
    assert broken(audit_batches(stream(thrice), refcount=True)) == {"known-removal"}
    # Stores sent twice but removed once leave a reference behind: the stream then
    # outgrows the pool, so a refcount model does not hide the bug.
    audit = audit_batches(stream(buggy("duplicate_store")), refcount=True, num_blocks=NUM_BLOCKS)
    assert broken(audit) == {"capacity"}


def test_dropped_removal_is_capacity() -> None:
    # vLLM's and prefixkv's pools re-store an evicted prefix later, so the re-store of a
    # block still live in the index is also reported, as stale (its BlockRemoved was lost).
    audit = audit_batches(stream(buggy("detached_without_removed")), num_blocks=NUM_BLOCKS)
    assert "capacity" in broken(audit)
    assert broken(audit) <= {"capacity", "single-store"}
    assert {v.cause for v in audit.violations if v.check == "single-store"} <= {"stale"}
    assert audit.events.get("BlockRemoved", 0) == 0


def test_lost_clear_is_single_store_stale() -> None:
    audit = audit_batches(stream(buggy("clear_leaves_entries")))
    assert broken(audit) == {"single-store"}
    assert {v.cause for v in audit.violations} == {"stale"}
    assert audit.events.get("AllBlocksCleared", 0) == 0


def test_child_before_parent_is_parent_before_child() -> None:
    batches = workload(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(1), 300)
    # Send the first child stored in the same batch as its parent before the parent.
    for batch in batches:
        where = {
            h: i for i, e in enumerate(batch) if isinstance(e, BlockStored) for h in e.block_hashes
        }
        children = [
            (i, e) for i, e in enumerate(batch)
            if isinstance(e, BlockStored) and where.get(e.parent_block_hash, i) < i  # type: ignore[arg-type]
        ]  # fmt: skip
        if children:
            i, child = children[0]
            del batch[i]
            batch.insert(where[child.parent_block_hash], child)  # type: ignore[index]
            break
    else:
        pytest.fail("the workload stored no parent and child in one batch")
    audit = audit_batches(stream(batches))
    assert broken(audit) == {"parent-before-child"}
    assert audit.counts["parent-before-child"] == 1


def test_unknown_removal_is_known_removal() -> None:
    batches: list[list[KVEvent]] = [[AllBlocksCleared()], [BlockRemoved((12345,))]]
    audit = audit_batches(stream(batches))
    assert broken(audit) == {"known-removal"}


def test_a_clear_that_keeps_blocks_is_clear_empties() -> None:
    stored = BlockStored((7,), None, (1, 2), 2, "m@1", None, None, ((),))
    child = BlockStored((8,), 7, (3, 4), 2, "m@1", None, None, ((),))
    # The engine says it cleared, then removes a block from before the clear, and stores
    # a child under one: both were in an index that AllBlocksCleared emptied.
    batches: list[list[KVEvent]] = [
        [stored, child],
        [AllBlocksCleared()],
        [BlockRemoved((8,))],
        [child],
    ]
    audit = audit_batches(stream(batches))
    assert broken(audit) == {"clear-empties"}
    assert audit.counts["clear-empties"] == 2


def test_gap_without_replay_is_no_gap_and_suspends_block_checks() -> None:
    sent = stream(
        workload(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(2), 300)
    )
    lost = next(i for i, (_, p) in enumerate(sent) if i > 5 and b"BlockStored" in p)
    audit = audit_batches(sent[:lost] + sent[lost + 1 :], num_blocks=NUM_BLOCKS)
    assert broken(audit) == {"no-gap"}
    assert audit.counts["no-gap"] == 1
    assert audit.violations[0].message.startswith(f"batches {lost}..{lost} lost")


def test_gap_filled_by_replay_is_clean() -> None:
    sent = stream(
        workload(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(3), 120)
    )
    audit = StreamAudit(topic=b"kv")
    pub = [[b"kv", s.to_bytes(8, "big", signed=True), p] for s, p in sent]
    assert audit.on_pub(pub[0]) is None
    start = audit.on_pub(pub[3])  # batches 1 and 2 lost on the way
    assert start == 1
    audit.begin_replay()
    for s, p in sent[1:4]:  # vLLM 0.33's replay frames, then its end marker
        assert audit.on_replayed([b"", b"kv", s.to_bytes(8, "big", signed=True), p])
    assert not audit.on_replayed([b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
    audit.finish_replay(pub[3])
    for message in pub[4:]:
        assert audit.on_pub(message) is None
    assert audit.ok, audit.violations
    assert (audit.replays, audit.replayed, audit.batches) == (1, 3, len(sent))


def test_replay_that_returns_nothing_is_a_gap() -> None:
    sent = stream(
        workload(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(4), 60)
    )
    audit = StreamAudit()
    pub = [[b"kv", s.to_bytes(8, "big", signed=True), p] for s, p in sent]
    audit.on_pub(pub[0])
    assert audit.on_pub(pub[2]) == 1
    assert not audit.on_replayed([b"", (-1).to_bytes(8, "big", signed=True), b""])  # 0.20 end
    audit.finish_replay(pub[2])
    assert broken(audit) == {"no-gap"} and audit.last_seq == 2


def test_joining_a_running_stream_is_not_a_violation() -> None:
    sent = stream(
        workload(PrefixCacheManager(NUM_BLOCKS, 2, record_events=True), random.Random(5), 200)
    )
    audit = audit_batches(sent[10:])
    assert audit.ok and audit.joined_at == 10


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        b"\x93\xcb" + b"\x00" * 8 + b"\x91\x91\xa7Unknown\x00",  # an unknown tag
        b"\x92\xa2ts\x90",  # ts is text
        encode_batch([BlockRemoved((1,))])[:-3],  # truncated
        b"\x93\xcb" + b"\x00" * 8 + b"\x91\x81\xa4type\x91\xa1x\x00",  # a tag that is a list
    ],
    # NOTE: named ids, since the truncated batch carries the time it was encoded, and
    # pytest-xdist's workers must collect the same test names.
    ids=["not-msgpack", "unknown-tag", "text-timestamp", "truncated", "list-tag"],
)
def test_a_batch_that_does_not_decode_is_decodes(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_engine_batch(payload)
    audit = audit_batches([(0, payload)])
    assert broken(audit) == {"decodes"}


def test_a_bad_pool_size_is_a_typed_error() -> None:
    with pytest.raises(AuditError):
        StreamAudit(num_blocks=0)


@pytest.mark.parametrize("seed", range(2))
def test_hybrid_streams_with_checkpoint_events_are_clean(seed: int) -> None:
    cache = HybridPrefixCacheManager(
        NUM_BLOCKS, 2, max_num_seqs=4, state_budget=2, record_events=True
    )
    sent = [b for b in workload(cache, random.Random(seed), 300) if b]
    payloads = [(i, encode_batch(b, ts=float(i), checkpoints=True)) for i, b in enumerate(sent)]
    audit = audit_batches(payloads, num_blocks=NUM_BLOCKS)
    assert audit.ok, audit.violations[:5]
    # A checkpoint's removal may follow its block's: both kinds are in the stream.
    assert audit.events["CheckpointStored"] > 0 and audit.events["CheckpointRemoved"] > 0
    # The same stream with one CheckpointRemoved sent twice.
    i, b = next(
        (i, b) for i, b in enumerate(sent) if any(isinstance(e, CheckpointRemoved) for e in b)
    )
    twice = [*b, next(e for e in b if isinstance(e, CheckpointRemoved))]
    payloads[i] = (i, encode_batch(twice, ts=float(i), checkpoints=True))
    assert broken(audit_batches(payloads)) == {"known-removal"}
