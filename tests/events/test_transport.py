"""vLLM's wire format and the ZeroMQ transport, over loopback."""

from __future__ import annotations

import random
from typing import Any

import pytest

msgspec = pytest.importorskip("msgspec")
pytest.importorskip("zmq")

from event_workload import Prompts, event_batches  # noqa: E402
from prefixkv.impl import PrefixCacheManager  # noqa: E402
from prefixkv.spec import (  # noqa: E402
    BlockStored,
    EventMirror,
    EventStreamError,
    KVEvent,
    MultimodalSpan,
    Namespace,
    SpecCache,
    check_events,
)

from prefixkv.events.transport import EventPublisher, EventSubscriber, ReplayGap  # noqa: E402
from prefixkv.events.wire import (  # noqa: E402
    WireError,
    WireFormat,
    decode_batch,
    encode_batch,
)

NAMESPACES = (Namespace("m@1"), Namespace("m@1", "lora-a"), Namespace("m@1", salt=b"t-2"))


FORMATS = list(WireFormat)


def _image(rng: random.Random, tokens: list[int]) -> tuple[MultimodalSpan, ...]:
    if rng.random() < 0.3 and len(tokens) >= 6:
        return (MultimodalSpan(2, 6, "image", bytes([rng.randrange(2)]) * 4),)
    return ()


def workload(cache: Any, rng: random.Random, steps: int) -> list[list[KVEvent]]:
    """A random run; the events drained after each step, one batch per step."""
    return event_batches(
        cache, rng, steps, Prompts(NAMESPACES, (1, 2), (3, 12), _image), accepted=()
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_wire_roundtrip(fmt: WireFormat) -> None:
    """Every event survives the wire, in both formats (vLLM's own decoders: test_vllm_corpus)."""
    cache = SpecCache(16, 2, record_events=True)
    events = [e for batch in workload(cache, random.Random(1), 200) for e in batch]
    assert {type(e).__name__ for e in events} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    payload = encode_batch(events, ts=1.0, wire_format=fmt)
    assert decode_batch(payload, wire_format=fmt) == events
    other = WireFormat.VLLM_0_20 if fmt is WireFormat.VLLM_0_33 else WireFormat.VLLM_0_33
    with pytest.raises(WireError):
        decode_batch(payload, wire_format=other)  # one format is never read as the other


@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_wire_input_is_a_typed_error(fmt: WireFormat) -> None:
    cache = SpecCache(8, 2, record_events=True)
    events = [e for batch in workload(cache, random.Random(2), 30) for e in batch]
    payload = encode_batch(events, wire_format=fmt)
    first = next(e for e in events if isinstance(e, BlockStored))
    stored = encode_batch([first], wire_format=fmt)
    salted = encode_batch([first._replace(salt=b"t-9", parent_block_hash=None)], wire_format=fmt)
    for bad in (
        payload[: len(payload) // 2],  # truncated
        payload.replace(b"BlockRemoved", b"BlockRenamed"),  # unknown tag
        b"",
        stored.replace(b"m@1", b"\xff\xfe\xfd"),  # the model is not text
        salted.replace(b"t-9", b"t-8", 1),  # extra_keys say another salt than the identity
    ) + (
        # cache_salt (0.33 only) says another namespace than the prefixkv field
        (stored.replace(b"m@1", b"m@2", 1),) if fmt is WireFormat.VLLM_0_33 else ()
    ):
        with pytest.raises(WireError):
            decode_batch(bad, wire_format=fmt)
    if fmt is WireFormat.VLLM_0_33:
        # block_mm_infos (Dynamo's field) naming another image than the prefixkv field
        image = MultimodalSpan(0, 2, "image", b"\x01" * 4)
        pic = first._replace(parent_block_hash=None, extra_keys=(((0, image.key()),),))
        raw = msgspec.msgpack.decode(encode_batch([pic], wire_format=fmt))
        raw[1][0]["block_mm_infos"][0]["mm_objects"][0]["mm_hash"] += 1
        with pytest.raises(WireError, match="block_mm_infos"):
            decode_batch(msgspec.msgpack.encode(raw), wire_format=fmt)
    with pytest.raises(WireError, match="unknown wire format"):
        decode_batch(payload, wire_format="vllm-0.1")
    assert issubclass(WireError, ValueError)


def _settle(subs: list[EventSubscriber]) -> None:
    while sum(s.poll(200) for s in subs):
        pass
    for s in subs:
        s.catch_up()  # PUB/SUB may lose the tail; the replay endpoint has it


@pytest.mark.parametrize(
    ("cls", "fmt"),
    [(SpecCache, WireFormat.VLLM_0_33), (PrefixCacheManager, WireFormat.VLLM_0_20)],
)
def test_late_and_lossy_subscribers_converge(cls: type, fmt: WireFormat) -> None:
    cache = cls(24, 2, record_events=True)
    rng = random.Random(5)
    pub = EventPublisher(wire_format=fmt)
    early = EventSubscriber(pub.endpoint, pub.replay_endpoint, wire_format=fmt)
    lossy = EventSubscriber(
        pub.endpoint, pub.replay_endpoint, drop=lambda frames: rng.random() < 0.3, wire_format=fmt
    )
    garbled: list[int] = []

    def corrupt(frames: list[bytes]) -> bool:
        # Every fourth message arrives truncated: handled here, then dropped.
        if len(garbled) % 4 == 0:
            noisy.handle([frames[0], frames[1], frames[2][:-2]])
        garbled.append(1)
        return len(garbled) % 4 == 1

    noisy = EventSubscriber(pub.endpoint, pub.replay_endpoint, drop=corrupt, wire_format=fmt)
    reference = EventMirror()
    try:
        batches = workload(cache, random.Random(7), 150)
        late: EventSubscriber | None = None
        for i, batch in enumerate(batches):
            pub.publish(batch)
            reference.apply_all(batch)
            if i == 60:
                late = EventSubscriber(pub.endpoint, pub.replay_endpoint, wire_format=fmt)
            for s in (early, lossy, noisy, late):
                if s is not None:
                    s.poll(0)
        assert late is not None
        subs = [early, lossy, noisy, late]
        _settle(subs)
        snap = cache.snapshot()
        check_events(reference, snap)
        for s in subs:
            assert s.last_seq == pub.next_seq - 1
            assert s.mirror.blocks == reference.blocks
            check_events(s.mirror, snap)
        assert lossy.replays > 1 and late.replays >= 1 and noisy.malformed > 0
    finally:
        for s in (early, lossy, noisy):
            s.close()
        pub.close()


def test_out_of_order_is_skipped_and_a_lost_replay_is_loud() -> None:
    cache = SpecCache(16, 2, record_events=True)
    batches = [b for b in workload(cache, random.Random(3), 60) if b]
    pub = EventPublisher(buffer_size=4)
    sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        for batch in batches[:3]:
            pub.publish(batch)
        _settle([sub])
        before = dict(sub.mirror.blocks)
        sub.handle([b"kv-events", (1).to_bytes(8, "big"), b"garbage"])  # an old sequence
        assert sub.skipped == 1 and sub.mirror.blocks == before
        # A subscriber that missed more than the replay buffer holds cannot rebuild.
        far = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        for batch in batches[3:]:
            pub.publish(batch)
        with pytest.raises(ReplayGap):
            far.catch_up()
        assert far.stale
        with pytest.raises(ReplayGap):
            far.handle([b"kv-events", (0).to_bytes(8, "big"), b""])
        far.close()
    finally:
        sub.close()
        pub.close()


def test_a_batch_the_mirror_cannot_apply_leaves_it_unchanged() -> None:
    pub = EventPublisher()
    sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        payload = encode_batch([])
        events_bad = decode_batch(payload)
        assert events_bad == []
        from prefixkv.spec import BlockRemoved

        bad = encode_batch([BlockRemoved((42,))])
        with pytest.raises(EventStreamError):
            sub.handle([b"kv-events", (0).to_bytes(8, "big"), bad])
        assert sub.last_seq == -1 and len(sub.mirror) == 0
    finally:
        sub.close()
        pub.close()
